"""`notifyq demo`: it works in a database of its own and never drops one it did not create; its
progress is readable in a pipe (no \\r) and says "-" rather than nan before the first job."""

from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import admin_connect, run_cli

from notifyq import errors
from notifyq.config import DSN
from notifyq.produce.producer import Producer
from notifyq.run import demo
from notifyq.store import schema
from notifyq.store.db import Session


def databases(root: DSN) -> set[str]:
    conn = admin_connect(root)
    try:
        cur = conn.cursor()
        cur.execute("SHOW DATABASES")
        return {row[0] for row in cur.fetchall()}
    finally:
        conn.close()


@pytest.fixture
def users_notifyq_database(server_dsn, db):
    """The default database `notifyq` of the test server, holding a user's jobs."""
    root = DSN.parse(server_dsn)
    if "notifyq" in databases(root):
        pytest.skip("the test server already has a `notifyq` database; this test must not touch it")
    user_db = dataclasses.replace(root, database="notifyq")
    schema.init(user_db)
    cfg = dataclasses.replace(db.config(), dsn=user_db)
    with Producer("emails", cfg) as producer:
        producer.put_many([{"to": f"user{i}@example.com"} for i in range(3)])
    yield user_db
    conn = admin_connect(root)
    conn.cursor().execute("DROP DATABASE IF EXISTS `notifyq`")
    conn.close()


def demo_env(db) -> dict[str, str]:
    """The test's environment without its DSN and password: the demo gets --dsn alone."""
    return {k: v for k, v in db.env.items() if k not in ("NOTIFYQ_DSN", "NOTIFYQ_PASSWORD")}


def jobs_in(dsn: DSN) -> list[tuple]:
    conn = admin_connect(dsn, dsn.database)
    try:
        cur = conn.cursor()
        cur.execute("SELECT id, queue, payload FROM nq_job ORDER BY id")
        return list(cur.fetchall())
    finally:
        conn.close()


def test_the_readmes_demo_command_leaves_the_users_notifyq_database_untouched(db, server_dsn,
                                                                               users_notifyq_database):
    # Given a server whose default database `notifyq` holds a user's queue
    root = DSN.parse(server_dsn)
    before = jobs_in(users_notifyq_database)
    assert len(before) == 3
    # When the README's demo command names that server and no database (stdout is a pipe here)
    result = run_cli(demo_env(db), "--dsn", f"mysql://root@{root.host}:{root.port}/", "demo",
                     "--duration", "2", "--producers", "1", "--consumers", "1", "--rate", "50",
                     timeout=120)
    # Then the demo ran in a database of its own, said which, and dropped it at the end
    assert result.returncode == 0, result.stderr
    created = re.search(r"demo: created database (notifyq_demo_[0-9a-f]{12}) on ", result.stdout)
    assert created, result.stdout
    assert f"demo: dropped database {created.group(1)}" in result.stdout
    assert not {d for d in databases(root) if d.startswith("notifyq_demo")}
    # And the user's database and jobs are exactly as they were
    assert jobs_in(users_notifyq_database) == before
    # And the progress is plain lines in a pipe: no carriage returns, no nan
    assert "\r" not in result.stdout and "nan" not in result.stdout
    assert re.search(r"produced +\d+ +done +\d+ .* depth +\d+", result.stdout), result.stdout


def test_the_demo_keeps_its_database_with_keep_and_says_so(db, server_dsn):
    root = DSN.parse(server_dsn)
    result = run_cli(demo_env(db), "--dsn", f"mysql://root@{root.host}:{root.port}/", "demo",
                     "--duration", "0.01", "--producers", "1", "--consumers", "1", "--keep", timeout=120)
    assert result.returncode == 0, result.stderr
    name = re.search(r"created database (notifyq_demo_[0-9a-f]{12})", result.stdout).group(1)
    try:
        assert name in databases(root)
        assert f"kept database {name}" in result.stdout
        # And the latencies read "-" while no job is done (in 0.01 s there may be none, or a
        # few finished during the drain), never nan
        assert "nan" not in result.stdout
        done = int(re.search(r"demo: (\d+) jobs done", result.stdout).group(1))
        if done == 0:
            assert "p50 - ms" in result.stdout, result.stdout
        else:
            assert re.search(r"p50 \d+\.\d ms", result.stdout), result.stdout
    finally:
        conn = admin_connect(root)
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()


def test_drop_database_refuses_every_database_the_demo_did_not_create_and_mark(db, server_dsn):
    root = DSN.parse(server_dsn)
    # A user's database (the test's own, with jobs' tables): refused by name
    with pytest.raises(errors.InputError, match="not a demo database"):
        schema.drop_database(db.admin, "0" * 32)
    # A database that merely looks like the demo's: refused, it carries no marker
    lookalike = dataclasses.replace(root, database="notifyq_demo_0123456789ab")
    conn = admin_connect(root)
    conn.cursor().execute("CREATE DATABASE IF NOT EXISTS `notifyq_demo_0123456789ab`")
    conn.close()
    try:
        with pytest.raises(errors.InputError, match="marker"):
            schema.drop_database(lookalike, "0" * 32)
        # The demo's own database, but another run's token: refused
        mine, token = schema.create_demo_database(root)
        with pytest.raises(errors.InputError, match="marker"):
            schema.drop_database(mine, "0" * 32)
        # Its own database with its own token: dropped
        schema.drop_database(mine, token)
        assert mine.database not in databases(root)
        assert {db.admin.database, lookalike.database} <= databases(root)
    finally:
        conn = admin_connect(root)
        conn.cursor().execute("DROP DATABASE IF EXISTS `notifyq_demo_0123456789ab`")
        conn.close()


def test_create_demo_database_never_reuses_an_existing_database(server_dsn, monkeypatch):
    # Given the random name the demo would pick already taken
    root = DSN.parse(server_dsn)
    conn = admin_connect(root)
    conn.cursor().execute("CREATE DATABASE IF NOT EXISTS `notifyq_demo_aaaaaaaaaaaa`")
    conn.close()
    import secrets  # the demo imports it when it names its database
    monkeypatch.setattr(secrets, "token_hex", lambda n: "a" * (2 * n))
    try:
        # Then creating the demo's database fails rather than adopt it
        with pytest.raises(errors.DatabaseError, match="cannot create the demo database"):
            schema.create_demo_database(root)
    finally:
        conn = admin_connect(root)
        conn.cursor().execute("DROP DATABASE IF EXISTS `notifyq_demo_aaaaaaaaaaaa`")
        conn.close()


def test_the_demos_depth_is_the_backlog_in_the_database_ready_and_claimed(db):
    # Given 3 ready jobs, 1 due later, 2 claimed and 1 dead on the demo's queue
    db.query("INSERT INTO nq_queue (queue) VALUES (%s)", (demo.QUEUE,))
    for status, seconds, n in ((0, -1, 3), (1, 3600, 1), (2, -1, 2), (4, -1, 1)):
        for _ in range(n):
            db.query("INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload) "
                     "VALUES (%s, %s, 0, NOW(6) + INTERVAL %s SECOND, 5, '{}')", (demo.QUEUE, status, seconds))
    session = Session(db.dsn)
    try:
        # Then the depth is 5: what is waiting or running, not produced minus done
        assert demo._backlog(session) == 5
    finally:
        session.close()


def test_the_live_line_fits_an_80_column_terminal():
    # (issue 28: it was 121 characters and garbled an 80-column terminal)
    line = demo.progress_line(3601.5, 9_999_999, 9_999_999, 99_999, 99_999, [0.0012, 0.0034, 9.99])
    assert len(line) <= 79, (len(line), line)
    assert re.search(r"produced +\d+ +done +\d+ .* depth +\d+", line)


def test_latencies_read_a_dash_until_there_is_one():
    assert demo._pct([], 50) is None
    assert demo._ms(None) == "-" and demo._ms(None, 6) == "     -"
    assert demo._ms(0.0123) == "12.3"


def test_a_demo_database_name_is_never_a_users():
    assert schema.DEMO_DATABASE.match("notifyq_demo_0123456789ab")
    assert not schema.DEMO_DATABASE.match("notifyq")
    assert not schema.DEMO_DATABASE.match("notifyq_demo")  # the old fixed name: maybe a user's by now
