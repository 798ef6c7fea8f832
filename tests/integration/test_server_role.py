"""The writer guards (store/server_role.py) on the real server: MariaDB, which has no Group
Replication and none of the variables, is accepted at connect and reconnect; and a server whose
answer says it is no writer is refused at connect and at every reconnect, with one line. For
the refusals the server's real answer is replaced by a recorded one (no MySQL here): the
statement the connection sends is swapped for one that gives that answer."""

import pytest
from conftest import admin_connect

from notifyq import errors
from notifyq.store import db as store_db
from notifyq.store.db import Session
from notifyq.store.sql import QUERIES

SUPER_READ_ONLY = "SELECT 'super_read_only', 'ON'"  # what a replica answers (a row per variable)


def one(cur):
    cur.execute("SELECT 1")
    return cur.fetchone()


def test_mariadb_answers_none_of_the_variables_and_is_accepted(db):
    conn = admin_connect(db.admin)
    try:
        *_, variables = store_db._prepare(conn, None)
    finally:
        conn.close()
    assert variables == {}
    session = Session(db.admin)
    try:
        assert session.run(one, what="test") == (1,)
        session.discard()  # and again, on a new connection
        assert session.run(one, what="test") == (1,)
        assert session.generation == 2
    finally:
        session.close()


def test_a_server_that_is_no_writer_is_refused_at_connect(db, monkeypatch):
    monkeypatch.setitem(QUERIES, "writer_variables", SUPER_READ_ONLY)
    session = Session(db.admin, retry_s=0)
    with pytest.raises(errors.WriterRefused) as refused:
        session.connect()
    assert str(refused.value).startswith("notifyq refuses the server at ")
    assert "super_read_only is ON" in str(refused.value) and "\n" not in str(refused.value)
    assert refused.value.exit_code == errors.EXIT_SERVER
    assert session.current_conn is None  # nothing left open


def test_a_server_that_became_no_writer_is_refused_when_the_session_reconnects(db, monkeypatch):
    session = Session(db.admin, retry_s=10)  # retries the lost connection: the reconnect is refused
    try:
        session.run(one, what="test")
        first = session.connection_id
        # Given the server the session's address leads to is read-only now (a failover moved
        # the address to a replica), and the session's connection is lost
        monkeypatch.setitem(QUERIES, "writer_variables", SUPER_READ_ONLY)
        conn = admin_connect(db.admin)
        conn.cursor().execute("KILL CONNECTION %s", (first,))
        conn.close()
        # When it runs its next transaction, Then its reconnect refuses the server
        with pytest.raises(errors.WriterRefused, match="super_read_only is ON"):
            session.run(one, what="test")
    finally:
        session.close()


def test_the_refusal_is_the_commands_exit_code_7(db, monkeypatch):
    # the CLI maps it as any notifyq error: one line, exit 7 (docs: exit codes)
    from notifyq.run import cli

    monkeypatch.setitem(QUERIES, "writer_variables", SUPER_READ_ONLY)
    monkeypatch.setenv("NOTIFYQ_CONFIG", "/dev/null")
    monkeypatch.setenv("NOTIFYQ_PASSWORD", db.admin.password or "")
    url = f"mysql://{db.admin.user}@{db.admin.host}:{db.admin.port}/{db.admin.database}"
    with pytest.raises(SystemExit) as ended:
        cli.main(["--dsn", url, "status"])
    assert ended.value.code == 7

