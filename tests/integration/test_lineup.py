"""Jobs of mixed duration (consume/lineup.py): a quick job claimed behind a long one is handed
back to the queue and run by an idle worker, never left waiting behind it, never run twice.
Consumers run in-process (ConsumerService on a thread) with plain Python handlers."""

from __future__ import annotations

import contextlib
import threading
import time

from conftest import admin_connect, wait_until

from notifyq.consume.service import ConsumeOptions, ConsumerService
from notifyq.jobs import Job
from notifyq.produce.producer import Producer


@contextlib.contextmanager
def running(cfg, queue: str, function, watching: bool = True, **options):
    """A ConsumerService on a thread until the block ends; yields it once every worker is
    registered and (watching) one of them watches the queue."""
    service = ConsumerService(cfg, ConsumeOptions(queues=(queue,), function=function, **options))
    stop = threading.Event()
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("rc", service.run(stop)), daemon=True)
    thread.start()
    try:
        wait_until(lambda: service.workers and all(w.consumer_id for w in service.workers)
                   and (service.presence.watch_seats[queue].waiter.watching or not watching) or outcome,
                   30, message="workers registered, one watching")
        assert "rc" not in outcome, f"service ended early: {outcome}"
        yield service
    finally:
        stop.set()
        thread.join(30)
    assert outcome.get("rc") == 0, outcome


class HeldAndQuick:
    """Jobs whose payload says "hold" wait in their handler until released; the others return
    at once. Notes each start: (job id, attempt, worker thread, monotonic time)."""

    def __init__(self):
        self.release = threading.Event()
        self.starts: list[tuple[int, int, str, float]] = []
        self.released: list[int] = []  # held jobs whose handler returned
        self.lock = threading.Lock()

    def __call__(self, job: Job) -> None:
        with self.lock:
            self.starts.append((job.id, job.attempts, threading.current_thread().name, time.monotonic()))
        if job.payload.get("hold"):
            assert self.release.wait(60), "never released"
            with self.lock:
                self.released.append(job.id)

    def started(self, ids) -> list[tuple[int, int, str, float]]:
        with self.lock:
            return [s for s in self.starts if s[0] in ids]


def test_quick_jobs_claimed_behind_a_long_one_run_on_idle_workers_while_it_runs(db):
    # Given 4 idle workers of one process, and a claim size of 100 (a batch takes all 9 jobs)
    cfg = db.config()
    handler = HeldAndQuick()
    with running(cfg, "mixed", handler, workers=4) as service:
        # When one long job and then 8 quick ones are put in one transaction (the watcher's
        # claim sees all 9, and takes them in that order)
        with Producer("mixed", cfg) as producer:
            put_at = time.monotonic()
            held, *quick = producer.put_many([{"hold": True}] + [{"n": i} for i in range(8)])
        try:
            # Then, while the long job still runs, every quick one starts on another worker, soon
            # (code before: they waited behind it in its batch, here forever)
            wait_until(lambda: len(handler.started(quick)) == 8, 15, message="the quick jobs started")
            assert not handler.release.is_set() and len(handler.started([held])) == 1
            runs = handler.started(quick)
            long_worker = handler.started([held])[0][2]
            assert all(name != long_worker for _, _, name, _ in runs)
            # soon: the hand-back is due batch_target_s (0.05 s) after the claim; a generous bound
            # for a loaded machine (the benchmark measures the delay)
            assert max(t for *_, t in runs) - put_at < 5.0
            # And each ran once, as its first attempt: the hand-back undid the claim's count
            assert sorted(i for i, *_ in runs) == sorted(quick)
            assert {attempt for _, attempt, _, _ in runs} == {1}
            assert service.presence.lineup.handed_back == 8
        finally:
            handler.release.set()
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = 'mixed'") == 0, 15,
                   message="every job done")
        # and the long job's worker counts them given back (the summary's given_back=, the metrics)
        wait_until(lambda: service.totals().given_back == 8, 15, message="the hand-back counted")
    assert len(handler.starts) == 9  # none ran twice


def test_a_worker_claims_again_only_once_what_its_batch_handed_back_is_back(db):
    # Given a long job and a high-priority job claimed behind it (claims of 2), a low-priority
    # job left ready, and one polling worker (a polling consumer counts as idle: the watch hands
    # the high one back while the long one runs)
    cfg = db.config(wakeup={"use_locks": False}, queue={"order": {"batch_target_s": 0.05}})
    handler = HeldAndQuick()
    with Producer("order", cfg) as producer:
        held = producer.put({"hold": True}, priority=9)
        high = producer.put({"n": 1}, priority=9)
        low = producer.put({"n": 2}, priority=1)
    # ... and a give-back that cannot commit yet: the queue's signal rows, which it bumps after
    # returning the job, are locked (its job row then stays locked, and claimed, until we let go)
    blocker = admin_connect(db.admin, db.admin.database)
    try:
        cur = blocker.cursor()
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")  # next-key locks: no slot inserted either
        cur.execute("BEGIN")
        cur.execute("SELECT slot FROM nq_signal WHERE queue = 'order' FOR UPDATE")
        with running(cfg, "order", handler, watching=False, workers=1, batch_size=2) as service:
            wait_until(lambda: db.scalar("SELECT COUNT(*) FROM information_schema.innodb_trx "
                                         "WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE 'INSERT INTO nq_signal%'"),
                       # innodb_trx is a cache refreshed only when not read for 0.1 s: read slower
                       15, interval=0.25, message="the give-back under way")
            assert handler.started([high, low]) == []
            # When the long job ends while the high one is still on its way back
            handler.release.set()
            wait_until(lambda: handler.started([low]) or (
                held in handler.released and getattr(service.presence.lineup, "in_flight", 0)),
                15, message="the low job claimed, or the worker waiting for what its batch gives back")
            blocker.rollback()
            wait_until(lambda: len(handler.started([high, low])) == 2, 15, message="both ran")
            # Then the worker's next claim takes the high one first (code before: the low one,
            # claimed while the high one was still claimed by its own last batch)
            order = [job_id for job_id, *_ in handler.started([high, low])]
            assert order == [high, low]
            assert service.presence.lineup.handed_back == 1
    finally:
        blocker.close()


def test_with_batch_target_s_0_a_batch_runs_in_order_and_nothing_is_handed_back(db):
    # Given the rule turned off for the queue
    cfg = db.config(queue={"plain": {"batch_target_s": 0}})
    handler = HeldAndQuick()
    with running(cfg, "plain", handler, workers=2) as service:
        with Producer("plain", cfg) as producer:
            held, *quick = producer.put_many([{"hold": True}] + [{"n": i} for i in range(3)])
        try:
            wait_until(lambda: handler.started([held]), 15, message="the long job started")
            # Then the quick jobs stay claimed behind the long one (as before the rule): the
            # claim holds all 4 while it runs, long past the target of the rule
            wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = 'plain' AND status = 2") == 4,
                       15, message="the batch holds all four")
            assert handler.started(quick) == [] and service.presence.lineup.handed_back == 0
        finally:
            handler.release.set()
        wait_until(lambda: len(handler.started(quick)) == 3, 15, message="the quick jobs ran after it")


def test_claims_of_slow_jobs_are_sized_by_their_time_and_quick_ones_stay_full(db):
    # Given one worker (nobody to hand back to) that ran 40 jobs of 30 ms, claimed at once
    cfg = db.config()
    ran: list[int] = []

    def handler(job: Job) -> None:
        if job.payload.get("slow"):
            time.sleep(0.03)  # the job's own work, not a wait for anything
        ran.append(job.id)

    with running(cfg, "sized", handler, workers=1) as service:
        with Producer("sized", cfg) as producer:
            producer.put_many([{"slow": True}] * 40)
            wait_until(lambda: len(ran) == 40, 30, message="the first slow jobs ran")
            worker = service.workers[0]
            sizer = service.presence.claim_sizers["sized"]
            assert sizer.job_s is not None and sizer.job_s >= 0.025
            assert service.presence.lineup.handed_back == 0  # no consumer idled to take them
            batches = worker.stats.batches
            # When 40 more come
            producer.put_many([{"slow": True}] * 40)
            wait_until(lambda: len(ran) == 80, 30, message="the next slow jobs ran")
            # Then they are claimed about batch_target_s (0.05 s) of work at a time: one a claim
            assert worker.stats.batches - batches >= 30
            # And quick jobs bring the claims back to full batches (the average forgets the slow ones)
            producer.put_many([{"n": i} for i in range(400)])
            wait_until(lambda: len(ran) == 480, 30, message="the quick jobs ran")
        # (full at rest: 100; a quick job's wall time on a loaded 2-core machine can reach 0.8 ms,
        # 60 a claim, still thirty times a slow job's claim)
        assert sizer.size(100, cfg.queue("sized").batch_target_s) >= 50


def test_under_a_mixed_load_every_job_runs_exactly_once_however_often_jobs_are_handed_back(db):
    # Given two consumers of 3 workers each (two presences, as two processes have), and a
    # queue where one job in 12 takes 150-250 ms and the rest 0-2 ms
    cfg = db.config()
    runs: list[int] = []
    lock = threading.Lock()

    def handler(job: Job) -> None:
        with lock:
            runs.append(job.id)
        time.sleep(job.payload["s"])  # the job's own work

    rng = __import__("random").Random(7)
    payloads = [{"s": rng.uniform(0.15, 0.25) if i % 12 == 0 else rng.uniform(0, 0.002)} for i in range(600)]
    with running(cfg, "load", handler, workers=3) as first, running(cfg, "load", handler, watching=False, workers=3) as second:
        with Producer("load", cfg) as producer:
            ids = []
            for start in range(0, len(payloads), 100):  # in bursts, so that claims take many at once
                ids += producer.put_many(payloads[start:start + 100])
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = 'load'") == 0, 60,
                   message="every job done")
        handed_back = first.presence.lineup.handed_back + second.presence.lineup.handed_back
    # Then jobs were handed back, and still each job ran once: none lost, none twice
    assert handed_back > 0
    assert sorted(runs) == sorted(ids)
