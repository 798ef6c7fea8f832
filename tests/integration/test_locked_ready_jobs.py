"""An idle worker whose claims come back empty because another session holds the rows of the
ready jobs (an application's SELECT ... FOR UPDATE, a stuck transaction), against a real server:
it claims again after bounded, growing waits, neither at once (a spin of empty claims) nor only
at the watcher's safety claim (SAFETY_S, a minute), and a put meanwhile still wakes it at once.
Once, its empty claim recorded the count as watched (SKIP LOCKED skipped the rows, as a peer's
claim would have taken them) and the job waited, unlocked, for the safety claim."""

from __future__ import annotations

import threading

import pytest
from conftest import wait_until

from notifyq.consume import handlers
from notifyq.consume.presence import Presence
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer

WINDOW_S = 2.0  # the window the worker's claims are counted over while the row is held
MOST_CLAIMS = 30  # ... and their bound: waits from 5 ms doubling up to 0.2 s make about 15
PICKUP_S = 10.0  # once the row is let go, the job runs within this (the waits' cap is 0.2 s;
# before, it waited for the safety claim, SAFETY_S = 60 s)


class _CountingWorker(Worker):
    """A worker that counts its claims (each a real claim on the server)."""

    claims = 0

    def _claim_and_run(self, *args, **kwargs):
        self.claims += 1
        return super()._claim_and_run(*args, **kwargs)


def _start(cfg, ran: list) -> tuple[_CountingWorker, threading.Thread, threading.Event]:
    stop = threading.Event()
    worker = _CountingWorker(cfg, "q", handlers.PythonHandler(lambda job: ran.append(job.id), False),
                             stop=stop, budget=Budget(None))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return worker, thread, stop


def _one_held_job(db, cfg) -> tuple[int, object]:
    """One ready job put, and another session's transaction holding its row: (id, that session)."""
    with Producer("q", cfg) as p:
        [held] = p.put_many([{"n": 1}])
    return held, db.job_row_locked(held)


def _met_as_watcher(worker: Worker) -> None:
    """Waits until the idle worker's claim as the watcher came back empty (the held row)."""
    wait_until(lambda: worker.claims >= 2 and worker.waiter.watching, 10,
               message="the worker's empty claim as the watcher")


def _stopped(worker: Worker, thread: threading.Thread, stop: threading.Event) -> None:
    stop.set()
    thread.join(30)
    assert not thread.is_alive() and worker.error is None, worker.error


@pytest.mark.parametrize("queue, wakeup", [({}, {}), ({"limit_per_key": 2}, {}), ({}, {"use_locks": False})],
                         ids=["plain", "limit_per_key", "polling"])
def test_an_idle_worker_backs_off_while_another_session_holds_the_jobs_row_and_runs_it_once_let_go(db, queue,
                                                                                                  wakeup):
    # Given one ready job (of a key, in the limited queue) whose row another session holds
    cfg = db.config(queue={"q": queue}, wakeup=wakeup)
    with Producer("q", cfg) as p:
        [job_id] = p.put_many([{"n": 1}], key="k" if queue else None)
    holder = db.job_row_locked(job_id)
    ran: list[int] = []
    worker, thread, stop = _start(cfg, ran)
    try:
        # When the worker has met the held row idle (its first claim is a busy one; the count
        # woke it for the job, as the watcher or polling) and the claims of a window are
        # counted (the window is what is measured, not a wait for a state)
        wait_until(lambda: worker.claims >= 2, 10, message="the worker's claim from idle")
        before = worker.claims
        stop.wait(WINDOW_S)
        claims = worker.claims - before
        # Then it claimed again now and then, not in a loop (bounded, growing waits)
        assert claims < MOST_CLAIMS, claims
        assert not ran and thread.is_alive()
        # And once the row is let go, the job runs promptly, not at the safety claim a minute on
        holder.rollback()
        wait_until(lambda: ran == [job_id], PICKUP_S, message="the job run once its row was let go")
        assert worker.waiter.wakeups["locked"] >= 1
    finally:
        holder.close()
        _stopped(worker, thread, stop)


def test_a_put_wakes_a_worker_at_once_while_it_waits_to_claim_a_held_job_again(db):
    # Given a held job's worker waiting before it claims again (the first wait 3 s long here,
    # so that the put's wake-up, not the wait's end, is what claims the new job)
    cfg = db.config(wakeup={"poll_initial_s": 3.0, "poll_max_s": 5.0})
    held, holder = _one_held_job(db, cfg)
    ran: list[int] = []
    worker, thread, stop = _start(cfg, ran)
    try:
        _met_as_watcher(worker)
        # When a job is put
        with Producer("q", cfg) as p:
            [fresh] = p.put_many([{"n": 2}])
        # Then it runs at once, woken by the put, not by the end of the wait
        wait_until(lambda: fresh in ran, 2.0, message="the fresh job run")
        assert worker.waiter.wakeups["locked"] == 0 and held not in ran
    finally:
        holder.close()
        _stopped(worker, thread, stop)


def _consumers_connections_killed(db) -> int:
    """KILL CONNECTION of every session of the consumer's (the runtime user's, on this test's
    database; the lock holder is the admin's): how many."""
    ids = [r[0] for r in db.query("SELECT id FROM information_schema.PROCESSLIST WHERE user = %s AND db = %s",
                                  (db.dsn.user, db.dsn.database))]
    for conn_id in ids:
        db.query(f"KILL CONNECTION {int(conn_id)}")
    return len(ids)


@pytest.mark.parametrize("wakeup", [{}, {"use_locks": False}], ids=["watcher", "polling"])
def test_a_held_job_runs_promptly_once_let_go_though_a_put_meanwhile_was_claimed_and_ran(db, wakeup):
    """Regression (an outside attack): the claim that took the put's job handed the watch on,
    and with it the wait before claiming the held job again (a local of the watcher's loop):
    the held job waited for the safety claim, 55 s after its row was let go."""
    # Given a held job that the idle worker met (its claims come back empty)
    cfg = db.config(wakeup=wakeup)
    held, holder = _one_held_job(db, cfg)
    ran: list[int] = []
    worker, thread, stop = _start(cfg, ran)
    try:
        wait_until(lambda: worker.claims >= 2, 10, message="the worker's claim from idle")
        # When a job is put while the row is held, and runs
        with Producer("q", cfg) as p:
            [fresh] = p.put_many([{"n": 2}])
        wait_until(lambda: fresh in ran, 5.0, message="the fresh job run")
        claims = worker.claims
        wait_until(lambda: worker.claims > claims + 1, 10, message="the worker claiming again for the held job")
        # And the row is let go
        holder.rollback()
        # Then the held job runs promptly, not at the safety claim a minute on
        wait_until(lambda: held in ran, PICKUP_S, message="the held job run once its row was let go")
    finally:
        holder.close()
        _stopped(worker, thread, stop)


def test_a_held_job_runs_promptly_once_let_go_though_the_consumers_connections_were_killed(db):
    """Regression (an outside attack): the watch session reconnected, the watcher's loop ended,
    and with it the wait before claiming the held job again: the held job waited for the safety
    claim, 52 s after its row was let go."""
    # Given a held job that the idle watcher met
    cfg = db.config()
    held, holder = _one_held_job(db, cfg)
    ran: list[int] = []
    worker, thread, stop = _start(cfg, ran)
    try:
        _met_as_watcher(worker)
        # When the consumer's connections are killed, and it watches again on a new one
        generation = worker.waiter.session.generation
        assert _consumers_connections_killed(db) >= 2
        wait_until(lambda: worker.waiter.session.generation > generation and worker.waiter.watching, 30,
                   message="the watcher back on a new connection")
        # And the row is let go
        holder.rollback()
        # Then the held job runs promptly, not at the safety claim a minute on
        wait_until(lambda: held in ran, PICKUP_S, message="the held job run once its row was let go")
        assert thread.is_alive() and worker.error is None, worker.error
    finally:
        holder.close()
        _stopped(worker, thread, stop)


@pytest.mark.parametrize("wakeup", [{}, {"use_locks": False}], ids=["watcher", "polling"])
def test_a_scheduled_job_held_when_it_falls_due_holds_up_no_claim_and_runs_once_let_go(db, wakeup):
    """Regression (an outside attack): a claim's promotion of due jobs waited on the held row
    (the server's lock wait, then error 1205, again and again): a job put meanwhile started
    15 s late."""
    # Given a scheduled job whose row another session holds when it falls due, and a worker
    cfg = db.config(wakeup=wakeup)
    with Producer("q", cfg) as p:
        [scheduled] = p.put_many([{"n": 1}], delay=1)
    holder = db.job_row_locked(scheduled)
    ran: list[int] = []
    worker, thread, stop = _start(cfg, ran)
    try:
        wait_until(lambda: db.scalar("SELECT run_at <= NOW(6) FROM nq_job WHERE id = %s", (scheduled,)), 10,
                   message="the scheduled job due")
        claims = worker.claims
        wait_until(lambda: worker.claims > claims + 1, 10, message="the worker's claims that met the held due job")
        # When a job is put meanwhile
        with Producer("q", cfg) as p:
            [fresh] = p.put_many([{"n": 2}])
        # Then it runs at once: no claim waits on the held row
        wait_until(lambda: fresh in ran, 2.0, message="the fresh job run")
        # And the worker claims again now and then, not in a loop (the due job wakes no one)
        before = worker.claims
        stop.wait(WINDOW_S)
        assert worker.claims - before < MOST_CLAIMS, worker.claims - before
        assert scheduled not in ran
        # And once the row is let go, the due job is promoted and runs promptly
        holder.rollback()
        wait_until(lambda: scheduled in ran, PICKUP_S, message="the due job run once its row was let go")
        assert worker.error is None, worker.error
    finally:
        holder.close()
        _stopped(worker, thread, stop)


def test_two_workers_of_a_process_back_off_after_a_put_while_a_job_is_held_and_stop_once_it_ran(db):
    """Regression (an outside attack): a put's wake started the backoff over, and the claims
    made for the held job outside the watch (by the worker waiting for the watch seat) neither
    stepped it nor told the Waiter what they found: two workers of a process claimed about 200
    times a second while the row was held, and went on after it was let go, the queue empty."""
    # Given a process of two workers (one Presence) that met a held job's row
    cfg = db.config()
    held, holder = _one_held_job(db, cfg)
    ran: list[int] = []
    stop = threading.Event()
    presence = Presence(cfg, ["q"], stop)
    workers = [_CountingWorker(cfg, "q", handlers.PythonHandler(lambda job: ran.append(job.id), False),
                               stop=stop, budget=Budget(None), name=f"w{i}", presence=presence)
               for i in range(2)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for t in threads:
        t.start()

    def claims() -> int:
        return sum(w.claims for w in workers)

    try:
        wait_until(lambda: claims() >= 3, 10, message="the workers' claims from idle")
        # When a job is put while the row is held, and runs
        with Producer("q", cfg) as p:
            [fresh] = p.put_many([{"n": 2}])
        wait_until(lambda: fresh in ran, 5.0, message="the fresh job run")
        # Then the claims of a window stay few (bounded, growing waits), not a loop
        before = claims()
        stop.wait(WINDOW_S)
        assert claims() - before < MOST_CLAIMS, claims() - before
        # And once the row is let go, the held job runs, and the claims for it stop
        holder.rollback()
        wait_until(lambda: held in ran, PICKUP_S, message="the held job run once its row was let go")
        wait_until(lambda: workers[0].waiter.locked_at is None, PICKUP_S, message="the claim again ended")
        before = claims()
        stop.wait(WINDOW_S)
        assert claims() - before < 5, claims() - before
    finally:
        holder.close()
        stop.set()
        for t in threads:
            t.join(30)
        assert all(not t.is_alive() for t in threads) and all(w.error is None for w in workers)
        presence.close()
