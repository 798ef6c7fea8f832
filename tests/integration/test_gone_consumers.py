"""Nothing stays claimed by a consumer that is gone: a worker that fails settles its batch, a
consumer that exits holding claims keeps its registration for the reaper, and claims whose owner
has no registration and a free lock (orphans) come back at the next reaper pass, not at the end
of their lease."""

from __future__ import annotations

import threading

from conftest import wait_until

from notifyq.consume import handlers, presence as presence_mod, reaper
from notifyq.consume.outcomes import Outcomes
from notifyq.consume.presence import Presence
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer
from notifyq.store import advisory, locks, queries
from notifyq.store.db import Session

GONE = "e" * 32


def put(db, n: int) -> list[int]:
    with Producer("q", db.config()) as p:
        return p.put_many([{"n": i} for i in range(n)])


def test_a_worker_that_fails_sending_its_outcomes_still_settles_its_batch(db, monkeypatch):
    # Given three jobs in one batch, a handler that asks the worker to stop after the first (the
    # other two then wait, unstarted), and an outcome sending that fails on a fault of ours
    ids = put(db, 3)
    stop = threading.Event()
    send = Outcomes.send
    failed: list[int] = []

    def failing_send(self, session, jobs, token, carry=False):
        if jobs and not failed:  # the first outcomes sent (a stopping worker's: sent now, not carried)
            failed.append(len(jobs))
            raise RuntimeError("a fault of ours")
        return send(self, session, jobs, token)

    monkeypatch.setattr(Outcomes, "send", failing_send)

    def handler(job):
        stop.set()

    worker = Worker(db.config(defaults={"keep_done": True}), "q", handlers.PythonHandler(handler, False),
                    stop=stop, budget=Budget(None), batch_size=3, exit_when_empty=True)
    # When the worker runs the batch and fails
    worker.run()
    assert isinstance(worker.error, RuntimeError), worker.error
    # Then nothing is left claimed: the job that ran is done, the two that waited are ready
    # again with their attempt undone, and the consumer's registration is gone
    assert db.query("SELECT id, status, attempts FROM nq_job ORDER BY id") == [
        (ids[0], 3, 1), (ids[1], 0, 0), (ids[2], 0, 0)]
    assert db.scalar("SELECT COUNT(*) FROM nq_consumer") == 0


def test_a_consumer_that_exits_holding_claims_keeps_its_registration_and_the_reaper_takes_them_back(db):
    # Given a registered consumer that claimed two jobs and never settled them
    ids = put(db, 2)
    cfg = db.config()
    stop = threading.Event()
    presence = Presence(cfg, ["q"], stop)
    consumer_id = presence.ensure_registered(object())
    work = Session(cfg.dsn)
    claim = queries.claim(work, "q", consumer_id, 2, 300)
    work.close()
    assert [j.id for j in claim.jobs] == ids
    # When it exits
    presence.close()
    # Then its registration stays (its lock freed with its sessions) ...
    assert db.scalar("SELECT COUNT(*) FROM nq_consumer WHERE id = %s", (consumer_id,)) == 1
    lock_name = locks.consumer_lock(cfg.dsn.database, consumer_id)
    wait_until(lambda: db.scalar("SELECT IS_FREE_LOCK(%s)", (lock_name,)) == 1, 10, message="the lock freed")
    # ... and the next reaper pass takes its jobs back as a dead consumer's
    result = reaper.reap_once(cfg.dsn)
    assert result is not None and result.dead_consumers == 1 and result.reclaimed == 2
    assert db.query("SELECT id, status, owner FROM nq_job ORDER BY id") == [(i, 0, None) for i in ids]
    assert db.scalar("SELECT COUNT(*) FROM nq_consumer") == 0


def _orphan_claims(db, n: int, hold_lock: bool = False) -> tuple[list[int], Session | None]:
    """n jobs claimed by GONE, which has no registration (gone, or registering right now when
    hold_lock: its lock taken, its row not written yet): (ids, the session holding the lock)."""
    ids = put(db, n)
    cfg = db.config()
    work = Session(cfg.dsn)
    queries.claim(work, "q", GONE, n, 300)
    work.close()
    holder = None
    if hold_lock:
        holder = Session(cfg.dsn, autocommit=True)
        assert advisory.get_lock(holder, locks.consumer_lock(cfg.dsn.database, GONE), 0) == 1
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2 AND owner = %s", (GONE,)) == n
    return ids, holder


def test_a_reaper_takes_back_claims_whose_owner_has_no_registration_and_a_free_lock(db):
    # Given three jobs claimed by a consumer that has no row and whose lock nobody holds
    ids, _ = _orphan_claims(db, 3)
    # When a reaper pass runs
    result = reaper.reap_once(db.config().dsn)
    # Then they are ready again, not charged (taken back together), and suspects
    assert result is not None and result.reclaimed == 3
    assert db.query("SELECT id, status, owner, attempts, suspect FROM nq_job ORDER BY id") == [
        (i, 0, None, 0, 1) for i in ids]
    assert db.scalar("SELECT COUNT(*) FROM nq_attempt WHERE outcome = 'taken back'") == 3


def test_a_reaper_leaves_alone_the_claims_of_an_owner_that_holds_its_lock_without_a_row(db):
    # Given jobs claimed by a consumer whose lock is held but whose row is not there (it is
    # taking its id back right now: its lock first, then its row)
    ids, holder = _orphan_claims(db, 2, hold_lock=True)
    try:
        # When a reaper pass runs
        result = reaper.reap_once(db.config().dsn)
        # Then they stay its own
        assert result is not None and result.reclaimed == 0
        assert db.query("SELECT id, status, owner FROM nq_job ORDER BY id") == [(i, 2, GONE) for i in ids]
    finally:
        holder.close()


def test_an_idle_consumer_takes_back_and_runs_orphan_claims_long_before_their_lease_ends(db, monkeypatch):
    # Given two jobs claimed for 300 s by a consumer that is gone without a row, and a live
    # consumer of the queue that has nothing else to do
    monkeypatch.setattr(presence_mod, "ORPHAN_CHECK_S", 0.5, raising=False)
    ids, _ = _orphan_claims(db, 2)
    ran: list[int] = []
    stop = threading.Event()
    # (session_idle_s 8: a restart grace of 15 s, not 30, on a server that has just started)
    worker = Worker(db.config(defaults={"keep_done": True}, consumer={"session_idle_s": 8}), "q",
                    handlers.PythonHandler(lambda job: ran.append(job.id), False),
                    stop=stop, budget=Budget(None), batch_size=10)
    t = threading.Thread(target=worker.run)
    t.start()
    try:
        # Then it takes them back and runs them, each once (a restart grace may hold the first
        # passes back on a server that has just started: Presence.reap_pass)
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 3") == 2, 60,
                   message="the orphan claims back and done")
    finally:
        stop.set()
        t.join(30)
    assert not t.is_alive() and worker.error is None, worker.error
    assert sorted(ran) == ids


def test_an_exit_when_empty_worker_waits_for_a_gone_consumers_lease_it_cannot_judge_yet_and_runs_its_jobs(db):
    """Regression (issue 35, seed 23): a cron run (--exit-when-empty) started right after a
    server restart, found nothing claimable, and its reaper pass could judge neither the consumer
    killed before the restart (within the restart grace) nor its claim (its lease ran out 0.5 s
    later): it exited, and the dead consumer's job waited 8 s for the next run (stranded)."""
    # Given a job claimed by an owner that is gone (no registration, its lock free) with a short
    # lease, and consumers that take the server for one that restarted within the grace (a
    # session_idle_s this long makes the grace longer than the server has been up)
    [job_id] = put(db, 1)
    gone = Session(db.config().dsn, name="gone")
    try:
        assert [j.id for j in queries.claim(gone, "q", GONE, 1, 3.0).jobs] == [job_id]
    finally:
        gone.close()
    cfg = db.config(consumer={"session_idle_s": 86400})
    runs: list[int] = []
    worker = Worker(cfg, "q", handlers.PythonHandler(lambda job: runs.append(job.id), False),
                    stop=threading.Event(), budget=Budget(None), batch_size=10, exit_when_empty=True)
    # When an --exit-when-empty worker runs and finds nothing claimable
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(30)
    # Then it did not exit before the gone owner's lease ran out: it took the job back and ran it
    assert not thread.is_alive() and worker.error is None
    assert runs == [job_id]
    assert db.query("SELECT COUNT(*) FROM nq_job") == [(0,)]
