"""The claim for held jobs (Waiter.recount_after: a counter's trust ends; Waiter.locked_out:
another session's locks) is the queue's idle worker's to make. A claim that sets it while that
worker already waits for the watch lock behind another consumer's watcher (a GET_LOCK begun
with idle_wait_s, 25 s) must end that wait: the other consumer's watcher knows nothing of this
process's held jobs, and the claim's own worker runs the jobs it took. Before, the held job
waited for the end of that GET_LOCK, about 20 s past the counter's trust. And a scheduled job
that falls due while ready jobs another session holds locked are left wakes the watcher at its
run_at, not at the next claim again (up to poll_max_s later). Real server, library API."""

from __future__ import annotations

import collections
import threading
import time

from conftest import admin_connect, wait_until

from notifyq.consume import handlers
from notifyq.consume.presence import Presence
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer
from notifyq.store.flow import COUNT_TRUST_S

Q = "q"
MARGIN_S = 3.0  # past the claim again's time: the held job starts within this (before: ~20 s)
WINDOW_S = 3.0
SHIPPED = {"idle_wait_s": 25.0, "poll_max_s": 1.0}  # an idle period whose claims are counted: no busy poll


class _CountingWorker(Worker):
    """A worker that counts its claims (each a real claim on the server)."""

    claims = 0

    def _claim_and_run(self, *args, **kwargs):
        self.claims += 1
        return super()._claim_and_run(*args, **kwargs)


class Gated:
    """Jobs whose payload names a gate wait in their handler until the test opens it; the
    others return at once. Notes each start's monotonic time by job id."""

    def __init__(self):
        self.gates: dict[str, threading.Event] = collections.defaultdict(threading.Event)
        self.starts: dict[int, float] = {}

    def __call__(self, job) -> None:
        self.starts.setdefault(job.id, time.monotonic())
        gate = job.payload.get("gate")
        if gate:
            assert self.gates[gate].wait(60), "never released"

    def open_all(self) -> None:
        for gate in list(self.gates.values()):
            gate.set()


class Process:
    """One consumer process of `n` workers of the queue (one Presence), on threads."""

    def __init__(self, cfg, handler, n: int):
        self.stop = threading.Event()
        self.presence = Presence(cfg, [Q], self.stop)
        self.workers = [_CountingWorker(cfg, Q, handlers.PythonHandler(handler, False), stop=self.stop,
                                        budget=Budget(None), name=f"w{i}", presence=self.presence)
                        for i in range(n)]
        self.threads = [threading.Thread(target=w.run, daemon=True) for w in self.workers]
        for t in self.threads:
            t.start()

    @property
    def waiter(self):
        return self.presence.watch_seats[Q].waiter

    def claims(self) -> int:
        return sum(w.claims for w in self.workers)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        errors = [w.error for w in self.workers if w.error is not None]
        self.presence.close()
        assert all(not t.is_alive() for t in self.threads) and not errors, errors


def _in_get_lock(db, conn_id: int | None) -> bool:
    return bool(conn_id) and bool(db.query("SELECT 1 FROM information_schema.PROCESSLIST WHERE id = %s AND "
                                           "info LIKE 'SELECT GET_LOCK%%'", (conn_id,)))


class OtherWatcher:
    """Another consumer process's idle watcher, as this process sees it: a session that queues
    for the queue's watch lock and, once granted, keeps it (an idle watcher hands it on only when
    it claims, and it knows nothing of this process's held jobs)."""

    def __init__(self, db, name: str):
        self.conn = admin_connect(db.dsn, db.dsn.database)  # (the consumers' user, as a consumer's)
        self.conn_id = self.conn.thread_id()
        self.got: list = []
        self.thread = threading.Thread(target=self._queue, args=(name,), daemon=True)
        self.thread.start()
        wait_until(lambda: self.got or _in_get_lock(db, self.conn_id), 10, message="the other watcher queued")

    def _queue(self, name: str) -> None:
        cur = self.conn.cursor()
        cur.execute("SELECT GET_LOCK(%s, 120)", (name,))
        self.got.append(cur.fetchone()[0])

    def close(self) -> None:
        self.conn.close()  # (frees the lock)


def test_a_job_a_counter_holds_back_starts_at_the_trust_end_while_the_idle_worker_waits_for_the_watch(db):
    # Given a queue limited to 1 running job per key, claims of one job, and a process of two
    # idle workers (one of them watches)
    # (the wake-up settings as shipped: a wait for the watch lock is 25 s)
    cfg = db.config(queue={Q: {"limit_per_key": 1, "batch_size": 1}}, wakeup=SHIPPED)
    handler = Gated()
    process = Process(cfg, handler, 2)
    other = None
    try:
        wait_until(lambda: process.waiter.watching, 30, message="a worker watching")
        # And another consumer's idle watcher queued for the watch lock behind ours
        other = OtherWatcher(db, process.waiter.locks.watch)
        # When two jobs are put: our watcher claims one (it runs until its gate opens) and hands the
        # watch on, to the other consumer; our other worker queues for it (idle_wait_s, 25 s)
        with Producer(Q, cfg) as producer:
            first, second = producer.put_many([{"gate": "a"}, {"gate": "b"}])
        wait_until(lambda: first in handler.starts and other.got == [1], 15,
                   message="the first job running and the other consumer watching")
        wait_until(lambda: _in_get_lock(db, process.waiter.session.connection_id), 15,
                   message="our idle worker queued for the watch")
        # And key k's counter left high (a running job's row deleted outside notifyq), counted just
        # now, and a job of k put (it wakes the other consumer's watcher only)
        db.query("INSERT INTO nq_flow_key (queue, job_key, running, counted_at) VALUES (%s, 'k', 1, NOW(6)) "
                 "ON DUPLICATE KEY UPDATE running = 1, counted_at = NOW(6)", (Q,))
        with Producer(Q, cfg) as producer:
            held = producer.put({}, key="k")
        # And the first job ends: its worker's next claim takes the second job (which runs until
        # the end of the test: that worker is busy) and holds k's job back by k's counter
        handler.gates["a"].set()
        wait_until(lambda: second in handler.starts, 15, message="the second job running")
        claimed_at = handler.starts[second]
        assert process.waiter.recount_at is not None, "the claim held the job back by the counter"
        # Then the held job starts once the counter's trust has ended: the idle worker's wait for
        # the watch ended at that claim's word (before: at its GET_LOCK's end, ~20 s later)
        wait_until(lambda: held in handler.starts, COUNT_TRUST_S + MARGIN_S + 25, 0.05,
                   message="the held job started")
        took_s = handler.starts[held] - claimed_at
        assert took_s < COUNT_TRUST_S + MARGIN_S, f"the held job started {took_s:.1f} s after the claim that held it"
        assert 1 <= sum(w.watch_waits_ended for w in process.workers) <= 2
        # And the idle worker does not poll: a few claims at most over an idle period
        wait_until(lambda: process.waiter.recount_at is None, 10, message="no claim due for held jobs")
        before = process.claims()
        process.stop.wait(WINDOW_S)
        assert process.claims() - before <= 1, process.claims() - before
    finally:
        handler.open_all()
        if other is not None:
            other.close()
        process.close()


def test_a_scheduled_job_falling_due_while_a_locked_job_is_left_wakes_the_watcher_at_its_run_at(db):
    # Given a ready job whose row another session holds, and one idle worker that met it: it
    # claims again after waits of 4 s, then 8 s (long here, so that the due job's own wake, not
    # the claim again, is what starts it)
    cfg = db.config(wakeup={"poll_initial_s": 4.0, "poll_max_s": 8.0, "idle_wait_s": 25.0})
    with Producer(Q, cfg) as producer:
        locked = producer.put({})
    holder = db.job_row_locked(locked)
    handler = Gated()
    process = Process(cfg, handler, 1)
    try:
        wait_until(lambda: process.waiter.locked_at is not None and process.waiter.watching, 15,
                   message="the watcher's empty claim that met the locked job")
        # When a job is put to run 2 s from now (its put wakes the watcher: an empty claim)
        with Producer(Q, cfg) as producer:
            scheduled = producer.put({}, delay=2)
        due = time.monotonic() + 2
        # Then it starts at its run_at (before: at the claim again, up to poll_max_s later)
        wait_until(lambda: scheduled in handler.starts, 15, 0.02, message="the scheduled job started")
        late_s = handler.starts[scheduled] - due
        assert late_s < 1.0, f"the scheduled job started {late_s:.1f} s after its run_at"
        assert locked not in handler.starts
        # And the locked job, still due to the claim again, wakes no loop: a claim or two at most
        # over an idle period (the waits of 4 s and 8 s)
        before = process.claims()
        process.stop.wait(WINDOW_S)
        assert process.claims() - before <= 2, process.claims() - before
    finally:
        holder.close()
        process.close()
