"""Features against a real server: delayed jobs, unique jobs, pause/resume, batch handlers and
cooperative cancel. Consumers run in-process (ConsumerService on a thread) with plain Python
functions as handlers, so each test can see exactly what ran and when. (The claim's order by
priority and run_at, and scheduled jobs' invisibility until due: test_claim.py.)"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time

import pytest
from conftest import wait_until

from notifyq import errors, figures
from notifyq.consume.service import ConsumeOptions, ConsumerService
from notifyq.jobs import Job, run_of
from notifyq.ops import admin
from notifyq.produce.producer import Producer
from notifyq.store import queries
from notifyq.store.db import Session


@contextlib.contextmanager
def running(cfg, queue: str, function, **options):
    """A ConsumerService on a thread until the block ends; yields it once every worker is up."""
    service = ConsumerService(cfg, ConsumeOptions(queues=(queue,), function=function, **options))
    stop = threading.Event()
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("rc", service.run(stop)), daemon=True)
    thread.start()
    try:
        wait_until(lambda: service.workers and all(w.consumer_id for w in service.workers) or outcome,
                   30, message="workers registered")
        assert "rc" not in outcome, f"service ended early: {outcome}"
        yield service
    finally:
        stop.set()
        thread.join(30)
    assert outcome.get("rc") == 0, outcome


def stays(predicate, seconds: float, interval: float = 0.05) -> bool:
    """True if `predicate` holds at every check for `seconds` (asserting that nothing happens)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(interval)
    return True


class Recorder:
    """A handler that notes (job id, payload, monotonic time) for every job it runs."""

    def __init__(self):
        self.seen: list[tuple[int, object, float]] = []
        self.lock = threading.Lock()

    def __call__(self, job: Job) -> None:
        with self.lock:
            self.seen.append((job.id, job.payload, time.monotonic()))

    def ids(self) -> list[int]:
        with self.lock:
            return [s[0] for s in self.seen]


# ------------------------------------------------------------------ 1. delayed and scheduled jobs

def test_a_delayed_job_runs_no_earlier_than_its_delay_and_soon_after(db):
    # Given a consumer waiting on an empty queue
    cfg = db.config()
    rec = Recorder()
    with running(cfg, "later", rec), Producer("later", cfg) as producer:
        # When a job is put with a 1 s delay
        before = time.monotonic()
        job_id = producer.put({"n": 1}, delay=1.0)
        assert db.scalar("SELECT status FROM nq_job WHERE id = %s", (job_id,)) == 1  # scheduled
        # Then it runs once its time has come (the watcher's due deadline wakes it), not before
        wait_until(lambda: rec.ids() == [job_id], 15, message="delayed job handled")
    waited = rec.seen[0][2] - before
    assert 0.95 <= waited < 6.0, waited


def test_run_at_must_be_aware_and_is_stored_as_utc(db):
    cfg = db.config()
    with Producer("at", cfg) as producer:
        # Given an aware time an hour ahead in another zone
        when = dt.datetime.now(dt.timezone(dt.timedelta(hours=5))) + dt.timedelta(hours=1)
        job_id = producer.put({"n": 1}, run_at=when)
        # Then it is stored scheduled, at that instant in UTC (within the call's own duration)
        run_at = db.scalar("SELECT run_at FROM nq_job WHERE id = %s", (job_id,))
        expected = when.astimezone(dt.timezone.utc).replace(tzinfo=None)
        assert abs((run_at - expected).total_seconds()) < 2
        # And a naive time is refused: it would silently depend on the host's zone
        with pytest.raises(errors.InputError):
            producer.put({"n": 2}, run_at=dt.datetime.now())


# ------------------------------------------------------------------ 3. unique jobs

def test_concurrent_puts_with_one_dedup_key_store_one_job_and_all_get_its_id(db):
    # Given 8 producers on 8 threads, released at once for each of 5 keys
    cfg = db.config()
    producers = [Producer("uniq", cfg) for _ in range(8)]
    results: dict[str, list[int]] = {f"key-{k}": [] for k in range(5)}
    lock = threading.Lock()

    def worker(producer: Producer, barrier: threading.Barrier) -> None:
        for key in results:
            barrier.wait(10)
            job_id = producer.put({"key": key}, dedup_key=key)
            with lock:
                results[key].append(job_id)

    barrier = threading.Barrier(len(producers))
    threads = [threading.Thread(target=worker, args=(p, barrier)) for p in producers]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for p in producers:
            p.close()
    # Then each key was inserted once and every put returned that one id
    for key, ids in results.items():
        assert len(ids) == 8 and len(set(ids)) == 1, (key, ids)
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 5


def test_concurrent_produce_processes_with_one_dedup_key_print_one_id(db):
    import subprocess

    from conftest import notifyq_cmd

    # Given 4 `notifyq produce --dedup-key` processes started together
    procs = [subprocess.Popen(notifyq_cmd("produce", "-q", "uniq", "--dedup-key", "daily-report", '{"n": 1}'),
                              env=db.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outputs = [p.communicate(timeout=60) for p in procs]
    # Then all print the same id and one row exists
    assert [p.returncode for p in procs] == [0] * 4, outputs
    assert len({out.strip() for out, _ in outputs}) == 1, outputs
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 1


def test_a_dedup_key_is_free_again_once_its_job_finished(db):
    cfg = db.config()
    with Producer("uniq", cfg) as p:
        first = p.put({"n": 1}, dedup_key="k")
        assert p.put({"n": 2}, dedup_key="k") == first  # pending: the same job
        session = Session(cfg.dsn)
        try:
            claim = queries.claim(session, "uniq", "o" * 32, 1, 60)
            assert p.put({"n": 3}, dedup_key="k") == first  # claimed (running) still counts
            queries.ack(session, [first], claim.token, keep=True)  # kept as done
        finally:
            session.close()
        second = p.put({"n": 4}, dedup_key="k")
    assert second != first
    assert db.query("SELECT id, status FROM nq_job ORDER BY id") == [(first, 3), (second, 0)]


# ------------------------------------------------------------------ 5. pause and resume

def test_pause_stops_claims_within_a_second_and_resume_wakes_the_consumer(db):
    # Given a consumer draining a steady trickle of jobs
    cfg = db.config()
    rec = Recorder()
    stop_feed = threading.Event()

    def feed() -> None:
        with Producer("pausable", cfg) as p:
            while not stop_feed.wait(0.02):
                p.put({"t": time.monotonic()})

    admin_session = Session(cfg.dsn)
    feeder = threading.Thread(target=feed, daemon=True)
    try:
        with running(cfg, "pausable", rec) as service:
            feeder.start()
            wait_until(lambda: len(rec.ids()) >= 10, 15, message="trickle flowing")
            # When the queue is paused
            queries.set_paused(admin_session, "pausable", True)
            paused_at = time.monotonic()
            # Then nothing is handled from one second on, though jobs keep arriving
            wait_until(lambda: time.monotonic() - paused_at >= 1.0, 5, message="one second")
            handled = len(rec.ids())
            wakeups = sum(sum(w.waiter.wakeups.values()) for w in service.workers)
            assert stays(lambda: len(rec.ids()) == handled, 1.5)
            assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 0") > 0
            assert max(t for _, _, t in rec.seen) < paused_at + 1.0
            # And the consumer went back to waiting: no wake-ups while paused
            assert sum(sum(w.waiter.wakeups.values()) for w in service.workers) == wakeups
            # When it is resumed, the backlog is picked up at once
            stop_feed.set()
            feeder.join(10)
            resumed_at = time.monotonic()
            queries.set_paused(admin_session, "pausable", False)
            wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0, 20, message="backlog drained")
            first_after = min(t for _, _, t in rec.seen if t > resumed_at)
            assert first_after - resumed_at < 3.0
    finally:
        stop_feed.set()
        admin_session.close()


# ------------------------------------------------------------------ 8. batch handlers

def test_a_batch_handler_gets_the_whole_claim_and_settles_each_job_on_its_own(db):
    # Given 10 ready jobs: one asks to fail for good, one to fail once and then succeed
    cfg = db.config(defaults={"retry_base_s": 0.1, "retry_max_s": 0.2})
    with Producer("batch", cfg) as p:
        ids = p.put_many([{"n": i, "fail": i == 3, "flaky": i == 7} for i in range(10)])
    batches: list[list[int]] = []

    def handler(jobs: list[Job]) -> None:
        batches.append([j.id for j in jobs])
        for job in jobs:
            if job.payload["fail"]:
                job.fail("asked to fail", retry=False)
            elif job.payload["flaky"] and job.attempts == 1:
                job.fail("flaky")

    # When a per-batch consumer with batch size 10 runs
    with running(cfg, "batch", handler, per_batch=True, batch_size=10):
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE status != 4") == 0, 20,
                   message="all settled")
    # Then the first call got all 10 jobs, the flaky one came back alone, and only the job
    # failed for good is left, dead, with its error
    assert batches[0] == ids
    assert batches[1:] == [[ids[7]]]
    assert db.query("SELECT id, status, last_error FROM nq_job") == [(ids[3], 4, "asked to fail")]


def test_a_reloads_retry_backoff_applies_to_the_next_failure(db):
    """Regression: a reload reached the workers' claims but not their outcomes: failures kept
    the retry backoff the consumer started with, though a reload applies it live."""
    # Given a consumer started with a one-hour retry backoff, whose handler always fails
    cfg = db.config(defaults={"retry_base_s": 3600, "retry_max_s": 3600})
    runs: list[int] = []

    def handler(job: Job) -> None:
        runs.append(job.id)
        raise RuntimeError("boom")

    with running(cfg, "backoff", handler) as service:
        # When a reload lowers the backoff to 10 ms and then a job fails
        service.reload(db.config(defaults={"retry_base_s": 0.01, "retry_max_s": 0.01}))
        with Producer("backoff", cfg) as p:
            job = p.put({"n": 1})
        # Then it is retried within the new backoff, not an hour later
        wait_until(lambda: len(runs) >= 2, 20, message="the job retried")
    assert runs[:2] == [job, job]


def test_resume_wakes_an_idle_consumer_at_once_not_at_its_next_poll(db):
    """Issue #22: `notifyq resume` only bumped the signal count, which the watcher reads at its
    next poll (up to poll_max_s later); now it also interrupts the watcher's wait, as a put does."""
    # Given a consumer whose every wait is 10 s long, and a job put on its paused queue
    cfg = db.config(wakeup={"poll_initial_s": 10.0, "poll_max_s": 10.0})
    rec = Recorder()
    session = Session(cfg.dsn, name="test-admin")
    try:
        with running(cfg, "resumable", rec), Producer("resumable", cfg) as producer:
            admin.set_paused(session, "resumable", True)
            producer.put({"n": 1})
            assert stays(lambda: not rec.ids(), 0.5)  # paused: the watcher is back in its wait
            # When the queue is resumed
            resumed_at = time.monotonic()
            admin.set_paused(session, "resumable", False)
            # Then the job starts at once, not when the 10 s wait ends
            wait_until(lambda: rec.ids(), 15, message="the job ran")
            assert rec.seen[0][2] - resumed_at < 2.0
    finally:
        session.close()


# ------------------------------------------------------------------ 6. cooperative cancel

def test_cancel_of_a_running_job_is_seen_by_its_handler_within_about_a_second(db):
    # Given a handler that works until asked to stop
    cfg = db.config()
    started = threading.Event()
    stopped: dict[str, float] = {}

    def handler(job: Job) -> None:
        started.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if job.cancel_requested():
                stopped["at"] = time.monotonic()
                job.fail("cancelled", retry=False)
                return
            time.sleep(0.01)

    with running(cfg, "cancel", handler), Producer("cancel", cfg) as p:
        job_id = p.put({"n": 1})
        assert started.wait(15)
        session = Session(cfg.dsn)
        try:
            # When the job is cancelled while it runs
            asked = time.monotonic()
            assert admin.cancel(session, job_id) == "requested"
            # Then the handler sees it on its next (throttled) check and stops; the job ends cancelled
            wait_until(lambda: db.scalar("SELECT status FROM nq_job WHERE id = %s", (job_id,)) == 5,
                       15, message="cancelled job cancelled")
        finally:
            session.close()
    assert stopped["at"] - asked < 3.0
    assert db.scalar("SELECT last_error FROM nq_job WHERE id = %s", (job_id,)) == "cancelled"


def test_cancel_deletes_a_pending_job_and_refuses_a_finished_or_missing_one(db):
    cfg = db.config()
    with Producer("cancel", cfg) as p:
        pending = p.put({"n": 1}, delay=3600, dedup_key="k")
        dead = p.put({"n": 2})
    db.query("UPDATE nq_job SET status = 4, finished_at = NOW(6) WHERE id = %s", (dead,))
    session = Session(cfg.dsn)
    try:
        assert admin.cancel(session, pending) == "deleted"
        with pytest.raises(errors.InputError, match="is dead"):
            admin.cancel(session, dead)
        with pytest.raises(errors.InputError, match="no job"):
            admin.cancel(session, 999999)
    finally:
        session.close()
    # And the deleted job's dedup key is free again
    with Producer("cancel", cfg) as p:
        assert p.put({"n": 3}, dedup_key="k") not in (pending, dead)


def test_cancel_requested_asks_the_database_at_most_once_per_interval():
    calls = []
    job = Job(id=1, queue="q", payload={}, priority=0, attempts=1, max_attempts=1,
              run_at=dt.datetime.now(), created_at=dt.datetime.now())

    class Completion:  # the worker's, as far as a cancel check asks it
        def cancel_requested(self, job_id: int) -> bool:
            calls.append(job_id)
            return len(calls) >= 2

    run_of(job).hand(None, Completion())
    assert not any(job.cancel_requested() for _ in range(1000))
    assert len(calls) == 1
    assert job.cancel_requested(max_age_s=0.0) and job.cancel_requested(max_age_s=0.0)
    assert len(calls) == 2  # a yes is final: never asked again


def test_worker_histograms_stay_bounded():
    h = figures.handler_seconds_histogram()
    for i in range(100_000):
        h.observe((i % 1000) / 100)
    assert len(h.counts) == len(figures.HANDLER_SECONDS_BUCKETS) + 1
    assert h.count == 100_000
    buckets = dict(h.buckets())
    assert buckets["+Inf"] == 100_000 and buckets["0.001"] == 100  # the zeros, le semantics
    assert buckets["1.0"] == 101 * 100  # 0.00 .. 1.00 inclusive


def test_a_cancelled_job_whose_handler_raises_ends_cancelled_with_its_error(db):
    """The README said such a job is retried like any failure; the failure's statement ends it
    cancelled (issue 29: a state of its own, not dead), as the operator asked, its error kept."""
    cfg = db.config()
    started = threading.Event()

    def handler(job: Job) -> None:
        started.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not job.cancel_requested():
            time.sleep(0.01)
        raise RuntimeError("stopped on request")

    with running(cfg, "cancel", handler), Producer("cancel", cfg) as p:
        job_id = p.put({"n": 1})
        assert started.wait(15)
        session = Session(cfg.dsn)
        try:
            assert admin.cancel(session, job_id) == "requested"
            wait_until(lambda: db.scalar("SELECT status FROM nq_job WHERE id = %s", (job_id,)) == 5,
                       15, message="the cancelled job cancelled")
        finally:
            session.close()
    assert "stopped on request" in db.scalar("SELECT last_error FROM nq_job WHERE id = %s", (job_id,))
