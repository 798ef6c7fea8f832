"""Claims under lock conflicts, against a real server: a worker whose claims lose lock waits for
longer than the retry policy gives them keeps running and claims again (consume/claim_backoff.py),
and a claim's rerun waits on no peer's claimed jobs (unclaim_token: by primary key, the jobs its
earlier attempts marked). Once, a rerun read every claimed job of the table, waited on every ack
under way and deadlocked with them, lost on every retry, and its consumer exited 5."""

from __future__ import annotations

import logging
import threading

from conftest import wait_until

from notifyq.consume import handlers
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer
from notifyq.store import queries
from notifyq.store.db import Session
from notifyq.store.flow import FlowClaims, FlowLimits
from notifyq.store.sql import QUERIES

GIVE_UP_S = 1.0  # the claims' retry policy gives up after this (the work session's retry_s)


def _due_job(db, cfg, key: str) -> int:
    """One job of `key` put scheduled, waited for until it is due (a claim promotes it)."""
    with Producer("q", cfg) as p:
        [job_id] = p.put_many([{"n": 1}], key=key, delay=0.05)
    wait_until(lambda: db.scalar("SELECT run_at <= NOW(6) FROM nq_job WHERE id = %s", (job_id,)), 10,
               message="the job due")
    return job_id


def _promotions_waiting(db) -> set[int]:
    """The consumers' promotions of due jobs bumping the signal counter now (each a query of its
    own, by its id): with the counter's rows held, each waits for them until it gives up."""
    return {r[0] for r in db.query("SELECT query_id FROM information_schema.PROCESSLIST WHERE user = %s "
                                   "AND db = %s AND info LIKE 'INSERT INTO nq_signal%%'",
                                   (db.dsn.user, db.dsn.database))}


class _QuickGiveUpWorker(Worker):
    """A worker whose claims give up after GIVE_UP_S (the default retry budget is a minute)."""

    def _new_work_session(self) -> Session:
        return Session(self.config.dsn, name=f"{self.name}-work", stop=self.stop, retry_s=GIVE_UP_S)


def test_a_worker_whose_claims_lose_lock_waits_past_the_retry_policy_keeps_claiming_and_runs_the_job(db, caplog):
    # Given a limited queue's due job, and its signal counter's rows held by another
    # transaction (every claim's promotion, which bumps the counter, waits for them, and gives
    # up after the session's lock wait, 1 s), and a worker whose claims' retry policy gives up
    # after 1 s
    cfg = db.config(queue={"q": {"limit_per_key": 2}})
    job_id = _due_job(db, cfg, "a")
    holder = db.signal_rows_locked("q")
    ran = []
    stop = threading.Event()
    worker = _QuickGiveUpWorker(cfg, "q", handlers.PythonHandler(ran.append, False), stop=stop,
                                budget=Budget(None))
    worker.work.run(lambda cur: cur.execute("SET SESSION innodb_lock_wait_timeout = 1"), what="test")
    thread = threading.Thread(target=worker.run, daemon=True)
    caplog.set_level(logging.INFO, logger="notifyq.consumer")
    try:
        thread.start()
        # When the claims lose for several times the retry policy's give-up time (each claim's
        # promotion waits 1 s: four of them outlast three give-ups)
        waits: set[int] = set()

        def storm_outlived() -> bool:
            waits.update(_promotions_waiting(db))
            return not thread.is_alive() or len(waits) >= 4

        wait_until(storm_outlived, 60, message="four promotions of the worker's claims waiting")
        # Then the worker is still running, its loop turning
        assert thread.is_alive() and worker.error is None, worker.error
        # And once the lock holder is gone, its next claim takes the job and runs it
        holder.rollback()
        wait_until(lambda: ran and not db.scalar("SELECT COUNT(*) FROM nq_job WHERE id = %s", (job_id,)), 30,
                   message="the job run and acked")
    finally:
        holder.close()
        stop.set()
        thread.join(30)
    assert worker.error is None
    # And the storm was said once, and its end once, not once per claim
    said = [r.getMessage() for r in caplog.records if r.name == "notifyq.consumer"]
    assert sum("claims keep losing lock conflicts" in m for m in said) == 1, said
    assert sum("claims go through again" in m for m in said) == 1, said


def _limited_queue_and_a_peers_claim(db):
    """A limited queue with 2,000 scheduled jobs (a table big enough for its indexes) and a
    peer's committed claim of 5 keyed jobs: (config, the peer's session, its claim)."""
    cfg = db.config(queue={"q": {"limit_per_key": 2}})
    with Producer("q", cfg) as p:
        p.put_many([{"n": i} for i in range(2000)], delay=3600)
        p.put_many([{"n": i} for i in range(5)], key="p")
    peer = Session(cfg.dsn)
    peer_claim = queries.claim(peer, "q", "p" * 32, 5, 60, flow=FlowClaims(FlowLimits(limit_per_key=5)))
    peer.pipeline.read_reply()
    return cfg, peer, peer_claim


def test_a_claims_rerun_waits_on_no_peers_ack_under_way(db):
    # Given a limited queue with 2,000 scheduled jobs (a table big enough for its indexes), a
    # peer's claimed jobs one of which its ack is deleting right now (not committed yet), and a
    # due job whose promotion waits on the signal counter's rows another transaction holds: a
    # claim's first attempt loses its lock wait
    cfg, peer, peer_claim = _limited_queue_and_a_peers_claim(db)
    assert len(peer_claim.jobs) == 5
    ack = peer.conn.cursor()
    ack.execute(QUERIES["ack_delete"], {"ids": queries.Ids([peer_claim.jobs[0].id]), "token": peer_claim.token})
    assert ack.rowcount == 1
    job_id = _due_job(db, cfg, "a")
    holder = db.signal_rows_locked("q")
    claimer = Session(cfg.dsn, retry_s=4 * GIVE_UP_S)
    claimer.run(lambda cur: cur.execute("SET SESSION innodb_lock_wait_timeout = 1"), what="test")
    retries: list[str] = []

    class Retries(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            retries.append(record.getMessage())

    handler = Retries(logging.WARNING)
    logging.getLogger("notifyq.db").addHandler(handler)
    outcome: list = []

    def claim() -> None:
        try:
            outcome.append(queries.claim(claimer, "q", "c" * 32, 5, 60, flow=FlowClaims(FlowLimits(limit_per_key=2))))
        except Exception as e:  # the test's verdict below
            outcome.append(e)

    thread = threading.Thread(target=claim, daemon=True)
    try:
        thread.start()
        # When that attempt lost (the retry policy says so) and the holder let go
        wait_until(lambda: retries or outcome, 30, message="the claim's first attempt lost")
        holder.rollback()
        thread.join(30)
    finally:
        logging.getLogger("notifyq.db").removeHandler(handler)
        holder.close()
        peer.conn.rollback()
        peer.close()
        claimer.close()
    # Then its rerun claimed the due job at once: it handed back nothing of the peer's (its
    # earlier attempt marked nothing), and never waited on the peer's ack of its own job
    assert not thread.is_alive()
    [claim] = outcome
    assert not isinstance(claim, Exception), claim
    assert job_id in [j.id for j in claim.jobs]
    assert len(retries) == 1, retries


def test_a_limited_queues_claim_whose_ack_loses_lock_waits_past_the_retry_policy_acks_its_jobs_later(db):
    # Given a limited queue of 3 jobs (3 keys), a worker that claims one at a time with a retry
    # policy that gives up after 1 s, and, once its first job ran, another transaction holding
    # that job's row: the ack the next claim sends first (a limited queue's) waits for it
    cfg = db.config(queue={"q": {"limit_per_key": 2, "batch_size": 1}})
    with Producer("q", cfg) as p:
        ids = [p.put_many([{"n": i}], key=f"k{i}")[0] for i in range(3)]
    ran: list[int] = []
    first_running, first_may_end = threading.Event(), threading.Event()

    def handler(job) -> None:
        ran.append(job.payload["n"])
        if len(ran) == 1:
            first_running.set()
            first_may_end.wait(30)

    stop = threading.Event()
    worker = _QuickGiveUpWorker(cfg, "q", handlers.PythonHandler(handler, False), stop=stop, budget=Budget(None))
    worker.work.run(lambda cur: cur.execute("SET SESSION innodb_lock_wait_timeout = 1"), what="test")
    thread = threading.Thread(target=worker.run, daemon=True)
    holder = None
    try:
        thread.start()
        wait_until(first_running.is_set, 30, message="the first job running")
        holder = db.job_row_locked(ids[ran[0]])
        first_may_end.set()
        # When the acks lose their lock waits for several times the retry policy's give-up time
        waits: set[int] = set()

        def storm_outlived() -> bool:
            waits.update(r[0] for r in db.query(  # (the ack's key release or attempt records wait first)
                "SELECT query_id FROM information_schema.PROCESSLIST WHERE user = %s AND "
                "(info LIKE 'INSERT INTO nq_attempt%%' OR info LIKE 'DELETE nq_job FROM nq_job%%'"
                " OR info LIKE 'UPDATE (%%SELECT queue, job_key%%')",
                (db.dsn.user,)))
            return not thread.is_alive() or len(waits) >= 3

        wait_until(storm_outlived, 60, message="three acks of the worker waiting")
        assert thread.is_alive() and worker.error is None, worker.error
        holder.rollback()
        # Then the first job's ack lands once the holder is gone, and the other jobs run: each once
        wait_until(lambda: not db.scalar("SELECT COUNT(*) FROM nq_job"), 30, message="every job acked")
    finally:
        if holder is not None:
            holder.close()
        first_may_end.set()
        stop.set()
        thread.join(30)
    assert worker.error is None
    assert sorted(ran) == [0, 1, 2]


def test_a_claims_rerun_and_a_peers_ack_never_deadlock(db):
    # Given a limited queue with 2,000 scheduled jobs, a peer's claimed jobs one of whose rows its
    # ack holds (the ack's DELETE locks the row first, then the row's ix_state entry), and a
    # claim whose first attempt a KILL QUERY ends (the fault schedule's kill_query class): it
    # runs again on the same session
    cfg, peer, peer_claim = _limited_queue_and_a_peers_claim(db)
    acked = peer_claim.jobs[0].id
    ack = peer.conn.cursor()
    ack.execute("SELECT id FROM nq_job WHERE id = %s FOR UPDATE", (acked,))
    job_id = _due_job(db, cfg, "a")
    holder = db.signal_rows_locked("q")  # (the claim's promotion waits on them)
    claimer = Session(cfg.dsn, retry_s=4 * GIVE_UP_S)
    connection = claimer.conn.thread_id()
    outcome: list = []

    def claim() -> None:
        try:
            outcome.append(queries.claim(claimer, "q", "c" * 32, 5, 60, flow=FlowClaims(FlowLimits(limit_per_key=2))))
        except Exception as e:  # the test's verdict below
            outcome.append(e)

    def running(prefix: str) -> bool:
        return bool(db.query("SELECT 1 FROM information_schema.PROCESSLIST WHERE id = %s AND info LIKE %s",
                             (connection, prefix + "%")))

    thread = threading.Thread(target=claim, daemon=True)
    try:
        thread.start()
        wait_until(lambda: running("INSERT INTO nq_signal"), 30, message="the claim's promotion waiting")
        db.query(f"KILL QUERY {int(connection)}")
        holder.rollback()
        # When the claim's rerun is under way (done, or waiting in its hand-back) and the peer's
        # ack deletes its row
        wait_until(lambda: outcome or running("UPDATE nq_job%SET status = 0, owner = NULL"), 30,
                   message="the claim's rerun")
        ack.execute(QUERIES["ack_delete"], {"ids": queries.Ids([acked]), "token": peer_claim.token})
        assert ack.rowcount == 1
        peer.conn.commit()
        thread.join(30)
    finally:
        holder.close()
        peer.close()
        claimer.close()
    # Then neither lost a deadlock: the rerun read none of the peer's rows, and claimed the job
    assert not thread.is_alive()
    [claim] = outcome
    assert not isinstance(claim, Exception), claim
    assert job_id in [j.id for j in claim.jobs]
    assert claimer.conflicts.count == 0 and peer.conflicts.count == 0


def test_a_worker_whose_batch_outcomes_lose_lock_waits_past_the_retry_policy_keeps_running(db, caplog):
    """Regression (an attack from the docs): a consumer whose batch's outcome (an ack, a retry)
    lost lock waits on every retry exited 5, though a claim's or a flushed ack's did not."""
    # Given a worker whose retry policy gives up after 1 s, with lock waits of 1 s, and a job
    # whose handler fails it the first time while another transaction holds its row (so the
    # retry's statement waits for it until it gives up)
    cfg = db.config(queue={"q": {"lease_s": 2}}, consumer={"reap_interval_s": 0.5})
    with Producer("q", cfg) as p:
        [job_id] = p.put_many([{"n": 1}])
    holder: list = []
    ran = []

    def handle(job):
        ran.append(job.id)
        if len(ran) == 1:
            holder.append(db.job_row_locked(job.id))
            raise RuntimeError("fails while its row is held")

    stop = threading.Event()
    worker = _QuickGiveUpWorker(cfg, "q", handlers.PythonHandler(handle, False), stop=stop, budget=Budget(None))
    worker.work.run(lambda cur: cur.execute("SET SESSION innodb_lock_wait_timeout = 1"), what="test")
    thread = threading.Thread(target=worker.run, daemon=True)
    caplog.set_level(logging.WARNING, logger="notifyq.consumer")
    try:
        thread.start()
        # When its outcome loses the lock wait on every retry
        wait_until(lambda: not thread.is_alive() or any(
            "the outcomes of a batch lost lock conflicts" in r.getMessage() for r in caplog.records), 30,
            message="the batch's outcome given up")
        # Then the worker is still running
        assert thread.is_alive() and worker.error is None, worker.error
        # And once the holder is gone, the job comes back when its lease ends and runs again
        holder[0].rollback()
        wait_until(lambda: len(ran) >= 2 and not db.scalar("SELECT COUNT(*) FROM nq_job WHERE id = %s", (job_id,)),
                   30, message="the job run again and acked")
    finally:
        for conn in holder:
            conn.close()
        stop.set()
        thread.join(30)
    assert worker.error is None
