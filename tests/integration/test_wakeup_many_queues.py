"""One consumer process of many idle queues, their watchers woken at once: each wake a KILL QUERY
of a watcher's wait (wakeup/waker.py). On MariaDB, a KILL of a SLEEP() now and then took the
server 2 s while other sessions slept too, and held every SLEEP() on the server as long: a batch
of jobs started 2 s late. The watchers wait in GET_LOCK instead (wakeup/nap.py)."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import wait_until

import notifyq
from notifyq.consume.service import ConsumeOptions, ConsumerService
from notifyq.produce.producer import Producer

QUEUES = 16
ROUNDS = 100
LATE_S = 1.5  # a pick-up is tens of milliseconds: only the server's 2 s comes near it


def _watching(worker) -> bool:
    waiting = worker.waiter.session.waiting
    return waiting is not None and waiting.what == "watch"


def test_jobs_put_at_once_on_many_idle_queues_of_one_process_all_start_at_once(db):
    # Given one consumer process of 12 queues, idle, whose poll would come only after 20 s
    cfg = db.config(wakeup={"poll_initial_s": 20.0, "poll_max_s": 30.0, "idle_wait_s": 25.0})
    queues = tuple(f"q{i}" for i in range(QUEUES))
    started: dict[int, float] = {}
    stop = threading.Event()
    service = ConsumerService(cfg, ConsumeOptions(queues=queues, function=lambda job: started.setdefault(
        job.id, time.monotonic()), workers=1))
    runner = threading.Thread(target=service.run, args=(stop,), daemon=True)
    runner.start()
    late: list[tuple[int, float]] = []
    try:
        wait_until(lambda: len(service.workers) == QUEUES, 30, message="the workers started")
        with Producer(queues[0], cfg) as producer:
            for round_ in range(ROUNDS):
                wait_until(lambda: all(_watching(w) for w in service.workers), 30,
                           message="every queue's watcher waiting")
                # When one job goes to each queue at once (every other queue's watcher woken
                # by an instant wake, one after another)
                wf = notifyq.Workflow()
                for queue in queues:
                    wf.add(queue, {"round": round_})
                put_at = time.monotonic()
                ids = producer.put_workflow(wf)
                wait_until(lambda: all(i in started for i in ids), 60, message="the round's jobs started")
                late += [(round_, started[i] - put_at) for i in ids if started[i] - put_at > LATE_S]
    finally:
        stop.set()
        runner.join(60)
    # Then every job of every round started at once, none seconds late
    assert not late, f"jobs started late (round, seconds): {late}"


def _watcher_state(db, worker) -> str | None:
    conn_id = worker.waiter.session.connection_id
    return db.scalar("SELECT STATE FROM information_schema.PROCESSLIST WHERE ID = %s", (conn_id,))


def test_an_idle_watcher_on_mariadb_waits_in_get_lock_and_sleeps_while_its_work_session_lost_the_lock(db):
    # Given an idle worker whose poll would come only after 20 s, on MariaDB
    cfg = db.config(wakeup={"poll_initial_s": 20.0, "poll_max_s": 30.0, "idle_wait_s": 25.0})
    started: list[float] = []
    stop = threading.Event()
    service = ConsumerService(cfg, ConsumeOptions(queues=("q",), function=lambda job: started.append(
        time.monotonic()), workers=1))
    runner = threading.Thread(target=service.run, args=(stop,), daemon=True)
    runner.start()
    try:
        wait_until(lambda: service.workers and service.workers[0].waiter.watching, 30, message="watching")
        worker = service.workers[0]
        if "mariadb" not in worker.work.server_version.lower():
            pytest.skip("MySQL keeps SLEEP (wakeup/nap.py)")
        # Then its wait is in GET_LOCK, on its work session's nap lock, not in SLEEP
        wait_until(lambda: _watcher_state(db, worker) == "User lock", 30, message="the watcher in GET_LOCK")
        assert db.scalar("SELECT IS_USED_LOCK(%s)", (worker.nap.name,)) == worker.work.connection_id
        # When the work session's connection ends (the nap lock with it)
        db.query(f"KILL CONNECTION {worker.work.connection_id}")
        # Then the watcher sleeps instead, and a put still wakes it at once
        wait_until(lambda: _watcher_state(db, worker) == "User sleep", 30, message="the watcher in SLEEP")
        with Producer("q", cfg) as producer:
            put_at = time.monotonic()
            producer.put({"n": 1})
            wait_until(lambda: started, 30, message="the job started")
        assert started[0] - put_at < LATE_S
        # And once its work session reconnected (the claim), the next wait is in GET_LOCK again
        wait_until(lambda: _watcher_state(db, worker) == "User lock", 30, message="the watcher in GET_LOCK again")
    finally:
        stop.set()
        runner.join(60)
