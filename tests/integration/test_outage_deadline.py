"""The sessions of one process share one connect deadline per server (store/reach.py): counted
from the first failure to reach it, so a call after another call's retry gave up makes one
attempt instead of retrying as long again, and a connect that succeeds ends the outage."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from notifyq import errors
from notifyq.config import DSN
from notifyq.store.db import Session
from notifyq.store.reach import Reach


@pytest.fixture
def gone_dsn():
    """A DSN on a port bound but not listening: connections are refused, deterministically."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield DSN.parse(f"mysql://u@127.0.0.1:{s.getsockname()[1]}/db")


def timed_connect(session: Session) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(errors.DatabaseError) as raised:
        session.connect()
    return str(raised.value), time.monotonic() - started


def test_a_second_session_after_the_first_gave_up_makes_one_attempt(gone_dsn):
    # Given a session of this process that retried an unreachable server for its 1 s and gave up
    first, took_s = timed_connect(Session(gone_dsn, retry_s=1.0, retry_setting="connect_retry_s"))
    assert took_s >= 0.9 and "retried for 1 s: connect_retry_s" in first, first
    # When another session of the process connects to the same server
    second, took_s = timed_connect(Session(gone_dsn, retry_s=1.0, retry_setting="connect_retry_s"))
    # Then it gives up at once: the outage is already older than its budget
    assert took_s < 0.5, took_s
    assert "retried for 1 s: connect_retry_s" in second, second


def test_a_budget_of_the_codes_own_does_not_name_connect_retry_s(gone_dsn):
    # Given a housekeeping session with a budget of its own (a reaper pass's, the stopper's)
    message, _ = timed_connect(Session(gone_dsn, retry_s=0.2))
    # Then its error names that budget, and no setting it does not come from
    assert "retried for 0.2 s)" in message and "connect_retry_s" not in message, message


def test_a_connect_that_succeeds_ends_the_outage(db):
    # Given an outage of this process's server recorded long ago
    reach = Reach.of(db.dsn)
    reach.failed(time.monotonic() - 100)
    # When a session connects (its one attempt is made whatever the budget left)
    session = Session(db.dsn, retry_s=1.0)
    try:
        session.conn
    finally:
        session.close()
    # Then the outage is over: the next retry counts from its own start
    now = time.monotonic()
    assert reach.since(now) == now


def test_a_transaction_answered_on_a_kept_connection_ends_the_outage(db):
    # Given a session connected, then a connect of another session of the process that failed
    # and gave up (the wake's 1 s budget, a stop), its outage never ended by a connect since
    session = Session(db.dsn, retry_s=1.0)
    try:
        session.run(lambda cur: cur.execute("SELECT 1"), what="test")
        reach = Reach.of(db.dsn)
        reach.failed(time.monotonic() - 100)
        # When a transaction is answered on the connection the session kept
        session.run(lambda cur: cur.execute("SELECT 1"), what="test")
        # Then the outage is over: a later connect (a killed connection's) retries its whole
        # budget, instead of giving up at its first failure
        now = time.monotonic()
        assert reach.since(now) == now
    finally:
        session.close()


def _killed_mid_wait(db, session: Session, wait_s: int) -> tuple[BaseException | None, int]:
    """A call on `session` that waits `wait_s` s in SLEEP (0: a plain read), its connection
    KILLed from another session meanwhile: (what the call raised, the session's generation)."""
    session.conn  # connected: its id is known
    conn_id = session.connection_id
    raised: list[BaseException] = []

    def call():
        try:
            session.run(lambda cur: cur.execute("SELECT SLEEP(5)"), what="wait", wait_s=wait_s)
        except BaseException as e:
            raised.append(e)

    t = threading.Thread(target=call)
    t.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not db.scalar(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s AND INFO LIKE 'SELECT SLEEP%%'",
            (conn_id,)):
        time.sleep(0.01)  # (a poll for a condition, with a deadline)
    db.query(f"KILL CONNECTION {int(conn_id)}")
    t.join(30)
    return (raised[0] if raised else None), session.generation


def test_a_wait_on_purpose_is_not_retried_once_the_daemon_stops(db):
    # Given a stopping daemon's session waiting on purpose (an idle wait, a lock wait)
    stop = threading.Event()
    stop.set()
    session = Session(db.dsn, autocommit=True, stop=stop, retry_s=5)
    try:
        # When its connection is lost mid-wait (the stall watch cut it: a frozen server)
        raised, generation = _killed_mid_wait(db, session, wait_s=5)
        # Then the wait ends with no new connection (one would wait 10 s on a frozen server)
        assert isinstance(raised, errors.TransientDBError), raised
        assert "ended by the stop, not retried" in str(raised)
        assert generation == 1 and session.current_conn is None
    finally:
        session.close()


def test_a_plain_call_is_still_retried_once_the_daemon_stops(db):
    # Given a stopping daemon's session making a call that is not a wait (an ack, a give-back)
    stop = threading.Event()
    stop.set()
    session = Session(db.dsn, autocommit=True, stop=stop, retry_s=5)
    try:
        # When its connection is lost mid-call
        raised, generation = _killed_mid_wait(db, session, wait_s=0)
        # Then it is run again on a new connection, as the drain's calls must be
        assert raised is None, raised
        assert generation == 2
    finally:
        session.close()
