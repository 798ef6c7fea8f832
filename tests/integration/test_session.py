"""A session pipeline's one-round-trip helpers against a real server: commit_with, send_commit and send_later."""

import MySQLdb
import pytest
from conftest import admin_connect

from notifyq.store.db import Session


@pytest.fixture
def two_rows(db):
    """A session on the test database, which holds a table t with rows (1, 0) and (2, 0)."""
    db.query("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    db.query("INSERT INTO t VALUES (1, 0), (2, 0)")
    return Session(db.admin)


def test_commit_with_commits_every_statement_and_reports_each_rowcount(db):
    db.query("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    db.query("INSERT INTO t VALUES (1, 0), (2, 0), (3, 0)")
    session = Session(db.admin)
    try:
        counts = session.run(lambda cur: session.pipeline.commit_with(cur, [
            ("UPDATE t SET v = %(v)s WHERE id <= %(n)s", {"v": 7, "n": 2}),
            ("DELETE FROM t WHERE id = %(id)s", {"id": 3}),
        ]), what="test")
        assert counts == [2, 1]
        assert db.query("SELECT id, v FROM t ORDER BY id") == [(1, 7), (2, 7)]
    finally:
        session.close()


@pytest.mark.parametrize("helper", ["commit_with", "send_commit"])
def test_a_failing_last_statement_commits_nothing_and_the_session_goes_on(db, two_rows, helper):
    session = two_rows
    send = (lambda cur, statements: session.pipeline.commit_with(cur, statements)) if helper == "commit_with" \
        else (lambda cur, statements: session.pipeline.send_commit(cur, statements, "test", wait_replies=True))
    try:
        # The second statement breaks the primary key: the server stops there, before COMMIT (and
        # send_commit waiting for the replies reads that one before it returns: the body's failure)
        with pytest.raises(MySQLdb.IntegrityError):
            session.run(lambda cur: send(cur, [
                ("UPDATE t SET v = 9 WHERE id = %(id)s", {"id": 1}),
                ("UPDATE t SET id = 1 WHERE id = %(id)s", {"id": 2}),
            ]), what="test")
        assert db.query("SELECT id, v FROM t ORDER BY id") == [(1, 0), (2, 0)]
        assert session.pipeline.failed_commits == 0  # a statement's failure is no lost COMMIT
        # and the connection is in step: the next transaction runs normally
        assert session.run(lambda cur: (cur.execute("SELECT COUNT(*) FROM t"), cur.fetchone()[0])[1],
                           what="test") == 2
    finally:
        session.close()


def test_a_statement_sent_ahead_with_the_commit_that_fails_is_the_commits_failure_and_commits_nothing(db, two_rows):
    session = two_rows
    try:
        # When a transaction's last statements go out with its COMMIT, none of them waited for,
        # and the second breaks the primary key
        pending = session.run(lambda cur: session.pipeline.send_commit(cur, [
            ("UPDATE t SET v = 9 WHERE id = %(id)s", {"id": 1}),
            ("UPDATE t SET id = 1 WHERE id = %(id)s", {"id": 2}),
        ], "test"), what="test")
        # Then the body returned before any reply, and the session's next statement reads the
        # failure into the Pending (the claim's "lost" case): nothing of it is stored
        assert not pending.settled
        assert session.run(lambda cur: (cur.execute("SELECT COUNT(*) FROM t"), cur.fetchone()[0])[1],
                           what="test") == 2
        assert pending.settled and pending.failed and session.pipeline.failed_commits == 1
        assert db.query("SELECT id, v FROM t ORDER BY id") == [(1, 0), (2, 0)]
    finally:
        session.close()


def test_commit_with_refuses_a_transaction_that_is_not_idempotent(db):
    session = Session(db.admin)
    try:
        with pytest.raises(AssertionError):
            session.run(lambda cur: session.pipeline.commit_with(cur, [("DO 1", {})]), what="test",
                        idempotent=False)
    finally:
        session.close()


def test_send_later_acts_at_once_and_its_reply_is_read_before_the_next_statement(db):
    name = f"{db.admin.database}:later"
    holder = Session(db.admin, autocommit=True)
    other = admin_connect(db.admin)
    try:
        cur = holder.cursor()
        cur.execute("SELECT GET_LOCK(%s, 0)", (name,))
        assert cur.fetchone()[0] == 1
        cur.close()
        # When the release is sent without waiting for its reply
        holder.pipeline.send_later("DO RELEASE_LOCK(%(name)s)", {"name": name})
        # Then another session is granted the lock although the holder has read nothing yet
        ocur = other.cursor()
        ocur.execute("SELECT GET_LOCK(%s, 5)", (name,))
        assert ocur.fetchone()[0] == 1
        # And the holder's next statement runs in step, on the same connection
        generation = holder.generation
        assert holder.run(lambda c: (c.execute("SELECT 41 + 1"), c.fetchone()[0])[1], what="test") == 42
        assert holder.generation == generation
    finally:
        holder.close()
        other.close()


def test_send_later_on_a_connection_killed_meanwhile_reconnects_at_the_next_statement(db):
    holder = Session(db.admin, autocommit=True)
    killer = admin_connect(db.admin)
    try:
        generation = holder.generation if holder.conn else None
        holder.pipeline.send_later("DO SLEEP(%(s)s)", {"s": 0.2})
        killer.cursor().execute(f"KILL CONNECTION {int(holder.connection_id)}")
        assert holder.run(lambda c: (c.execute("SELECT 1"), c.fetchone()[0])[1], what="test") == 1
        assert holder.generation == generation + 1
    finally:
        holder.close()
        killer.close()


def test_send_commit_leaves_every_reply_to_the_next_statement(db, two_rows):
    session = two_rows
    try:
        # When a transaction's last statements go out with its COMMIT, sent ahead
        pending = session.run(lambda cur: session.pipeline.send_commit(cur, [
            ("UPDATE t SET v = 7 WHERE id = %(id)s", {"id": 1}),
            ("UPDATE t SET v = 8 WHERE id = %(id)s", {"id": 2}),
        ], "test"), what="test")
        assert not pending.settled
        # Then the session's next statement reads the COMMIT's reply first, and runs in step
        assert session.run(lambda c: (c.execute("SELECT SUM(v) FROM t"), c.fetchone()[0])[1], what="test") == 15
        assert pending.settled and not pending.failed and session.pipeline.failed_commits == 0
        assert db.query("SELECT id, v FROM t ORDER BY id") == [(1, 7), (2, 8)]
    finally:
        session.close()


def test_closed_by_server_sees_a_kill_and_its_socket_watch_holds_no_socket_after_the_discard(db):
    # closed_by_server polls one duplicate of the connection's descriptor, kept while the
    # connection is (made per call, it cost a consumer 3-8 µs per job): it must still see the
    # server's close, and must not keep the socket open once the session lets the connection go
    import os

    from conftest import wait_until

    session = Session(db.admin)
    killer = admin_connect(db.admin)
    try:
        session.run(lambda cur: cur.execute("DO 1"), what="test")
        assert not session.closed_by_server()
        watch = session._watch
        assert watch is not None and session.closed_by_server() is False and session._watch is watch
        killer.cursor().execute(f"KILL CONNECTION {int(session.connection_id)}")
        wait_until(session.closed_by_server, timeout=10, message="the server's close seen on the socket")
        fd = watch._fd
        session.discard()
        assert watch._fd == -1 and session._watch is None
        with pytest.raises(OSError):
            os.fstat(fd)  # the duplicate is closed (nothing opened since took its number here)
        session.run(lambda cur: cur.execute("DO 1"), what="test")  # a new connection, a new watch
        assert not session.closed_by_server() and session._watch is not watch
    finally:
        killer.close()
        session.close()
