"""Session.run across a lost connection: retried whole, and the return says so in one line."""

from __future__ import annotations

import logging
import threading
import time

import MySQLdb
import pytest
from conftest import Relay, admin_connect, wait_until

from notifyq import errors
from notifyq.consume import handlers
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.store import inserts
from notifyq.store.db import Session


class Lines(logging.Handler):
    """The notifyq.db log, caught on the logger itself (notifyq's loggers may not propagate)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> "Lines":
        logger = logging.getLogger("notifyq.db")
        self._level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logger = logging.getLogger("notifyq.db")
        logger.removeHandler(self)
        logger.setLevel(self._level)


def test_a_transaction_whose_connection_was_killed_is_rerun_and_the_session_says_it_is_back(db):
    session = Session(db.admin, retry_s=10)
    try:
        assert session.run(lambda cur: (cur.execute("SELECT 1"), cur.fetchone()[0])[1], what="test") == 1
        # Given its connection killed by the server
        conn = admin_connect(db.admin)
        conn.cursor().execute("KILL %s", (session.connection_id,))
        conn.close()
        # When the next transaction runs
        with Lines() as log:
            value = session.run(lambda cur: (cur.execute("SELECT 2"), cur.fetchone()[0])[1], what="test")
        # Then it returns its result on a new connection, and one line says the server is back
        assert value == 2
        back = [line for line in log.lines if "reachable again" in line]
        assert len(back) == 1 and "what=test attempts=2" in back[0], back
    finally:
        session.close()


def test_a_deadlock_retried_is_not_announced_as_an_outage(db):
    session = Session(db.admin, retry_s=10)
    calls = []

    def body(cur):
        calls.append(1)
        if len(calls) == 1:
            cur.execute("SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'deadlock'")
        cur.execute("SELECT 3")
        return cur.fetchone()[0]

    try:
        with Lines() as log:
            assert session.run(body, what="test") == 3
        assert len(calls) == 2
        assert any("retrying what=test" in line for line in log.lines)
        assert not [line for line in log.lines if "reachable again" in line]
    finally:
        session.close()


def _lose_the_connection(session, cur, commit_first: bool) -> None:
    """The server kills the session's connection; commit_first: after its transaction committed."""
    if commit_first:
        cur.connection.commit()
    killer = admin_connect(session.dsn)
    killer.cursor().execute("KILL %s", (session.connection_id,))
    killer.close()


def _enqueue_once_then_lose_the_connection(session, calls: list, commit_first: bool):
    """An enqueue transaction whose first attempt loses its connection at COMMIT: killed by the
    server before the COMMIT arrives (not stored), or right after a COMMIT the body sent itself
    (stored, the reply lost): what a client sees when its writer node dies around the COMMIT."""
    def body(cur):
        calls.append(1)
        ids = inserts.insert_jobs(cur, [("q", 0, 0, 0, 3, '{"n": 1}', None, None)], max_rows=10,
                                  max_packet=session.max_allowed_packet)
        if len(calls) == 1:
            _lose_the_connection(session, cur, commit_first)
        return ids

    return body


def test_an_enqueue_whose_commit_reply_was_lost_is_run_again_only_if_it_was_not_stored(db):
    for commit_first in (False, True):
        session = Session(db.admin, retry_s=10)
        calls: list = []
        try:
            with Lines() as log:
                ids = session.run(_enqueue_once_then_lose_the_connection(session, calls, commit_first),
                                  what="enqueue", idempotent=False, committed=inserts.jobs_stored)
            # Then exactly one job is stored, the one whose id the run returns
            rows = session.run(lambda cur: (cur.execute("SELECT id FROM nq_job"), cur.fetchall())[1], what="t")
            assert [r[0] for r in rows] == ids
            # And the body ran again only when the first COMMIT had not been stored
            assert len(calls) == (1 if commit_first else 2)
            said = "was stored, not run again" if commit_first else "was not stored: running it again"
            assert any(said in line for line in log.lines), log.lines
            session.run(lambda cur: cur.execute("DELETE FROM nq_job"), what="t")
        finally:
            session.close()


def test_an_enqueue_whose_lost_transactions_id_went_to_another_put_is_run_again(db):
    """Regression (fault schedule: after a server crash, puts told "stored" whose jobs were
    gone): crash recovery may hand the ids of a transaction that was not durable to a put after
    the restart. The enqueue whose COMMIT lost its reply then asked whether its first id was
    stored, found the other put's row, and returned that id: its own job was lost."""
    session = Session(db.admin, retry_s=10)
    calls: list = []
    taken: list = []

    def committed(cur, ids, *written_by):
        # Given, between the lost reply and the question, the lost transaction's first id given to
        # a put after the restart (a restart takes seconds; a quarter of one here)
        if not taken:
            deadline = time.monotonic() + 0.25
            wait_until(lambda: time.monotonic() >= deadline, 1, message="the restart's time")
            db.query("INSERT INTO nq_job (id, queue, status, run_at, max_attempts, payload, created_at) "
                     "VALUES (%s, 'other', 0, UTC_TIMESTAMP(6), 3, '{\"other\": 1}', UTC_TIMESTAMP(6))", (ids[0],))
            taken.extend(ids)
        return inserts.jobs_stored(cur, ids, *written_by)

    try:
        # When an enqueue's first attempt loses its connection before its COMMIT was stored
        with Lines() as log:
            ids = session.run(_enqueue_once_then_lose_the_connection(session, calls, commit_first=False),
                              what="enqueue", idempotent=False, committed=committed)
        # Then it is run again (the row of its first id is the other put's), and its job is stored
        assert len(calls) == 2
        assert ids != taken
        assert db.query("SELECT queue, payload FROM nq_job WHERE id = %s", (ids[0],)) == [("q", '{"n": 1}')]
        assert any("was not stored: running it again" in line for line in log.lines), log.lines
    finally:
        session.close()

def _lose_the_ringing_commit(producer, commit_first: bool) -> list:
    """The producer's first COMMIT sent with the ring's look (commit_then_read) loses its
    connection: killed before the COMMIT arrives (not stored), or right after the transaction
    was committed (stored, the reply lost), as when the writer node dies around the COMMIT."""
    session = producer._work_session()
    real = session.pipeline.commit_then_read
    calls: list = []

    def commit_then_read(cur, read, **kw):
        calls.append(1)
        if len(calls) == 1:
            _lose_the_connection(session, cur, commit_first)
        return real(cur, read, **kw)

    session.pipeline.commit_then_read = commit_then_read
    return calls


def test_a_ringing_producer_whose_commit_reply_was_lost_enqueues_once(db):
    """Regression: a producer that rings sends its COMMIT inside the enqueue (with the ring's
    look); a lost connection there raised OutcomeUnknown, where a plain put() asks whether the
    jobs are stored and carries on. A job with a dedup key is never enqueued twice, and no job
    is silently dropped."""
    from notifyq.produce.producer import Producer

    cfg = db.config()
    for commit_first in (False, True):
        for dedup_key in (None, f"key-{commit_first}"):
            with Producer("rq", cfg, ring=True) as producer:
                producer.put({"warm-up": True})  # connects and arms the bell
                assert producer._waker.bell is not None and producer._waker.bell.held is not None
                producer._session.run(lambda cur: cur.execute("DELETE FROM nq_job"), what="t")
                # the warm-up's look saw nobody watching: the next put looks once its quiet window is over
                wait_until(producer._waker.bell.look.due, 5, message="a put that looks again")
                calls = _lose_the_ringing_commit(producer, commit_first)
                # When the put's COMMIT loses its connection
                with Lines() as log:
                    job = producer.put({"n": 1}, dedup_key=dedup_key)
                # Then the put returns the one job stored, run again only if it was not stored
                rows = producer._session.run(
                    lambda cur: (cur.execute("SELECT id FROM nq_job"), cur.fetchall())[1], what="t")
                assert [r[0] for r in rows] == [job], (commit_first, dedup_key, rows)
                assert len(calls) == (1 if commit_first else 2)
                said = "was stored, not run again" if commit_first else "was not stored: running it again"
                assert any(said in line for line in log.lines), log.lines


def _kill_connection(db, session: Session) -> None:
    killer = admin_connect(db.admin)
    killer.cursor().execute("KILL %s", (session.connection_id,))
    killer.close()


def _frozen_past_the_budget_then_lost(session: Session, db):
    """A body whose first attempt takes longer than the session's whole retry budget, then loses
    its connection: a consumer frozen (SIGSTOP, a paused VM) in the middle of a claim while the
    server restarted, resuming to a lost connection with the server up."""
    calls = []

    def body(cur):
        calls.append(1)
        if len(calls) == 1:
            cur.execute("SELECT SLEEP(1.5)")
            cur.fetchall()
            _kill_connection(db, session)
        cur.execute("SELECT 4")
        return cur.fetchone()[0]

    return body, calls


def test_a_call_frozen_past_its_budget_is_rerun_where_the_budget_counts_from_the_first_failure(db):
    # Given a session whose budget counts from a call's first failure (a consumer's claims and
    # acks: no deadline of their own), and a call that outlasted the budget before it failed
    session = Session(db.admin, retry_s=1, no_caller_deadline=True)
    body, calls = _frozen_past_the_budget_then_lost(session, db)
    try:
        # When it runs, then it is run again on a new connection and returns its result
        with Lines() as log:
            assert session.run(body, what="test") == 4
        assert len(calls) == 2
        assert any("retrying what=test attempt=1" in line for line in log.lines), log.lines
    finally:
        session.close()


def test_a_call_past_its_budget_gives_up_where_the_budget_counts_from_the_calls_start(db):
    # Given a session whose budget counts from the call's start (a console page: its own 14 s
    # deadline must hold), and a call that outlasted the budget before it failed
    session = Session(db.admin, retry_s=1)
    body, calls = _frozen_past_the_budget_then_lost(session, db)
    try:
        # When it runs, then it is not retried: the failure is the caller's at once
        with pytest.raises(errors.TransientDBError):
            session.run(body, what="test")
        assert len(calls) == 1
    finally:
        session.close()


def test_a_call_paused_past_its_budget_in_the_middle_of_its_retries_is_tried_on_a_new_connection(db):
    """A consumer frozen (SIGSTOP) for longer than the budget while it was retrying a claim (a
    KILL QUERY's 1317 first), meanwhile the server restarted: it resumed to a lost connection
    past a budget counted from that first failure, and gave up with the server up (a long fault
    run: three consumers exited 5 so)."""
    # Given a session with no caller deadline, and a call that fails once (a deadlock), then
    # takes longer than the whole budget before it loses its connection
    session = Session(db.admin, retry_s=1, no_caller_deadline=True)
    calls = []

    def body(cur):
        calls.append(1)
        if len(calls) == 1:
            raise MySQLdb.OperationalError(1213, "Deadlock found when trying to get lock")
        if len(calls) == 2:
            cur.execute("SELECT SLEEP(1.5)")
            cur.fetchall()
            _kill_connection(db, session)
        cur.execute("SELECT 4")
        return cur.fetchone()[0]

    try:
        # When it runs, then the lost connection past the budget is tried again on a new one
        assert session.run(body, what="test") == 4
        assert len(calls) == 3
    finally:
        session.close()


def test_a_lost_connection_every_time_past_the_budget_still_ends_the_retries(db):
    # Given a session with no caller deadline whose every attempt loses its connection
    session = Session(db.admin, retry_s=0.5, no_caller_deadline=True)
    calls = []

    def body(cur):
        calls.append(1)
        _kill_connection(db, session)
        cur.execute("SELECT 4")
        return cur.fetchone()[0]

    try:
        # When it runs, then it gives up after a few tries past the budget, not never
        with pytest.raises(errors.TransientDBError):
            session.run(body, what="test")
        assert len(calls) < 60
    finally:
        session.close()


def test_a_workers_claim_and_ack_sessions_count_their_budget_from_the_first_failure(db):
    # Given a consumer's worker
    cfg = db.config()
    worker = Worker(cfg, "q", handlers.PythonHandler(lambda job: None, False), stop=threading.Event(),
                    budget=Budget(None))
    try:
        # Then its work session, and the one replacing it after a timed-out handler, retry a
        # claim frozen past the budget
        assert worker.work.no_caller_deadline
        assert worker.replace_work_session().no_caller_deadline
    finally:
        worker.work.close()


class ReplyLosingProxy(Relay):
    """A TCP relay to the server that, once armed, passes on the first client query holding a
    COMMIT and then never relays the server's reply to it: it waits until `landed()` says the
    transaction is stored, and cuts both sides. What a client sees when the network (or its
    writer node's host) fails after the server committed, whatever the client put in that
    round trip: the test holds for any way of sending a put's statements."""

    def __init__(self, host: str, port: int, landed):
        self.landed = landed
        self.armed = threading.Event()
        self.cut = threading.Event()
        super().__init__(host, port)

    def pair(self) -> threading.Event:
        return threading.Event()  # set: the server's replies on this pair are dropped

    def forward(self, data: bytes, dst, mute: threading.Event, from_client: bool) -> bool:
        if not from_client:
            if mute.is_set():
                return True  # the reply that is lost
        elif self.armed.is_set() and not self.cut.is_set() and b"COMMIT" in data:
            self.cut.set()
            mute.set()
            dst.sendall(data)
            wait_until(self.landed, 10, message="the transaction stored")
            return False
        dst.sendall(data)
        return True


def test_a_put_whose_reply_was_lost_after_its_commit_landed_is_stored_once(db):
    """A put whose COMMIT went in its INSERT's round trip (tried, benchmarks/HISTORY.md) lost
    the reply that names the job's id with it: jobs_stored had nothing to ask about, and the
    put ran again (two jobs). However a put's
    statements are sent, a lost reply after the COMMIT landed must leave one job, whose id the
    put returns, the lost round trip resolved by jobs_stored ("was stored, not run again")."""
    from notifyq.produce.producer import Producer

    if db.dsn.unix_socket:
        pytest.skip("the relay speaks TCP")
    (host, port), = db.dsn.servers
    for ring in (False, True):
        db.query("DELETE FROM nq_job")
        proxy = ReplyLosingProxy(host, port, lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = 'lq'") >= 2)
        url = f"mysql://{db.dsn.user}@127.0.0.1:{proxy.port}/{db.dsn.database}"
        try:
            with Producer("lq", db.config(dsn=url), ring=ring) as producer:
                first = producer.put({"warm-up": True})  # connects (and arms the bell)
                # Given the next put's round trip that holds its COMMIT loses its reply, once stored
                proxy.armed.set()
                with Lines() as log:
                    job = producer.put({"n": 1})
                assert proxy.cut.is_set()
                # Then exactly the put's one job is stored besides the warm-up's, and the put returned its id
                rows = db.query("SELECT id FROM nq_job WHERE queue = 'lq' ORDER BY id")
                assert [r[0] for r in rows] == [first, job], (ring, rows)
                assert any("was stored, not run again" in line for line in log.lines), log.lines
        finally:
            proxy.close()
