"""The writer guards (store/server_role.py) on the real server: MariaDB, which has no Group
Replication and none of the variables, is asked nothing more and is accepted at connect and
reconnect. Asked as MySQL is (this MariaDB answers the SHOW too, with nothing), a server whose
answer says it is no writer is refused at connect and at every reconnect, with one line: for
those the server's real answer is replaced by a recorded one (no MySQL here), by swapping the
statement the connection sends for one that gives that answer."""

import pytest
from conftest import admin_connect

from notifyq import errors
from notifyq.store import db as store_db
from notifyq.store import server_role
from notifyq.store.db import Session
from notifyq.store.sql import QUERIES

SUPER_READ_ONLY = "SELECT 'super_read_only', 'ON'"  # what a replica answers (a row per variable)


def one(cur):
    cur.execute("SELECT 1")
    return cur.fetchone()


def show_variables_sent(conn) -> int:
    cur = conn.cursor()
    cur.execute("SHOW SESSION STATUS LIKE 'Com_show_variables'")
    return int(cur.fetchone()[1])


def test_mariadb_is_asked_nothing_more_and_is_accepted_at_connect_and_reconnect(db):
    # MariaDB has none of the variables, which its handshake says: no SHOW is sent
    conn = admin_connect(db.admin)
    try:
        *_, variables = store_db._prepare(conn, None)
        assert variables == {} and show_variables_sent(conn) == 0
    finally:
        conn.close()
    session = Session(db.admin)
    try:
        assert session.run(one, what="test") == (1,)
        session.discard()  # and again, on a new connection
        assert session.run(one, what="test") == (1,)
        assert session.generation == 2
    finally:
        session.close()


@pytest.fixture
def as_mysql(monkeypatch):
    """The session asks the server as it asks MySQL (this MariaDB answers the SHOW too: nothing)."""
    monkeypatch.setattr(server_role, "has_writer_variables", lambda server_info: True)


def test_asked_as_mysql_is_asked_within_the_same_round_trip_and_accepted(db, as_mysql):
    conn = admin_connect(db.admin)
    try:
        *_, variables = store_db._prepare(conn, None)
        assert variables == {} and show_variables_sent(conn) == 1
    finally:
        conn.close()
    session = Session(db.admin)
    try:
        assert session.run(one, what="test") == (1,)
    finally:
        session.close()


def test_a_server_that_is_no_writer_is_refused_at_connect(db, monkeypatch, as_mysql):
    monkeypatch.setitem(QUERIES, "writer_variables", SUPER_READ_ONLY)
    session = Session(db.admin, retry_s=0)
    with pytest.raises(errors.WriterRefused) as refused:
        session.connect()
    assert str(refused.value).startswith("notifyq refuses the server at ")
    assert "super_read_only is ON" in str(refused.value) and "\n" not in str(refused.value)
    assert refused.value.exit_code == errors.EXIT_SERVER
    assert session.current_conn is None  # nothing left open


def test_a_server_that_became_no_writer_is_refused_when_the_session_reconnects(db, monkeypatch, as_mysql):
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


def test_the_refusal_is_the_commands_exit_code_7(db, monkeypatch, as_mysql):
    # the CLI maps it as any notifyq error: one line, exit 7 (docs: exit codes)
    from notifyq.run import cli

    monkeypatch.setitem(QUERIES, "writer_variables", SUPER_READ_ONLY)
    monkeypatch.setenv("NOTIFYQ_CONFIG", "/dev/null")
    monkeypatch.setenv("NOTIFYQ_PASSWORD", db.admin.password or "")
    url = f"mysql://{db.admin.user}@{db.admin.host}:{db.admin.port}/{db.admin.database}"
    with pytest.raises(SystemExit) as ended:
        cli.main(["--dsn", url, "status"])
    assert ended.value.code == 7

