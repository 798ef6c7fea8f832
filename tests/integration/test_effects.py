"""Exactly-once effects: a handler's writes and its job's completion commit together
(job.transaction(), job.complete_in(conn)), fenced by the claim, against a real server."""

from __future__ import annotations

import threading
import time

import MySQLdb
import pytest
from conftest import RUNTIME_USER, admin_connect, wait_until

import notifyq
from notifyq.consume import handlers
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer
from notifyq.store import liveness
from notifyq.store.db import Session


@pytest.fixture
def charges(db):
    """The application's own table, next to notifyq's, writable by the runtime user."""
    db.query("CREATE TABLE charge (id INT AUTO_INCREMENT PRIMARY KEY, job_id BIGINT NOT NULL, "
             "attempt INT NOT NULL)")
    conn = admin_connect(db.admin)
    for host in ("%", "localhost"):
        conn.cursor().execute(f"GRANT SELECT, INSERT ON `{db.admin.database}`.`charge` "
                              f"TO '{RUNTIME_USER}'@'{host}'")
    conn.close()
    return lambda: db.query("SELECT job_id, attempt FROM charge ORDER BY id")


def put(db, n: int = 1, **kw) -> list[int]:
    with Producer("q", db.config()) as p:
        return p.put_many([{"n": i} for i in range(n)], **kw)


class Totals:
    def __init__(self):
        self.succeeded = self.failed = self.lost_acks = 0


def drain(db, handler, per_batch: bool = False, **config) -> Totals:
    """Workers (one after another, --exit-when-empty) until no job is pending: a retry is due
    10 ms after its failure, and a worker that found nothing waits for it. Their stats, summed."""
    cfg = db.config(defaults={"retry_base_s": 0.01, "retry_max_s": 0.01, **config})
    totals = Totals()
    deadline = time.monotonic() + 60
    while True:
        worker = Worker(cfg, "q", handlers.PythonHandler(handler, per_batch), stop=threading.Event(),
                        budget=Budget(None), batch_size=10, exit_when_empty=True)
        worker.run()
        assert worker.error is None, worker.error
        for name in ("succeeded", "failed", "lost_acks"):
            setattr(totals, name, getattr(totals, name) + getattr(worker.stats, name))
        if not db.scalar("SELECT COUNT(*) FROM nq_job WHERE status IN (0, 1, 2)"):
            return totals
        assert time.monotonic() < deadline, "jobs still pending after 60 s"
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 0 OR (status = 1 "
                                     "AND run_at <= NOW(6))"), 10, message="a retry due")


def charge(job, cur) -> None:
    cur.execute("INSERT INTO charge (job_id, attempt) VALUES (%s, %s)", (job.id, job.attempts))


def test_a_handlers_writes_and_its_jobs_completion_commit_together(db, charges):
    # Given three jobs whose handler writes one row each through job.transaction()
    ids = put(db, 3)

    def handler(job):
        with job.transaction() as cur:
            charge(job, cur)

    # When a worker runs them
    worker = drain(db, handler)

    # Then each wrote its row once, each job is done (deleted), and none was acked a second time
    assert charges() == [(i, 1) for i in ids]
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    assert worker.succeeded == 3 and worker.lost_acks == 0 and worker.failed == 0
    # And each attempt is on record, done, with its consumer and host
    rows = db.query("SELECT job_id, attempt, outcome, consumer IS NOT NULL, host <> '', started_at <= ended_at "
                    "FROM nq_attempt ORDER BY job_id")
    assert rows == [(i, 1, "done", 1, 1, 1) for i in ids]


def test_a_kept_job_completed_in_a_transaction_ends_done(db, charges):
    # Given a queue that keeps done jobs
    [job_id] = put(db)

    def handler(job):
        with job.transaction() as cur:
            charge(job, cur)

    # When its handler completes it in a transaction
    drain(db, handler, keep_done=True)
    # Then the job is kept as done, and its row is there once
    assert db.query("SELECT status FROM nq_job WHERE id = %s", (job_id,)) == [(3,)]
    assert charges() == [(job_id, 1)]


def test_a_transaction_whose_body_raises_stores_nothing_and_the_job_is_retried(db, charges):
    # Given a job whose first attempt writes its row and then raises inside the transaction
    [job_id] = put(db)

    def handler(job):
        with job.transaction() as cur:
            charge(job, cur)
            if job.attempts == 1:
                raise ValueError("card declined")

    # When a worker runs it until the queue is empty (the retry is due at once)
    worker = drain(db, handler)

    # Then only the second attempt's row exists, and the first attempt's failure is on record
    assert charges() == [(job_id, 2)]
    assert worker.succeeded == 1 and worker.failed == 1 and worker.lost_acks == 0
    assert db.query("SELECT attempt, outcome, error, traceback LIKE '%%card declined%%' FROM nq_attempt "
                    "WHERE job_id = %s ORDER BY attempt", (job_id,)) == [
        (1, "failed", "ValueError: card declined", 1), (2, "done", None, None)]


def test_a_stale_run_whose_claim_was_taken_back_raises_claim_lost_and_writes_nothing(db, charges):
    # Given a job whose claim is taken back while its first run is inside the handler (its lease
    # ran out and a reaper moved in)
    [job_id] = put(db)
    seen: list[str] = []
    reaper = Session(db.config().dsn, name="reaper")

    def handler(job):
        with pytest.raises(notifyq.ClaimLost) if job.attempts == 1 else _nothing():
            with job.transaction() as cur:
                charge(job, cur)
                if job.attempts == 1:
                    db.query("UPDATE nq_job SET lease_until = NOW(6) - INTERVAL 1 SECOND WHERE id = %s", (job_id,))
                    assert liveness.reclaim_expired(reaper) == 1
            seen.append("committed")
        if job.attempts == 1:
            seen.append("claim lost")
            raise notifyq.ClaimLost("stale")  # as a handler that lets it propagate does

    # When the worker runs it (the stale run, then the run that took it over)
    try:
        worker = drain(db, handler)
    finally:
        reaper.close()

    # Then the stale run's write was rolled back: exactly one row, from the second run
    assert seen == ["claim lost", "committed"]
    assert charges() == [(job_id, 2)]
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    # And the stale run's failure was fenced out (counted lost), the second run's completion not acked again
    assert worker.lost_acks == 1 and worker.succeeded == 1


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _commit_then_lose_reply(cur):
    """The completion's COMMIT (sent alone, after the completion query) lands, and its reply is
    lost: the connection dies right after."""
    real = cur.execute

    def execute(query, args=None):
        real(query, args)
        if query.strip().upper() != "COMMIT":
            return
        cur.connection.close()
        raise MySQLdb.OperationalError(2013, "Lost connection to server during query")

    cur.execute = execute


def _lose_connection_before_commit(db, cur):
    """The connection is killed on the server before the completion's COMMIT arrives: nothing lands."""
    real = cur.execute
    conn_id = cur.connection.thread_id()

    def execute(query, args=None):
        if query.strip().upper() == "COMMIT":
            db.query(f"KILL CONNECTION {int(conn_id)}")
        real(query, args)

    cur.execute = execute


@pytest.mark.parametrize("landed", [True, False])
def test_a_commit_whose_reply_is_lost_is_found_out_and_never_reported_as_stored_when_it_was_not(db, charges, landed):
    # Given a job whose first transaction loses its connection at the COMMIT: after the COMMIT
    # landed, or before
    [job_id] = put(db)
    results: list[str] = []

    def handler(job):
        try:
            with job.transaction() as cur:
                charge(job, cur)
                if job.attempts == 1:
                    if landed:
                        _commit_then_lose_reply(cur)
                    else:
                        _lose_connection_before_commit(db, cur)
        except notifyq.NotifyqError as e:
            results.append(type(e).__name__)
            raise
        results.append("ok")

    # When the worker runs it
    worker = drain(db, handler)

    # Then the row exists exactly once: a COMMIT that landed is reported as stored (no rerun);
    # one that did not raises, and the job runs again
    assert charges() == ([(job_id, 1)] if landed else [(job_id, 2)])
    assert results == (["ok"] if landed else ["TransientDBError", "ok"])
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    assert worker.succeeded == 1 and worker.lost_acks == 0


def _app_conn(db):
    return MySQLdb.connect(**db.config().dsn.connect_args())


def test_complete_in_completes_the_job_in_the_callers_own_transaction(db, charges):
    # Given jobs whose handler writes on its own connection and completes the job there
    ids = put(db, 2)

    def handler(job):
        conn = _app_conn(db)
        try:
            charge(job, conn.cursor())
            job.complete_in(conn)
            conn.commit()
        finally:
            conn.close()

    # When a worker runs them
    worker = drain(db, handler)
    # Then each row is there once, the jobs are done, and none was acked again
    assert charges() == [(i, 1) for i in ids]
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    assert worker.succeeded == 2 and worker.lost_acks == 0


def test_complete_in_whose_transaction_never_commits_fails_the_job_and_it_runs_again(db, charges):
    # Given a job whose first handler completes it on its connection and then rolls back
    [job_id] = put(db)

    def handler(job):
        conn = _app_conn(db)
        try:
            charge(job, conn.cursor())
            job.complete_in(conn)
            if job.attempts == 1:
                conn.rollback()
            else:
                conn.commit()
        finally:
            conn.close()

    # When the worker runs it
    worker = drain(db, handler)
    # Then the first attempt is not counted done: it failed, and the second stored the one row
    assert charges() == [(job_id, 2)]
    assert worker.failed == 1 and worker.succeeded == 1
    assert db.query("SELECT attempt, outcome FROM nq_attempt WHERE job_id = %s ORDER BY attempt", (job_id,)) == [
        (1, "failed"), (2, "done")]


def test_complete_in_after_the_claim_was_taken_back_raises_and_rolls_the_callers_writes_back(db, charges):
    # Given a job whose claim is taken back before its handler completes it on its own connection
    [job_id] = put(db)
    reaper = Session(db.config().dsn, name="reaper")
    raised: list[bool] = []

    def handler(job):
        conn = _app_conn(db)
        try:
            charge(job, conn.cursor())
            if job.attempts == 1:
                db.query("UPDATE nq_job SET lease_until = NOW(6) - INTERVAL 1 SECOND WHERE id = %s", (job_id,))
                liveness.reclaim_expired(reaper)
                try:
                    job.complete_in(conn)
                except notifyq.ClaimLost:
                    raised.append(True)
                    conn.commit()  # even a caller that commits anyway stores nothing: it was rolled back
                    raise
            job.complete_in(conn)
            conn.commit()
        finally:
            conn.close()

    try:
        drain(db, handler)
    finally:
        reaper.close()
    # Then the stale run stored nothing; the run that took over stored the one row
    assert raised == [True]
    assert charges() == [(job_id, 2)]


def test_a_snoozed_job_comes_back_later_without_spending_an_attempt(db):
    # Given a job with one attempt whose handler snoozes it twice (once by raising), then runs it
    from notifyq import errors as nq_errors

    [job_id] = put(db, max_attempts=1)
    seen: list[int] = []

    def handler(job):
        seen.append(job.attempts)
        if len(seen) == 1:
            job.snooze(0.05)
        elif len(seen) == 2:
            raise nq_errors.Snooze(0.05)

    # When workers run it until the queue is empty
    totals = drain(db, handler)
    # Then it ran three times, each as attempt 1 (a snooze spends none), and ended done
    assert seen == [1, 1, 1]
    assert totals.succeeded == 1 and totals.failed == 0
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    # And its history says so
    assert db.query("SELECT attempt, outcome FROM nq_attempt WHERE job_id = %s ORDER BY ended_at", (job_id,)) == [
        (1, "snoozed"), (1, "snoozed"), (1, "done")]


def test_a_python_handler_past_its_timeout_fails_its_job_and_the_worker_moves_on(db, charges):
    # Given two jobs on a queue with a 0.3 s timeout; the first attempt of the first hangs until
    # released, and then tries to write its effect
    first, second = put(db, 2, max_attempts=3)
    release, stray = threading.Event(), []

    def handler(job):
        if job.id == first and job.attempts == 1:
            release.wait(30)
            try:
                with job.transaction() as cur:
                    charge(job, cur)
            except notifyq.ClaimLost:
                stray.append("claim lost")
            return
        with job.transaction() as cur:
            charge(job, cur)

    # (the retry 1 s later: this worker's next claim, made at once, finds nothing due and it exits;
    # at 10 ms that claim raced the retry and at times ran it here)
    cfg = db.config(defaults={"timeout_s": 0.3, "retry_base_s": 1.0, "retry_max_s": 1.0})
    worker = Worker(cfg, "q", handlers.PythonHandler(handler, False), stop=threading.Event(),
                    budget=Budget(None), batch_size=10, exit_when_empty=True)
    # When the worker runs them
    worker.run()
    assert worker.error is None, worker.error
    # Then the first failed with "timeout" and the second ran meanwhile, on the worker's new session
    assert worker.stats.failed == 1 and worker.stats.succeeded == 1
    assert db.query("SELECT attempt, outcome, error FROM nq_attempt WHERE job_id = %s", (first,)) == [
        (1, "failed", "timeout: the handler ran longer than timeout_s (0.3 s); its thread was left running")]
    # And when the stray call goes on, its write is fenced out
    release.set()
    wait_until(lambda: stray, 10, message="the stray call's transaction refused")
    assert stray == ["claim lost"]
    # And the retry stores the one effect of the first job
    drain(db, handler, timeout_s=0.3)
    assert sorted(charges()) == sorted([(second, 1), (first, 2)])
