"""The wake-up protocol against a real server: Worker threads in this process, a recording handler.

"Woken" is read from observable facts only: which worker ran a handler, the Waiter.wakeups
counters (one per return from an idle wait with work to claim), the watch lock's holder and
the sessions queued behind it in PROCESSLIST, and the server's Questions counter.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import statistics
import threading
import time

import MySQLdb
import pytest
from conftest import admin_connect, run_cli, wait_until

from notifyq.consume.service import ConsumeOptions, ConsumerService
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer
from notifyq.store import advisory, bells, queries
from notifyq.store.db import Session
from notifyq.store.driver import locks_unavailable
from notifyq.store.locks import QueueLocks, lock_name
from notifyq.wakeup import QUIET_LOOK_S

Q = "wq"
MARGIN_S = 1.0  # scheduling noise on a loaded 2-core machine, on top of any designed delay
SHARED_SERVER = bool(os.environ.get("NOTIFYQ_TEST_DSN"))


class Recorder:
    """A per-job handler that records (worker thread, start time) and lets tests wait for ids."""

    per_batch = False

    def __init__(self, linger_s: float = 0.0):
        self.linger_s = linger_s
        self.runs: dict[int, list[tuple[str, float]]] = {}
        self._cond = threading.Condition()

    def __call__(self, jobs, extend) -> None:
        for job in jobs:
            with self._cond:
                self.runs.setdefault(job.id, []).append((threading.current_thread().name, time.monotonic()))
                self._cond.notify_all()
            if self.linger_s:
                time.sleep(self.linger_s)  # the job's own work

    def wait_for(self, job_id: int, timeout: float) -> float:
        """Start time of job_id's first run; fails the test at the deadline."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while job_id not in self.runs:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"job {job_id} not started within {timeout:.2f}s")
                self._cond.wait(left)
            return self.runs[job_id][0][1]

    def count(self) -> int:
        with self._cond:
            return sum(len(v) for v in self.runs.values())


class Fleet:
    """N Worker threads on one queue, stopped the way ConsumerService stops them."""

    def __init__(self, config, n: int, handler, queue: str = Q, batch_size: int | None = None):
        self.config = config
        self.stop = threading.Event()
        self.workers = [Worker(config, queue, handler, stop=self.stop, budget=Budget(None),
                               batch_size=batch_size, name=f"w{i}") for i in range(n)]
        self.threads = [threading.Thread(target=w.run, name=w.name, daemon=True) for w in self.workers]

    def __enter__(self) -> "Fleet":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        killer = Session(self.config.dsn, autocommit=True, retry_s=2, name="test-stopper")
        deadline = time.monotonic() + 30
        try:
            while any(t.is_alive() for t in self.threads) and time.monotonic() < deadline:
                for w, t in zip(self.workers, self.threads):
                    if t.is_alive():  # a KILL between two statements is lost: repeat until they are out
                        w.presence.interrupt_waits(killer)
                for t in self.threads:
                    t.join(0.1)
        finally:
            killer.close()
        assert not any(t.is_alive() for t in self.threads), "workers did not stop"
        errors = [w.error for w in self.workers if w.error is not None]
        assert not errors, errors

    def wakeups(self) -> int:
        return sum(sum(kinds.values()) for kinds in self.wakeup_kinds())

    def wakeup_kinds(self) -> list[dict[str, int]]:
        """Each worker's wake-ups by kind (what a failed count shows)."""
        return [dict(w.waiter.wakeups) for w in self.workers]


def watch_state(db, queue: str = Q) -> tuple[int | None, int]:
    """(connection holding the watch lock, sessions queued in GET_LOCK for it)."""
    watch = QueueLocks(db.dsn.database, queue).watch
    return db.query(
        "SELECT IS_USED_LOCK(%s), (SELECT COUNT(*) FROM information_schema.PROCESSLIST"
        " WHERE INFO LIKE %s)", (watch, f"SELECT GET_LOCK('{watch}',%"))[0]


def watcher_waits_on_the_bell(db, queue: str = Q) -> bool:
    """The watcher's statement is inside GET_LOCK on a bell: a ringer is armed. (Its wait without
    a bell is in GET_LOCK too on MariaDB, on its worker's nap lock: wakeup/nap.py; only while a
    ringer holds a bell does the statement wait on one.)"""
    holder, _ = watch_state(db, queue)
    bells = QueueLocks(db.dsn.database, queue).bells
    return holder is not None and db.scalar(
        "SELECT STATE = 'User lock' AND (IS_USED_LOCK(%s) IS NOT NULL OR IS_USED_LOCK(%s) IS NOT NULL)"
        " FROM information_schema.PROCESSLIST WHERE ID = %s", (*bells, holder)) == 1


def watcher_sleep_s(db, queue: str = Q) -> float | None:
    """How long the watcher's statement sleeps (its backoff step), None while it sleeps in no SLEEP."""
    holder, _ = watch_state(db, queue)
    info = holder and db.scalar("SELECT INFO FROM information_schema.PROCESSLIST WHERE ID = %s", (holder,))
    found = re.search(r"SLEEP\(([^)]+)\)", info or "")
    return float(found.group(1)) if found else None


def wait_settled(db, n: int, timeout: float = 20.0, queue: str = Q) -> None:
    """Every consumer asleep: one watcher, the other n-1 queued behind it on the watch lock."""
    wait_until(lambda: (lambda h, queued: h is not None and queued == n - 1)(*watch_state(db, queue)),
               timeout, message=f"1 watcher and {n - 1} queued consumers")


class Questions:
    """The server's Questions counter, read on one connection; our own reads are subtracted."""

    def __init__(self, db):
        self.conn = admin_connect(db.admin)
        self.reads = 0

    def read(self) -> int:
        cur = self.conn.cursor()
        cur.execute("SHOW GLOBAL STATUS LIKE 'Questions'")
        self.reads += 1
        return int(cur.fetchone()[1])

    def close(self) -> None:
        self.conn.close()


class Ballast:
    """n extra live consumers (rows whose liveness locks one admin session really holds).

    The watch statement tests every consumer's lock between its read of the count and its
    wait, so ballast widens exactly the window a ring must never fall into unheard."""

    def __init__(self, db, n: int):
        self.conn = admin_connect(db.admin, db.admin.database)
        cur = self.conn.cursor()
        names = [f"nq:{db.admin.database}:ballast:{i}" for i in range(n)]
        for i in range(0, n, 500):
            chunk = names[i:i + 500]
            cur.execute("SELECT " + ",".join(["GET_LOCK(%s, 0)"] * len(chunk)), chunk)
            assert all(v == 1 for v in cur.fetchone())
            cur.executemany("INSERT INTO nq_consumer (id, lock_name, host, pid, queues) VALUES (%s, %s, 'ballast', 0, %s)",
                            [(f"{j:032d}", name, Q) for j, name in enumerate(chunk, i)])

    def close(self) -> None:
        self.conn.cursor().execute("DELETE FROM nq_consumer WHERE host = 'ballast'")
        self.conn.close()


def put_and_time(producer: Producer, recorder: Recorder, timeout: float, **kw) -> float:
    job_id = producer.put({"t": time.monotonic()}, **kw)
    committed = time.monotonic()
    return recorder.wait_for(job_id, timeout) - committed


# ------------------------------------------------------------------ names


def test_lock_names_fit_64_characters_and_always_name_the_database():
    # Given the longest database and queue names allowed, and names differing only in case
    for database, queue in [("notifyq", "orders"), ("d" * 64, "q" * 64), ("Shop", "Q"), ("shop", "q")]:
        locks = QueueLocks(database, queue)
        names = [locks.watch, *locks.bells, locks.ringer, locks.periodic]
        # Then every name fits MySQL's 64 characters and shows (the start of) the database
        assert all(len(n) <= 64 for n in names), names
        assert all(database[:20] in n for n in names), names
        assert len(set(names)) == len(names)
    # And no two databases, queues or cases share a lock
    assert len({QueueLocks(d, q).watch for d, q in
                [("a", "q"), ("b", "q"), ("a", "Q"), ("A", "q"), ("d" * 64, "q" * 64), ("d" * 64, "q" * 63 + "r")]}) == 6
    assert lock_name("db", "watch", "orders") == "nq:db:watch:orders"


# ------------------------------------------------------------------ no lost wake-up


def test_500_one_shot_jobs_after_random_idle_gaps_are_each_picked_up_within_the_cap(db):
    # Given 3 idle consumers whose watcher polls the signal row with backoff capped at 0.2 s
    cfg = db.config()
    cap = cfg.wakeup.poll_max_s
    recorder = Recorder()
    rng = random.Random(500)
    latencies = []
    with Fleet(cfg, 3, recorder), Producer(Q, cfg) as producer:
        wait_settled(db, 3)
        # When 500 single jobs are put by a one-shot producer, each after a random gap of 0-50 ms
        for _ in range(500):
            time.sleep(rng.uniform(0, 0.05))  # the adversarial input, not a synchronisation
            latencies.append(put_and_time(producer, recorder, cap + MARGIN_S))
    # Then every one was started within the cap plus a margin (put_and_time asserts it)
    latencies.sort()
    print(f"\none-shot pick-up over 500 rounds: p50={latencies[250] * 1e3:.1f}ms "
          f"p99={latencies[495] * 1e3:.1f}ms max={latencies[-1] * 1e3:.1f}ms")
    assert recorder.count() == 500


def test_500_bell_rings_across_the_two_bells_are_never_slept_through(db):
    # Given 3 idle consumers whose watcher, without a bell, would sleep 5 s between reads, and
    # 2,000 more live consumers registered, which stretch the watch statement's gap between its
    # read and its wait to a few milliseconds
    cfg = db.config(wakeup={"poll_initial_s": 5.0, "poll_max_s": 5.0, "idle_wait_s": 5.0})
    recorder = Recorder()
    rng = random.Random(2)
    latencies = []
    ballast = Ballast(db, 2000)
    with contextlib.closing(ballast), Fleet(cfg, 3, recorder) as fleet, \
            Producer(Q, cfg, ring=True) as producer:
        wait_settled(db, 3)
        # (A ringer arms on its first put, which a watcher already asleep hears only when it
        # next reads; from then on the watcher waits on the bell.)
        put_and_time(producer, recorder, 5.0 + MARGIN_S)
        wait_settled(db, 3)
        wait_until(lambda: watcher_waits_on_the_bell(db), 10, message="the watcher waiting on the bell")
        # When a bell-holding producer puts 500 single jobs after random gaps of 0-50 ms (half
        # of them 0-5 ms), so that commits, bell swaps, the watcher's reads and the watch
        # hand-offs interleave
        for _ in range(500):
            time.sleep(rng.uniform(0, rng.choice((0.005, 0.05))))  # the adversarial input
            # (each start waited for under the 5 s sleep, with room for a loaded machine's
            # stalls: what tells a lost ring is the watcher's wake-up by timeout, below)
            latencies.append(put_and_time(producer, recorder, 4 * MARGIN_S))
        # Then no ring was lost: a lost one would cost up to the 5 s sleep, ended by its timeout
        assert producer._waker.bell is not None and producer._waker.bell.held is not None, "never rang"
        assert sum(w.waiter.wakeups["timeout"] for w in fleet.workers) == 0
    latencies.sort()
    print(f"\nbell pick-up over 500 rounds: p50={latencies[250] * 1e3:.2f}ms "
          f"p99={latencies[495] * 1e3:.2f}ms max={latencies[-1] * 1e3:.1f}ms")


def test_a_ring_there_and_back_while_the_watch_statement_reads_is_not_slept_through(db):
    # Given a watcher whose last statement saw bell 0 held, a ringer holding it (the test's own
    # session, so that its rings come exactly when the test says), and 200,000 consumers' rows,
    # whose liveness locks the watch statement tests one by one (some 100 ms: their number is
    # what counts here, so their locks are free, as dead consumers' are)
    cfg = db.config(wakeup={"instant_wake": False})
    locks = QueueLocks(db.dsn.database, Q)
    admin = admin_connect(db.admin, db.admin.database)
    for start in range(0, 200_000, 5_000):  # (one multi-row INSERT per 5,000: executemany sends a row each)
        admin.cursor().execute(
            "INSERT INTO nq_consumer (id, lock_name, host, pid, queues) VALUES "
            + ",".join(["(%s, %s, 'ballast', 0, %s)"] * 5_000),
            [v for i in range(start, start + 5_000) for v in (f"{i:032d}", f"nq:{db.admin.database}:ballast:{i}", Q)])
    watcher = Session(cfg.dsn, autocommit=True, name="watcher")
    ringer = Session(cfg.dsn, autocommit=True, name="ringer")
    seen: list = []
    try:
        bells.watch(watcher, Q, locks, None, 0)  # (makes the queue's row)
        assert advisory.get_lock(ringer, locks.bells[0], 0) == 1
        with Producer(Q, cfg) as producer:  # (no bell, no instant wake: the test rings)
            producer.put({"warm-up": True})  # (connects)
            admin.cursor().execute("UPDATE nq_queue SET watched_seq = (SELECT SUM(seq) FROM nq_signal"
                                   " WHERE queue = %s) WHERE queue = %s", (Q, Q))  # as its claim would
            before = bells.watch(watcher, Q, locks, None, 0)
            assert before.total == before.watched and before.held == 0, before
            watching = threading.Thread(target=lambda: seen.append(bells.watch(watcher, Q, locks, 0, 5.0)))
            started = time.monotonic()
            watching.start()
            # When, once the next watch statement has read the count (it has run for 20 ms, or
            # it waits on the bell already), a job is put and the ringer rings for it twice: to
            # bell 1 (the ring for jobs already counted, or already claimed) and back to bell 0
            cur = admin.cursor()
            wait_until(lambda: cur.execute(
                "SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = %s AND INFO LIKE %s"
                " AND (TIME_MS >= 20 OR STATE = 'User lock')",
                (watcher.connection_id, "%nq_signal%")) == 1, 10, message="the watch statement past its read")
            producer.put({"n": 1})
            for held in (0, 1):
                bells.ring(ringer, locks, held)
                ringer.pipeline.read_reply()
            watching.join(10)
        # Then the statement does not wait out its 5 s on the bell taken back: the first ring
        # granted its wait, or its read already showed the job (the reap still runs after it)
        took = time.monotonic() - started
        assert seen and (seen[0].waited == 1 or seen[0].total > seen[0].watched), seen
        assert took < 5.0 / 2, took
    finally:
        admin.cursor().execute("DELETE FROM nq_consumer WHERE host = 'ballast'")
        admin.close()
        watcher.close()
        ringer.close()


def test_a_new_ringers_first_put_wakes_a_watcher_asleep_without_a_bell_at_once(db):
    # Given idle consumers whose watcher, with no ringer holding a bell, sleeps 5 s between
    # reads, and ringing producers that come and go (a producer process restarted)
    cfg = db.config(wakeup={"poll_initial_s": 5.0, "poll_max_s": 5.0, "idle_wait_s": 5.0})
    recorder = Recorder()
    latencies = []
    with Fleet(cfg, 2, recorder):
        for _ in range(3):
            wait_settled(db, 2)
            wait_until(lambda: not watcher_waits_on_the_bell(db), 10, message="the watcher asleep, no bell held")
            # When a new ringing producer puts its first job (it takes a bell the watcher is not
            # waiting on: a ring would reach nobody)
            with Producer(Q, cfg, ring=True) as producer:
                latencies.append(put_and_time(producer, recorder, 5.0 + MARGIN_S))
    # Then each first job starts at once (the instant wake), not at the watcher's next read
    # (up to 5 s later)
    assert max(latencies) < MARGIN_S, latencies


def test_a_ringer_whose_bell_was_lost_before_its_put_still_wakes_the_watcher_at_once(db):
    # Given idle consumers whose watcher waits on a ringing producer's bell (without one it
    # would sleep 5 s between reads)
    cfg = db.config(wakeup={"poll_initial_s": 5.0, "poll_max_s": 5.0, "idle_wait_s": 5.0})
    recorder = Recorder()
    with Fleet(cfg, 2, recorder), Producer(Q, cfg, ring=True) as producer:
        wait_settled(db, 2)
        for _ in range(2):  # the first put takes the bell, the second rings it
            put_and_time(producer, recorder, 5.0 + MARGIN_S)
        wait_until(lambda: watcher_waits_on_the_bell(db), 10, message="the watcher waiting on the bell")
        # When the producer's lock session dies unnoticed (the bell freed: the watcher takes it,
        # finds nothing new and sleeps) and the producer then puts a job
        db.query(f"KILL CONNECTION {int(producer._waker.session.connection_id)}")
        wait_until(lambda: not watcher_waits_on_the_bell(db), 10, message="the watcher asleep, no bell held")
        latency = put_and_time(producer, recorder, 5.0 + MARGIN_S)
    # Then the job starts at once (the put's look saw the bell lost and a consumer watching: it
    # interrupts the watcher's sleep), not at the watcher's next read, up to 5 s later
    assert latency < MARGIN_S, latency


@pytest.mark.skipif(SHARED_SERVER, reason="needs a server of its own: Questions counts everyone")
def test_a_ringing_producer_rings_only_while_a_consumer_watches_and_then_wakes_it_at_once(db):
    # Given an armed bell ringer and no consumer at all
    cfg = db.config(wakeup={"poll_initial_s": 5.0, "poll_max_s": 5.0, "idle_wait_s": 5.0})
    recorder = Recorder()
    questions = Questions(db)
    try:
        with Producer(Q, cfg, ring=True) as producer:
            producer.put({"warm-up": True})  # connects and arms
            assert producer._waker.bell is not None and producer._waker.bell.held is not None
            # When it puts 50 jobs with nobody watching
            bell = producer._waker.bell
            before, looks_before, t0 = questions.read(), bell.look.taken, time.monotonic()
            for i in range(50):
                producer.put({"n": i})
            elapsed = time.monotonic() - t0
            spent = questions.read() - before - 1
            looks = bell.look.taken - looks_before
            # Then it never rang, it looked at most once per quiet window (a look that saw nobody
            # watching holds for QUIET_LOOK_S), and each put cost what a plain one does
            # (INSERT, signal bump, COMMIT) plus the looks that rode with COMMITs
            assert producer._waker.bell.rings == 0
            assert looks <= 1 + elapsed / QUIET_LOOK_S, f"{looks} looks in {elapsed * 1e3:.1f} ms"
            assert spent <= 50 * 3 + looks, f"{spent / 50:.2f} statements per put"
            # When consumers start (their watcher, without a bell, would sleep 5 s between
            # reads), drain the backlog, and settle with the watcher on the bell
            with Fleet(cfg, 2, recorder) as fleet:
                wait_until(lambda: recorder.count() == 51, 10 + MARGIN_S, message="the backlog drained")
                wait_settled(db, 2)
                wait_until(lambda: watcher_waits_on_the_bell(db), 10, message="the watcher waiting on the bell")
                # Then each single put rings, and the watcher starts it at once, not 5 s later
                # (each put waits for the watcher back on the bell: a put in the moment between
                # its claim and its next GET_LOCK rightly sees nobody watching and does not ring)
                rings_before = producer._waker.bell.rings
                for _ in range(20):
                    assert put_and_time(producer, recorder, MARGIN_S) < MARGIN_S
                    wait_settled(db, 2)
                    wait_until(lambda: watcher_waits_on_the_bell(db), 10, message="the watcher back on the bell")
                assert producer._waker.bell.rings - rings_before == 20
                assert sum(w.waiter.wakeups["timeout"] for w in fleet.workers) == 0
    finally:
        questions.close()


def test_one_producer_per_queue_rings_and_another_ringing_producer_says_once_that_it_does_not(db, caplog):
    # Given a ringing producer that armed first
    cfg = db.config()
    with Producer(Q, cfg, ring=True) as first, Producer(Q, cfg, ring=True) as second:
        first.put({"n": 0})
        assert first._waker.bell is not None and first._waker.bell.held is not None
        # When a second ringing producer puts on the same queue, again and again
        with caplog.at_level("INFO", logger="notifyq.wakeup"):
            for i in range(3):
                second.put({"n": i})
        # Then it holds no bell (one per queue and server) and says so once, with what to expect
        assert second._waker.bell is not None and second._waker.bell.held is None
        told = [r.getMessage() for r in caplog.records if "another producer rings" in r.getMessage()]
        assert len(told) == 1 and "wakeup.poll_max_s" in told[0] and "instant_wake" in told[0]


def test_a_watcher_that_starts_inside_a_ringers_quiet_window_finds_the_job_by_the_count_and_is_rung_after_it(db):
    # Given an armed ringer whose last look saw nobody watching, with a quiet window of 60 s (the
    # default is a few ms: long here so that the consumer surely starts inside it)
    cfg = db.config(wakeup={"poll_max_s": 0.2})
    recorder = Recorder()
    with Producer(Q, cfg, ring=True) as producer:
        producer.put({"warm-up": True})  # arms
        bell = producer._waker.bell
        assert bell is not None and bell.held is not None
        bell.look.quiet_s = 60.0
        wait_until(bell.look.due, 1, message="the warm-up's own quiet window over")
        producer.put({"look": True})  # it looks, sees nobody, and goes quiet for 60 s
        looks = bell.look.taken
        # When a consumer starts watching inside the window, and a job is put there
        with Fleet(cfg, 1, recorder):
            wait_until(lambda: recorder.count() == 2, 10, message="the first two jobs run")
            wait_until(lambda: watcher_waits_on_the_bell(db), 10, message="the watcher on the bell")
            took = put_and_time(producer, recorder, 0.2 + MARGIN_S)
            # Then that put did not look (nor ring), and the watcher found the job by its own
            # read of the count within its backoff (capped at poll_max_s 0.2 s here)
            assert bell.look.taken == looks and bell.rings == 0
            assert took < 0.2 + MARGIN_S
            # And once the window is over, the next put looks and rings the watcher again
            bell.look.quiet_until = 0.0  # what quiet_s later would do
            wait_until(lambda: watcher_waits_on_the_bell(db), 10, message="the watcher on the bell")
            put_and_time(producer, recorder, MARGIN_S)
            assert bell.look.taken == looks + 1 and bell.rings == 1


def test_a_bell_left_free_by_a_half_armed_ringer_costs_one_claim_per_consumer_not_a_spin(db):
    # Given 3 idle consumers and a state no ringer leaves the bells in (a session that is no
    # ringer holds bell[1], while the queue row of the earlier protocol names bell[0], free)
    cfg = db.config(wakeup={"poll_max_s": 0.2})
    recorder = Recorder()
    bells = QueueLocks(db.dsn.database, Q).bells
    half_armed = admin_connect(db.admin)
    questions = Questions(db)
    try:
        with Fleet(cfg, 3, recorder) as fleet:
            wait_settled(db, 3)
            half_armed.cursor().execute("SELECT GET_LOCK(%s, 0)", (bells[1],))
            before, t0 = questions.read(), time.monotonic()
            # When the fleet idles in that state for 3 s
            time.sleep(3)  # the measurement window itself, not a synchronisation
            rate = (questions.read() - before - 1) / (time.monotonic() - t0)
            bell_wakeups = sum(w.waiter.wakeups["bell"] for w in fleet.workers)
            # Then each consumer took at most one needless claim for a grant, and the fleet's
            # statements stay at the backoff poll's rate, not a spin of grants and claims
            assert bell_wakeups <= 3, bell_wakeups
            assert rate < 40, f"{rate:.0f} statements/s"
            # And work put meanwhile (no ring) is still found by the backoff poll
            with Producer(Q, cfg) as one_shot:
                job_id = one_shot.put({"after": "stuck bells"})
            recorder.wait_for(job_id, 0.2 + 2 * MARGIN_S)
    finally:
        questions.close()
        half_armed.close()


def test_a_single_job_wakes_exactly_one_of_five_idle_consumers(db):
    # Given five idle consumers: one watcher, four asleep in GET_LOCK behind it
    cfg = db.config()
    recorder = Recorder()
    with Fleet(cfg, 5, recorder) as fleet, Producer(Q, cfg) as one_shot, \
            Producer(Q, cfg, ring=True) as ringer:
        wait_settled(db, 5)
        for producer in (one_shot, ringer, ringer, one_shot):
            woken = fleet.wakeups()
            kinds = fleet.wakeup_kinds()
            claimed = [w.stats.claimed for w in fleet.workers]
            # When one job is put (by a one-shot producer, then by a bell ringer)
            job_id = producer.put({"single": True})
            recorder.wait_for(job_id, 5)
            wait_settled(db, 5)
            # Then exactly one consumer left its idle wait, and it alone claimed anything
            assert fleet.wakeups() - woken == 1, (kinds, fleet.wakeup_kinds())
            grew = [w.stats.claimed - c for w, c in zip(fleet.workers, claimed)]
            assert sorted(grew) == [0, 0, 0, 0, 1], grew
    assert recorder.count() == 4


# ------------------------------------------------------------------ delayed and paused work


def test_a_delayed_job_is_picked_up_at_its_time_by_an_idle_fleet(db):
    # Given an idle fleet with the default 1 s backoff cap and nothing else going on
    cfg = db.config(wakeup={"poll_max_s": 1.0})
    recorder = Recorder()
    with Fleet(cfg, 3, recorder) as fleet, Producer(Q, cfg) as producer:
        wait_settled(db, 3)
        due_before = sum(w.waiter.wakeups["due"] for w in fleet.workers)
        # When a job is put with a 1.5 s delay
        latency = put_and_time(producer, recorder, 1.5 + MARGIN_S, delay=1.5)
        # Then it starts at its time (+-0.5 s): the watcher woke for its run_at, not a poller
        assert 1.0 <= latency <= 2.0, latency
        assert sum(w.waiter.wakeups["due"] for w in fleet.workers) > due_before


def test_a_paused_queue_is_not_claimed_and_resume_wakes_it_within_a_second(db):
    # Given an idle fleet and a paused queue
    cfg = db.config()
    recorder = Recorder()
    admin = Session(cfg.dsn, name="test-admin")
    questions = Questions(db)
    try:
        with Fleet(cfg, 3, recorder) as fleet, Producer(Q, cfg) as producer:
            wait_settled(db, 3)
            queries.set_paused(admin, Q, True)
            # When a ready job and a soon-due delayed job are put
            now_id = producer.put({"n": 1})
            later_id = producer.put({"n": 2}, delay=0.1)
            before = questions.read()
            put_at = time.monotonic()
            # Then while the watcher keeps looking (its loop turns past the due time) ...
            wait_until(lambda: max(w.last_turn for w in fleet.workers) > put_at + 1.0, 5,
                       message="the watcher to look again after the jobs became due")
            spent = questions.read() - before - 1
            # ... nothing is claimed, and the due job does not make it spin
            assert recorder.count() == 0
            assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status IN (0, 1)") == 2
            assert spent < 60, f"{spent} statements while paused for about a second"
            # When the queue is resumed, both start within a second
            queries.set_paused(admin, Q, False)
            resumed = time.monotonic()
            for job_id in (now_id, later_id):
                assert recorder.wait_for(job_id, 1.0 + MARGIN_S) - resumed <= 1.0
    finally:
        admin.close()
        questions.close()


# ------------------------------------------------------------------ degraded and accelerated modes


def test_polling_fallback_still_delivers_and_status_shows_the_queue_degraded(db):
    # Given consumers told not to use advisory locks
    cfg = db.config(wakeup={"use_locks": False})
    recorder = Recorder()
    with Fleet(cfg, 2, recorder) as fleet, Producer(Q, cfg, ring=True) as producer:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer WHERE wakeup = 'polling'") == 2,
                   10, message="2 polling consumers")
        # When jobs are put (a ringing producer cannot ring without locks either)
        for _ in range(5):
            put_and_time(producer, recorder, cfg.wakeup.poll_max_s + MARGIN_S)
        # Then each is delivered by the pollers, and `notifyq status` says the queue is degraded
        assert all(w.presence.wakeup_mode == "polling" for w in fleet.workers)
        result = run_cli(db.env, "status", "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["wakeup_degraded"] == [Q]
        assert "polling" in run_cli(db.env, "status").stdout


def test_the_servers_1235_refusal_counts_as_locks_unavailable(db):
    # Given the server's own 1235 ER_NOT_SUPPORTED_YET (the code Galera uses to refuse GET_LOCK)
    conn = admin_connect(db.admin, db.admin.database)
    try:
        with pytest.raises(MySQLdb.Error) as caught:
            conn.cursor().execute("SELECT 1 FROM DUAL WHERE 1 IN (SELECT 1 LIMIT 1)")
    finally:
        conn.close()
    # Then mysqlclient raises NotSupportedError, and the wake-up falls back to polling on it
    assert isinstance(caught.value, MySQLdb.NotSupportedError) and caught.value.args[0] == 1235
    assert locks_unavailable(caught.value)


def test_instant_wake_interrupts_the_watchers_wait_for_a_one_shot_producer(db):
    # Given consumers whose watcher sleeps 3 s between reads, and a one-shot producer with
    # wakeup.instant_wake (same database user as the consumers)
    cfg = db.config(wakeup={"poll_initial_s": 3.0, "poll_max_s": 3.0})
    recorder = Recorder()
    rng = random.Random(7)
    with Fleet(cfg, 2, recorder), \
            Producer(Q, db.config(wakeup={"poll_initial_s": 3.0, "poll_max_s": 3.0, "instant_wake": True})) as p:
        wait_settled(db, 2)
        # When jobs are put at random moments of that sleep
        latencies = []
        for _ in range(5):
            time.sleep(rng.uniform(0.05, 0.5))  # the input: where in the sleep the put lands
            latencies.append(put_and_time(p, recorder, 3.0 + MARGIN_S))
    # Then each starts at once instead of about 1.5 s later on average
    assert max(latencies) < 0.5, latencies
    print(f"\ninstant wake pick-up: median={statistics.median(latencies) * 1e3:.1f}ms")


@pytest.mark.parametrize("instant_wake", [True, "auto"])
def test_instant_wake_refuses_to_kill_through_a_proxy_and_says_so_once(db, caplog, instant_wake):
    # Given a watcher waiting on the queue, and an instant_wake producer (true, or the default
    # "auto") whose session the server knows by another id than its handshake gave (as behind
    # ProxySQL, which answers the handshake itself: a KILL by the server's id would reach some
    # other client's session)
    cfg = db.config(wakeup={"instant_wake": instant_wake})
    locks = QueueLocks(db.dsn.database, Q)
    watcher = Session(db.dsn, autocommit=True, name="watcher")
    try:
        assert advisory.get_lock(watcher, locks.watch, 0) == 1
        with Producer(Q, cfg) as p:
            p.put({"n": 0})  # opens its session, and wakes (KILLs) nothing but a watcher
            session = p._session
            kills_before = _com_kill(session)
            session.connection_id += 1_000_000  # the id a proxy's handshake would give
            # When it puts
            with caplog.at_level("WARNING", logger="notifyq.producer"):
                p.put({"n": 1})
                p.put({"n": 2})
            # Then it sends no KILL, says once that instant_wake is off and why, and puts go on
            assert _com_kill(session) == kills_before
            told = [r.getMessage() for r in caplog.records if "instant_wake is off" in r.getMessage()]
            assert len(told) == 1 and "proxy" in told[0]
            assert db.query("SELECT COUNT(*) FROM nq_job WHERE queue = %s", (Q,)) == [(3,)]
    finally:
        watcher.close()


def _com_kill(session: Session) -> int:
    """KILL statements this session has sent, by the server's count."""
    return int(session.run(lambda cur: (cur.execute("SHOW SESSION STATUS LIKE 'Com_kill'"),
                                        cur.fetchone())[1][1], what="count kills"))


# ------------------------------------------------------------------ cost and resilience


@pytest.mark.skipif(SHARED_SERVER, reason="needs a server of its own: Questions counts everyone")
def test_ten_idle_consumers_cost_the_server_about_one_query_per_second(db):
    # Given 10 idle consumers with the production wake-up defaults, the watcher's backoff at its cap
    cfg = db.config(wakeup={"poll_max_s": 1.0, "idle_wait_s": 25.0})
    window_s = 3.0
    questions = Questions(db)
    try:
        with Fleet(cfg, 10, Recorder()):
            # The deadlines and the window add up to less than idle_wait_s: the window ends before
            # the 9 queued consumers renew their GET_LOCK waits, so it sees the fleet's steady cost.
            wait_settled(db, 10, timeout=10)
            wait_until(lambda: (watcher_sleep_s(db) or 0) >= cfg.wakeup.poll_max_s, 5,
                       message="the watcher's backoff at poll_max_s")
            # When the server's Questions counter is read across a short window
            before = questions.read()
            time.sleep(window_s)  # the measurement window itself
            spent = questions.read() - before - 1
    finally:
        questions.close()
    # Then the whole fleet costs about one statement per second (twice that as the bound: noise only
    # delays statements; a consumer polling every 10 ms would spend hundreds). The figure itself:
    # benchmarks/wakeup.py.
    assert spent <= 2 * window_s, f"{spent} statements in {window_s:g} s"


def test_a_lock_session_killed_while_waiting_reconnects_and_still_picks_up_work(db):
    # Given two idle consumers: a watcher and one queued behind it
    cfg = db.config()
    recorder = Recorder()
    with Fleet(cfg, 2, recorder) as fleet, Producer(Q, cfg) as producer:
        wait_settled(db, 2)
        # When root kills both lock sessions (KILL CONNECTION: the queue's watcher session, which
        # holds the liveness lock) in the middle of their waits
        for worker in fleet.workers:
            db.query(f"KILL CONNECTION {int(worker.presence.session.connection_id)}")

        def registered_again(w) -> bool:
            # the liveness lock (taken back, or a new one) is held by the *new* connection
            name = lock_name(db.dsn.database, "c", w.consumer_id)
            live = w.presence.session
            return live.generation > 1 and db.scalar("SELECT IS_USED_LOCK(%s)", (name,)) == live.connection_id

        # Then both reconnect and hold a liveness lock again before claiming anything (a worker
        # queued in GET_LOCK notices when that statement, rerun on the new connection, returns:
        # within idle_wait_s) ...
        wait_until(lambda: all(registered_again(w) for w in fleet.workers), cfg.wakeup.idle_wait_s + 10,
                   message="both workers registered on their new connections")
        wait_settled(db, 2)
        # ... and still pick up work, with no dead registration left behind
        put_and_time(producer, recorder, cfg.wakeup.poll_max_s + MARGIN_S)
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 2, 10,
                   message="dead registrations reaped")
        assert {r[0] for r in db.query("SELECT id FROM nq_consumer")} == {w.consumer_id for w in fleet.workers}


@pytest.mark.skipif(SHARED_SERVER, reason="changes a global variable of the server")
def test_lock_sessions_survive_a_wait_timeout_shorter_than_a_batch(db):
    # Given a server that drops connections idle for 2 s
    saved = db.scalar("SELECT @@GLOBAL.wait_timeout")
    db.query("SET GLOBAL wait_timeout = 2")
    try:
        cfg = db.config()
        recorder = Recorder(linger_s=3.5)  # the handler keeps the lock session idle for 3.5 s
        with Fleet(cfg, 2, recorder) as fleet, Producer(Q, cfg) as producer:
            wait_settled(db, 2)
            ids = {w.consumer_id for w in fleet.workers}
            # When a job runs longer than wait_timeout, and the fleet idles well past it
            job_id = producer.put({"long": True})
            recorder.wait_for(job_id, 5)
            wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0, 10, message="acked")
            # Then no lock session was dropped: same connections, same registrations
            assert [w.presence.session.generation for w in fleet.workers] == [1, 1]
            assert {w.consumer_id for w in fleet.workers} == ids
            assert sum(w.stats.lost_acks for w in fleet.workers) == 0
            put_and_time(producer, recorder, 3.5 + cfg.wakeup.poll_max_s + MARGIN_S)
    finally:
        db.query("SET GLOBAL wait_timeout = %s", (saved,))


def test_a_ringing_producer_whose_lock_session_is_killed_still_delivers_and_rings_again(db):
    # Given idle consumers that read every 2 s without a bell, and an armed bell ringer
    cfg = db.config(wakeup={"poll_initial_s": 2.0, "poll_max_s": 2.0})
    recorder = Recorder()
    with Fleet(cfg, 2, recorder), Producer(Q, cfg, ring=True) as producer:
        wait_settled(db, 2)
        put_and_time(producer, recorder, 2.0 + MARGIN_S)
        wait_until(lambda: watcher_waits_on_the_bell(db), 10, message="the watcher waiting on the bell")
        # When root kills the producer's lock session (the one holding the ringer and the bell)
        db.query(f"KILL CONNECTION {int(producer._waker.session.connection_id)}")
        # Then its next puts are still delivered (found by the watcher's poll) ...
        for _ in range(2):
            put_and_time(producer, recorder, 2.0 + MARGIN_S)
        # ... and once re-armed on a new connection it rings again: pick-up well under the 2 s poll
        wait_settled(db, 2)
        wait_until(lambda: watcher_waits_on_the_bell(db), 10, message="the watcher waiting on the bell again")
        assert producer._waker.session.generation > 1
        assert put_and_time(producer, recorder, 2.0 + MARGIN_S) < 0.5


def test_a_watcher_that_never_hands_on_is_overtaken_after_idle_wait(db):
    # Given a "watcher" that holds the watch lock but is gone for good (a host that vanished
    # without closing its connection looks exactly like this to the server)
    cfg = db.config(wakeup={"idle_wait_s": 1.0})
    ghost = Session(cfg.dsn, autocommit=True)
    assert advisory.get_lock(ghost, QueueLocks(cfg.dsn.database, "ghost").watch, 0) == 1
    ran = []
    service = ConsumerService(cfg, ConsumeOptions(queues=("ghost",), function=lambda job: ran.append(job.id)))
    stop = threading.Event()
    thread = threading.Thread(target=service.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 1, 30, message="consumer up")
        # When a job arrives
        with Producer("ghost", cfg) as p:
            job_id = p.put({"x": 1})
        # Then the queued consumer notices within about idle_wait_s and runs it itself
        wait_until(lambda: ran == [job_id], 10, message="the job run despite the stuck watcher")
    finally:
        stop.set()
        thread.join(30)
        ghost.close()


def _put_on_conn_and_wake(producer: Producer, conn, recorder: Recorder, timeout: float) -> float:
    """put(conn=) on the caller's connection, its COMMIT, then wake(): from the COMMIT to the start."""
    job_id = producer.put({"t": time.monotonic()}, conn=conn)
    conn.commit()
    committed = time.monotonic()
    producer.wake()
    return recorder.wait_for(job_id, timeout) - committed


def test_a_ringers_wake_after_the_callers_commit_rings_in_one_statement_it_does_not_wait_for(db, monkeypatch):
    # Given idle consumers whose watcher waits on an armed ringer's bell (without it the
    # watcher would sleep 5 s between reads), and the caller's own connection
    cfg = db.config(wakeup={"poll_initial_s": 5.0, "poll_max_s": 5.0, "idle_wait_s": 5.0})
    recorder = Recorder()
    conn = MySQLdb.connect(**db.admin.connect_args(), autocommit=False)  # the application's own
    try:
        with Fleet(cfg, 2, recorder) as fleet, Producer(Q, cfg, ring=True) as producer:
            wait_settled(db, 2)
            for _ in range(2):  # the first put takes the bell, the second rings it
                put_and_time(producer, recorder, 5.0 + MARGIN_S)
            bell = producer._waker.bell
            session = producer._waker.session
            waited: list[str] = []
            run = session.run
            monkeypatch.setattr(session, "run", lambda body, *, what, **kw: waited.append(what) or run(body, what=what, **kw))
            for i in range(5):
                wait_settled(db, 2)
                wait_until(lambda: watcher_waits_on_the_bell(db), 10, message="the watcher waiting on the bell")
                rings = bell.rings
                # When a job is put on the caller's connection, committed, and wake() is called
                latency = _put_on_conn_and_wake(producer, conn, recorder, 5.0 + MARGIN_S)
                # Then the watcher is rung at once, by a statement whose reply wake() did not
                # wait for (no look of its own first: a round trip between COMMIT and ring)
                assert latency < MARGIN_S, latency
                assert waited == [], waited
                # And its reply, read before the session's next statement, counts the ring
                session.pipeline.read_reply()
                bell._settle()
                assert bell.rings == rings + 1 and bell.held is not None
            assert sum(w.waiter.wakeups["timeout"] for w in fleet.workers) == 0
        # And with nobody watching, a wake() rings nothing and its reply opens the quiet window
        with Producer(Q, cfg, ring=True) as producer:
            producer.put({"warm-up": True})
            producer.put({"announced": True})
            bell = producer._waker.bell
            held, rings = bell.held, bell.rings
            bell.look.quiet_until = 0.0
            producer.put({"n": 1}, conn=conn)
            conn.commit()
            producer.wake()
            producer._waker.session.pipeline.read_reply()
            bell._settle()
            assert bell.rings == rings and bell.held == held and not bell.look.due()
    finally:
        conn.close()


def test_a_ringers_wake_that_finds_its_bell_gone_lets_go_and_the_next_wake_still_wakes_the_watcher(db):
    # Given idle consumers watching the bell of an armed ringer (without it the watcher would
    # sleep 5 s between reads), whose session then loses its bell behind its back
    cfg = db.config(wakeup={"poll_initial_s": 5.0, "poll_max_s": 5.0, "idle_wait_s": 5.0})
    recorder = Recorder()
    conn = MySQLdb.connect(**db.admin.connect_args(), autocommit=False)
    try:
        with Fleet(cfg, 2, recorder), Producer(Q, cfg, ring=True) as producer:
            wait_settled(db, 2)
            for _ in range(2):  # the first put takes the bell, the second rings it
                put_and_time(producer, recorder, 5.0 + MARGIN_S)
            bell = producer._waker.bell
            wait_until(lambda: watcher_waits_on_the_bell(db), 10, message="the watcher waiting on the bell")
            cur = producer._waker.session.conn.cursor()
            cur.execute("DO RELEASE_LOCK(%s)", (bell.locks.bells[bell.held],))
            cur.close()
            wait_until(lambda: not watcher_waits_on_the_bell(db), 10, message="the watcher asleep, no bell held")
            wait_settled(db, 2)
            # When a wake() after the caller's COMMIT rings from a bell it no longer holds
            job_id = producer.put({"n": 1}, conn=conn)
            conn.commit()
            producer.wake()
            # Then its reply says so and the bell lets go of everything (its session ends) ...
            producer._waker.session.pipeline.read_reply()
            bell._settle()
            assert bell.held is None
            recorder.wait_for(job_id, 5.0 + MARGIN_S)  # (the watcher's poll found that one)
            wait_settled(db, 2)
            # ... and the next wake() wakes the watcher at once, not at its next read 5 s later
            assert _put_on_conn_and_wake(producer, conn, recorder, 5.0 + MARGIN_S) < MARGIN_S
    finally:
        conn.close()
