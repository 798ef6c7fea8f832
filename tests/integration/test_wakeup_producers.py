"""Several long-lived producers on one queue (a web app's worker processes): only one holds the
queue's bell, and by default the others interrupt the watcher's wait (wakeup.instant_wake =
"auto", notifyq/wakeup/waker.py, InstantWake) where the server lets them: same database user, no proxy."""

from __future__ import annotations

import dataclasses
import random
import time
import uuid

import pytest
from conftest import RUNTIME_PASSWORD, admin_connect, wait_until
from test_wakeup import (MARGIN_S, Q, Fleet, Recorder, _com_kill, put_and_time, wait_settled,
                         watcher_waits_on_the_bell)

from notifyq.produce.producer import Producer
from notifyq.store import advisory, schema
from notifyq.store.db import Session
from notifyq.store.locks import QueueLocks

LONG_POLL_S = 5.0  # the consumers' poll: every pick-up the tests want is far below it


@pytest.fixture
def other_user(db):
    """A second least-privilege database user with the same grants as the consumers' one: it may
    put jobs, but not KILL the consumers' statements (no CONNECTION ADMIN)."""
    name = f"nq_o_{uuid.uuid4().hex[:8]}"
    conn = admin_connect(db.admin)
    cur = conn.cursor()
    for host in ("%", "localhost"):
        cur.execute(f"CREATE USER '{name}'@'{host.replace('%', '%%')}' IDENTIFIED BY %s", (RUNTIME_PASSWORD,))
        for grant in schema.grants(db.admin.database, f"'{name}'@'{host}'"):
            cur.execute(grant)
    try:
        yield name
    finally:
        for host in ("%", "localhost"):
            cur.execute(f"DROP USER IF EXISTS '{name}'@'{host}'")
        conn.close()


def as_user(cfg, user: str):
    return dataclasses.replace(cfg, dsn=dataclasses.replace(cfg.dsn, user=user))


def test_a_second_ringing_producers_jobs_start_far_before_the_poll_with_the_default_settings(db):
    # Given idle consumers that poll only every 5 s, a ringing producer that holds the queue's
    # bell, and a second ringing producer (another web worker process), both with the defaults
    # (wakeup.instant_wake is not set)
    cfg = db.config(wakeup={"poll_initial_s": LONG_POLL_S, "poll_max_s": LONG_POLL_S})
    recorder = Recorder()
    rng = random.Random(5)
    with Fleet(cfg, 2, recorder) as fleet, Producer(Q, cfg, ring=True) as first, \
            Producer(Q, cfg, ring=True) as second:
        first.put({"warm-up": True})  # arms: it holds the bell from now on
        assert first._waker.bell is not None and first._waker.bell.held is not None
        wait_settled(db, 2)
        # When the second puts jobs at random moments of the watcher's wait
        latencies = []
        for _ in range(6):
            time.sleep(rng.uniform(0.05, 0.5))  # the input: where in the watcher's wait the put lands
            latencies.append(put_and_time(second, recorder, LONG_POLL_S + MARGIN_S))
            wait_settled(db, 2)
        # Then each starts far sooner than the poll would find it: the second producer interrupted
        # the watcher's wait, and no watcher ran out its wait to find a job
        assert max(latencies) < LONG_POLL_S / 5, latencies
        assert second._waker.bell is not None and second._waker.bell.held is None  # one bell per queue and server
        assert second._waker.instant is not None and second._waker.instant.kills >= 1
        assert sum(w.waiter.wakeups["timeout"] for w in fleet.workers) == 0


@pytest.mark.parametrize("ring", [False, True])
def test_a_producer_of_another_database_user_stops_interrupting_after_the_first_refusal_and_says_so_once(
        db, other_user, caplog, ring):
    # Given a watcher (the consumers' user) holding the queue's watch lock, and a producer with
    # the default settings logged in as another database user, which may not KILL its statements
    cfg = db.config()
    locks = QueueLocks(db.dsn.database, Q)
    watcher = Session(cfg.dsn, autocommit=True, name="watcher")
    other = as_user(cfg, other_user)
    try:
        assert advisory.get_lock(watcher, locks.watch, 0) == 1
        with Producer(Q, other, ring=ring) as bell_holder, Producer(Q, other, ring=ring) as p:
            if ring:
                bell_holder.put({"arms": True})  # the bell is taken: `p` is a second ringing producer
                # (a new ringer's first put wakes by the instant wake too: refused, and said, once)
                assert bell_holder._waker.instant is not None and bell_holder._waker.instant.off == "refused"
                caplog.clear()
            # When it puts, again and again
            with caplog.at_level("WARNING", logger="notifyq.producer"):
                for i in range(4):
                    p.put({"n": i})
            # Then its first put was refused, it tried no more, and it said once what to set
            interrupter = p._waker.instant
            assert interrupter is not None and interrupter.refusals == 1 and interrupter.off == "refused"
            assert interrupter.look.taken == 1  # later puts commit as plain ones: no look, no KILL
            told = [r.getMessage() for r in caplog.records if "instant_wake is off" in r.getMessage()]
            assert len(told) == 1, told
            assert "database user" in told[0] and "wakeup.instant_wake" in told[0]
            assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = %s", (Q,)) == 4 + ring
    finally:
        watcher.close()


def test_instant_wake_true_keeps_trying_after_a_refusal_and_says_so_once(db, other_user, caplog):
    # Given a watcher, and a producer of another database user with wakeup.instant_wake = true
    cfg = db.config(wakeup={"instant_wake": True})
    locks = QueueLocks(db.dsn.database, Q)
    watcher = Session(cfg.dsn, autocommit=True, name="watcher")
    try:
        assert advisory.get_lock(watcher, locks.watch, 0) == 1
        with Producer(Q, as_user(cfg, other_user)) as p, \
                caplog.at_level("WARNING", logger="notifyq.producer"):
            # When it puts three times
            for i in range(3):
                p.put({"n": i})
            # Then it tried each time, as true always meant, and said once that it was refused
            assert p._waker.instant.refusals == 3 and p._waker.instant.off is None
            told = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
            assert len(told) == 1 and "keeps trying" in told[0]
    finally:
        watcher.close()


@pytest.mark.parametrize("why", ["proxy", "refused"])
def test_a_wake_after_the_callers_commit_sends_no_kill_through_a_proxy_and_stops_after_a_refusal(db, other_user, why):
    # Given a watcher (the consumers' user) holding the queue's watch lock, and a producer with
    # the default settings whose wake() after the caller's COMMIT is its instant wake: behind a
    # proxy (the server knows its session by another id than the handshake gave), or logged in
    # as another database user, which may not KILL the watcher's statements
    cfg = db.config()
    locks = QueueLocks(db.dsn.database, Q)
    watcher = Session(cfg.dsn, autocommit=True, name="watcher")
    conn = admin_connect(db.admin, db.admin.database)  # the application's own
    try:
        assert advisory.get_lock(watcher, locks.watch, 0) == 1
        with Producer(Q, cfg if why == "proxy" else as_user(cfg, other_user)) as p:
            p.put({"n": 0}, conn=conn)
            conn.commit()
            session = p._waker._session()
            if why == "proxy":
                session.conn  # connected: the handshake's id is known
                session.connection_id += 1_000_000  # the id a proxy's handshake would give
            # When it wakes after the caller's COMMIT, twice
            for i in range(2):
                p.wake()
            # Then it sent no KILL behind the proxy, the other user's was refused once, and both
            # stopped trying for the producer's life
            instant = p._waker.instant
            assert instant.off == why and instant.kills == 0 and instant.look.taken == 1
            assert instant.refusals == (why == "refused")
            if why == "proxy":
                assert _com_kill(session) == 0
    finally:
        conn.close()
        watcher.close()


def test_instant_wake_false_never_interrupts(db):
    # Given a watcher, and a producer with wakeup.instant_wake = false
    cfg = db.config(wakeup={"instant_wake": False})
    locks = QueueLocks(db.dsn.database, Q)
    watcher = Session(cfg.dsn, autocommit=True, name="watcher")
    try:
        assert advisory.get_lock(watcher, locks.watch, 0) == 1
        with Producer(Q, cfg) as p:
            # When it puts
            p.put({"n": 0})
            p.put({"n": 1})
            # Then it sends no KILL and opens no second connection
            assert _com_kill(p._session) == 0
            assert p._waker.instant is None and p._waker.session is None
    finally:
        watcher.close()


def test_with_nobody_watching_a_put_sends_no_kill_and_opens_no_second_connection(db):
    # Given no consumer at all, and a producer with the default settings
    cfg = db.config()
    with Producer(Q, cfg) as p:
        # When it puts
        for i in range(3):
            p.put({"n": i})
        # Then its COMMITs looked (in their own round trips) and saw nobody: no KILL, one session
        assert p._waker.instant is not None and p._waker.instant.look.taken >= 1 and p._waker.instant.kills == 0
        assert _com_kill(p._session) == 0
        assert p._waker.session is None


def test_the_producer_that_holds_the_bell_rings_it_once_its_first_put_woke_the_watcher(db):
    # Given idle consumers and a ringing producer that holds the queue's bell, default settings;
    # its first put woke the watcher with the instant wake (asleep while no ringer held a bell,
    # it waits on the bell only from its next read on)
    cfg = db.config(wakeup={"poll_initial_s": LONG_POLL_S, "poll_max_s": LONG_POLL_S})
    recorder = Recorder()
    with Fleet(cfg, 2, recorder), Producer(Q, cfg, ring=True) as p:
        wait_settled(db, 2)
        p.put({"warm-up": True})
        assert p._waker.bell is not None and p._waker.bell.held is not None
        looks, kills = p._waker.instant.look.taken, _com_kill(p._session)
        assert looks == 1 and kills <= 1
        wait_settled(db, 2)
        # When it puts
        for _ in range(4):
            # (the watcher in its wait on the bell, the state each put starts from: under load
            # the last hand-off may not have let the watch lock go yet, and a ring then finds
            # nobody to ring: a flaky 3 rings of 4)
            wait_until(lambda: watcher_waits_on_the_bell(db), 10, message="the watcher waiting on the bell")
            assert put_and_time(p, recorder, LONG_POLL_S + MARGIN_S) < LONG_POLL_S / 5
            wait_settled(db, 2)
        # Then it rang, and looked for a watcher to KILL nor sent a KILL no more
        assert p._waker.bell.rings >= 4
        assert p._waker.instant.look.taken == looks
        assert _com_kill(p._session) == kills and _com_kill(p._waker.session) == 0


def test_a_second_producers_interrupts_leave_the_ringers_bell_with_it(db):
    # Given idle consumers waiting on the bell of a ringing producer, and a second producer
    cfg = db.config(wakeup={"poll_initial_s": LONG_POLL_S, "poll_max_s": LONG_POLL_S})
    recorder = Recorder()
    with Fleet(cfg, 2, recorder), Producer(Q, cfg, ring=True) as first, Producer(Q, cfg) as second:
        first.put({"warm-up": True})
        bell = first._waker.bell
        generation = first._waker.session.generation
        wait_settled(db, 2)
        # When the second interrupts the watcher's wait, put after put, and then the first puts
        for _ in range(10):
            put_and_time(second, recorder, LONG_POLL_S + MARGIN_S)
            wait_settled(db, 2)
        rings = bell.rings
        for _ in range(3):
            # (settled is not enough: the last watcher's hand-off, sent without waiting, may not
            # have let the watch lock go yet; a look in that gap sees nobody watching, and rings
            # nobody. The watcher in its wait on the bell is the state each put starts from.)
            wait_until(lambda: watcher_waits_on_the_bell(db), 10, message="the watcher waiting on the bell")
            assert put_and_time(first, recorder, LONG_POLL_S + MARGIN_S) < LONG_POLL_S / 5
            wait_settled(db, 2)
        # Then the first still holds the bell on its first connection, and rang each time
        assert first._waker.session.generation == generation and bell.held is not None
        assert bell.rings == rings + 3
        assert second._waker.instant.kills >= 5


def test_an_asyncio_producers_other_sessions_leave_the_wake_up_to_the_first(db):
    import asyncio

    from notifyq.produce.aio import AsyncProducer

    # Given idle consumers that poll only every 5 s, and an asyncio producer of two sessions
    # with the ring (the default), whose puts one at a time go through the second session
    cfg = db.config(wakeup={"poll_initial_s": LONG_POLL_S, "poll_max_s": LONG_POLL_S})
    recorder = Recorder()

    async def main() -> list[float]:
        async with AsyncProducer(Q, cfg, sessions=2) as producer:
            first, second = producer._producers
            latencies = []
            for n in range(4):  # When it puts jobs one at a time
                put_at = time.monotonic()
                job_id = await producer.put({"n": n})
                started = await asyncio.to_thread(recorder.wait_for, job_id, LONG_POLL_S + MARGIN_S)
                latencies.append(started - put_at)
                await asyncio.to_thread(wait_settled, db, 2)
            # Then the second session put them, woke nobody itself (no bell, no look, no KILL:
            # its Waker left the wake-up to the first's), and the first rang for them
            assert second._session is not None and first._session is None
            assert second._waker.bell is None and second._waker.instant is None
            assert first._waker.bell is not None and first._waker.bell.rings >= 2
            return latencies

    with Fleet(cfg, 2, recorder):
        wait_settled(db, 2)
        latencies = asyncio.run(main())
    # and each job started far sooner than the poll would have found it
    assert max(latencies) < LONG_POLL_S / 5, latencies
