"""Ending an earlier connection of ours (a claim's rerun, a lost COMMIT's check, a timed-out
handler's session): killed and waited for, unless the server restarted since it was last known
open. After a restart its id names nothing of ours: the server counts ids from 1 again, and a
KILL of it killed an application's session."""

from __future__ import annotations

import time

from notifyq.consume import timeout
from notifyq.produce.producer import Producer
from notifyq.store import queries
from notifyq.store.db import Session


def _alive(db, conn_id: int) -> bool:
    return db.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s", (conn_id,)) == 1


def test_a_connection_last_seen_before_the_servers_start_is_not_killed_and_one_seen_since_is(db):
    # Given another client's live session (of the same user: a KILL may end it), and a
    # session of ours on the same server
    other = Session(db.dsn, name="app")
    session = Session(db.dsn, name="test")
    try:
        other.run(lambda cur: cur.execute("SELECT 1"), what="t")
        session.run(lambda cur: cur.execute("SELECT 1"), what="t")
        other_id = other.connection_id
        started = session._server_started_no_earlier
        # When we end "our earlier connection" of that id, last known open before this server
        # started (a restart since: the id is another's now)
        assert session.run(lambda cur: queries.end_connection(cur, other_id, session, started - 10), what="t")
        # Then nothing is killed
        assert _alive(db, other_id)
        assert other.run(lambda cur: (cur.execute("SELECT 1"), cur.fetchone())[1], what="t") == (1,)
        other_id = other.connection_id  # (the same session, unless it had to reconnect)
        # But one last known open since the server started is killed and waited for
        assert session.run(lambda cur: queries.end_connection(cur, other_id, session, time.monotonic()), what="t")
        assert not _alive(db, other_id)
    finally:
        session.close()
        other.close()


def _a_job_and_two_sessions(db) -> tuple[int, Session, Session]:
    """A job's id, an application's session and one of ours."""
    with Producer("q", db.config()) as producer:
        job_id = producer.put({"n": 1})
    return job_id, Session(db.dsn, name="app"), Session(db.dsn, name="test")


def _locking(session: Session, job_id: int) -> None:
    """An application's transaction left open holding the job's row (as a complete_in whose
    COMMIT never came holds it)."""
    def body(cur):
        cur.execute("SELECT id FROM nq_job WHERE id = %s FOR UPDATE", (job_id,))
        cur.fetchall()
    session.conn.autocommit(False)
    cur = session.conn.cursor()
    body(cur)


def test_a_timed_out_calls_caller_connection_last_answered_before_the_servers_start_is_not_killed(db):
    # Given an application's connection a timed-out call completed a job on with complete_in,
    # whose completion did not land: its transaction is open and holds the job's row
    job_id, other, session = _a_job_and_two_sessions(db)
    try:
        _locking(other, job_id)
        other_id = other.connection_id
        # When the consumer ends the call's caller connections, the connection having last
        # answered before this server started (a restart since: the id is another's now)
        timeout.end_callers(session, "q", 1, {job_id: (other_id, session.server_run - 10)})
        # Then nothing is killed
        assert _alive(db, other_id)
        # But one that answered since the server started is ended
        timeout.end_callers(session, "q", 1, {job_id: (other_id, time.monotonic())})
        assert not _alive(db, other_id)
    finally:
        session.close()
        other.close()


def test_a_timed_out_calls_caller_connection_id_is_not_killed_when_nothing_holds_its_jobs_row(db):
    # Given a timed-out call's completion on a caller's connection that did not land, and a
    # live session of another client under that connection's id, as after a server restart a
    # second after the call's last answer (the times cannot tell that restart; nothing holds
    # the job's row: the caller's transaction ended with the old server)
    job_id, other, session = _a_job_and_two_sessions(db)
    try:
        other.run(lambda cur: cur.execute("SELECT 1"), what="t")
        other_id = other.connection_id
        # When the consumer ends the call's caller connections
        timeout.end_callers(session, "q", 1, {job_id: (other_id, time.monotonic())})
        # Then the other client's session lives on
        assert _alive(db, other_id)
        assert other.run(lambda cur: (cur.execute("SELECT 1"), cur.fetchone())[1], what="t") == (1,)
        assert other.connection_id == other_id
    finally:
        session.close()
        other.close()


def test_two_readings_of_one_server_run_up_to_two_seconds_apart_are_one_run(db):
    # Given a session connected to the server: Uptime is a difference of two whole-second clock
    # readings, so two connects of one run may place its start up to two seconds apart (a second
    # over one way, a second under the other)
    session = Session(db.dsn, name="test")
    try:
        session.run(lambda cur: cur.execute("SELECT 1"), what="t")
        alive_at = time.monotonic()
        # When an earlier connection of ours read the same run 1.9 s earlier or later
        for apart in (-1.9, 1.9):
            # Then it is of this run: not "restarted", so a timed-out call's connection is ended
            # (taken for another run, it was left open with its locks)
            assert not session.restarted_after(alive_at, session.server_run + apart), apart
        # But a reading further apart than two seconds is another run
        assert session.restarted_after(alive_at, session.server_run - 2.5)
        # And a connection that answered a second after the start Uptime says is not from before it
        uptime_start = session.server_run + 1  # what Uptime alone said, the truth a second either way
        assert not session.restarted_after(uptime_start + 0.5)
    finally:
        session.close()


def test_an_id_of_ours_that_another_clients_session_has_now_is_not_killed_whatever_the_times_say(db):
    # Given a session of ours that had connection id N from one client port, and another
    # client's session that has id N now from another port (a server restart too soon after our
    # connection's last answer for the times to tell: the ids started again from 1)
    other = Session(db.dsn, name="app")
    session = Session(db.dsn, name="test")
    try:
        other.run(lambda cur: cur.execute("SELECT 1"), what="t")
        session.run(lambda cur: cur.execute("SELECT 1"), what="t")
        other_id = other.connection_id
        theirs = other.port_of(other_id)
        assert theirs is not None  # (TCP: the test server listens on 127.0.0.1)
        session._ports[other_id] = theirs + 1 if theirs < 65535 else theirs - 1
        # When we end "our earlier connection" of that id, last known open just now, on this run
        assert session.run(lambda cur: queries.end_connection(cur, other_id, session, time.monotonic(),
                                                              session.server_run), what="t")
        # Then nothing is killed: the session of that id is not from our connection's port
        assert _alive(db, other_id)
        assert other.run(lambda cur: (cur.execute("SELECT 1"), cur.fetchone())[1], what="t") == (1,)
        assert other.connection_id == other_id
        # But when the port is the one our connection had, it is ours: ended and waited for
        session._ports[other_id] = theirs
        assert session.run(lambda cur: queries.end_connection(cur, other_id, session, time.monotonic(),
                                                              session.server_run), what="t")
        assert not _alive(db, other_id)
    finally:
        session.close()
        other.close()
