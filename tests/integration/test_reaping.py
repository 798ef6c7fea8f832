"""The reaper against a real server: a verdict that goes stale mid-pass takes nothing back, and
polling consumers are judged by heartbeat, never by a lock they never held."""

from __future__ import annotations

import logging
import time

import MySQLdb
import MySQLdb.cursors
from conftest import wait_until

from notifyq.consume import reaper
from notifyq.jobs import run_of
from notifyq.produce.producer import Producer
from notifyq.store import advisory, liveness, locks, queries
from notifyq.store.db import Session

DEAD = "d" * 32


class _KillAfterLock(MySQLdb.cursors.Cursor):
    """Runs `after_lock()` once, right after a GET_LOCK on `lock_name` returned."""

    lock_name = ""
    after_lock = None

    def execute(self, query, args=None):
        result = super().execute(query, args)
        if isinstance(args, dict) and args.get("name") == self.lock_name and "GET_LOCK" in str(query):
            hook, type(self).after_lock = type(self).after_lock, None
            if hook is not None:
                hook()
        return result


class _HookedSession(Session):
    def _open(self):
        conn = super()._open()
        conn.cursorclass = _KillAfterLock
        return conn


def _dead_consumer_holding(db, n: int) -> tuple[str, list[int]]:
    """A lock-mode consumer that claimed n jobs and lost its session: (lock name, job ids)."""
    cfg = db.config()
    with Producer("q", cfg) as p:
        p.put_many([{"n": i} for i in range(n)])
    lock_name = locks.consumer_lock(cfg.dsn.database, DEAD)
    lock, work = Session(cfg.dsn, autocommit=True), Session(cfg.dsn)
    assert advisory.get_lock(lock, lock_name, 0) == 1
    liveness.register_consumer(work, DEAD, lock_name, "host", 1, ["q"], "locks")
    claim = queries.claim(work, "q", DEAD, n, 300)
    work.close()
    lock.close()  # its session is gone: its lock is free, it is dead
    wait_until(lambda: db.scalar("SELECT IS_FREE_LOCK(%s)", (lock_name,)) == 1, 10, message="the lock freed")
    return lock_name, [j.id for j in claim.jobs]


def test_a_reaper_whose_session_reconnects_after_taking_a_dead_peers_lock_leaves_the_peer_that_came_back_alone(db):
    # Given a consumer that lost its session while holding 3 jobs
    cfg = db.config()
    lock_name, ids = _dead_consumer_holding(db, 3)
    came_back = Session(cfg.dsn, autocommit=True)
    reaping = _HookedSession(cfg.dsn, name="reaper")

    def reaper_session_drops_and_the_peer_takes_its_lock_back():
        # the reaper just took the dead peer's lock; now its session dies, the lock with it ...
        db.query(f"KILL CONNECTION {int(reaping.connection_id)}")
        wait_until(lambda: db.scalar("SELECT IS_FREE_LOCK(%s)", (lock_name,)) == 1, 10,
                   message="the reaper's hold on the lock gone")
        # ... and the peer reconnects and takes its own lock back (Presence._register(old_id))
        assert advisory.get_lock(came_back, lock_name, 0) == 1

    _KillAfterLock.lock_name = lock_name
    _KillAfterLock.after_lock = reaper_session_drops_and_the_peer_takes_its_lock_back
    try:
        # When a reaper pass runs and its session reconnects right after it took the peer's lock
        result = reaper.reap(reaping, cfg.dsn.database)
        assert _KillAfterLock.after_lock is None, "the hook ran"
        # Then the peer, alive again, keeps its jobs and its registration
        assert result is not None and result.reclaimed == 0 and result.dead_consumers == 0
        rows = db.query("SELECT id, status, owner FROM nq_job ORDER BY id")
        assert rows == [(i, 2, DEAD) for i in ids]
        assert db.scalar("SELECT COUNT(*) FROM nq_consumer WHERE id = %s", (DEAD,)) == 1
    finally:
        reaping.close()
        came_back.close()


def test_a_reaper_takes_back_a_dead_lock_mode_consumers_jobs(db):
    # Given a consumer that lost its session while holding 3 jobs
    cfg = db.config()
    _lock_name, ids = _dead_consumer_holding(db, 3)
    # When a reaper pass runs
    result = reaper.reap_once(cfg.dsn)
    # Then its jobs are ready again and its registration is gone
    assert result is not None and result.reclaimed == 3 and result.dead_consumers == 1
    assert db.query("SELECT id, status, owner FROM nq_job ORDER BY id") == [(i, 0, None) for i in ids]
    assert db.scalar("SELECT COUNT(*) FROM nq_consumer") == 0


def _polling_consumer_holding(db, n: int, consumer_id: str) -> list[int]:
    cfg = db.config()
    with Producer("q", cfg) as p:
        p.put_many([{"n": i} for i in range(n)])
    work = Session(cfg.dsn)
    try:
        liveness.register_consumer(work, consumer_id, locks.consumer_lock(cfg.dsn.database, consumer_id),
                                  "host", 1, ["q"], "polling")
        return [j.id for j in queries.claim(work, "q", consumer_id, n, 300).jobs]
    finally:
        work.close()


def test_a_polling_consumer_with_a_fresh_heartbeat_is_not_reaped_although_its_lock_is_free(db):
    # Given a polling consumer (no liveness lock held) with a fresh heartbeat, holding 2 jobs
    cfg = db.config()
    ids = _polling_consumer_holding(db, 2, "p" * 32)
    # When reaper passes run, with and without advisory locks
    for use_locks in (True, False):
        result = reaper.reap_once(cfg.dsn, use_locks)
        # Then nothing is taken back
        assert result is not None and result.reclaimed == 0 and result.dead_consumers == 0
    assert db.query("SELECT id, status FROM nq_job ORDER BY id") == [(i, 2) for i in ids]
    assert db.scalar("SELECT COUNT(*) FROM nq_consumer") == 1
    # And the reaper's cheap question does not call it dead either
    session = Session(cfg.dsn, autocommit=True)
    assert liveness.reap_needed(session) == 0
    session.close()


def test_a_polling_consumer_whose_heartbeat_stopped_is_reaped_and_a_late_beat_says_so(db):
    # Given a polling consumer holding 2 jobs whose heartbeat is older than POLLING_STALE_S
    cfg = db.config()
    ids = _polling_consumer_holding(db, 2, "s" * 32)
    db.query("UPDATE nq_consumer SET last_seen = NOW(6) - INTERVAL %s SECOND",
             (int(liveness.POLLING_STALE_S) + 1,))
    # When a reaper pass runs (without advisory locks: polling consumers may be all there is)
    result = reaper.reap_once(cfg.dsn, use_locks=False)
    # Then its jobs are ready again and its row is gone
    assert result is not None and result.reclaimed == 2 and result.dead_consumers == 1
    assert db.query("SELECT id, status, owner FROM nq_job ORDER BY id") == [(i, 0, None) for i in ids]
    # And its next heartbeat reports it was judged dead (the worker re-registers)
    session = Session(cfg.dsn)
    assert liveness.heartbeat(session, "s" * 32, "polling") is False
    session.close()


def test_a_heartbeat_says_its_consumer_lives_and_extends_no_lease(db):
    """Issue 26, item 8: the heartbeat extended every job its consumer held, so in polling mode a
    hung handler held its job forever; a lease is its worker's and its handler's to extend."""
    # Given a polling consumer holding 3 jobs whose leases end in 1 s
    cfg = db.config()
    _polling_consumer_holding(db, 3, "h" * 32)
    db.query("UPDATE nq_job SET lease_until = NOW(6) + INTERVAL 1 SECOND")
    db.query("UPDATE nq_consumer SET last_seen = NOW(6) - INTERVAL 10 SECOND")
    # When it beats
    session = Session(cfg.dsn)
    assert liveness.heartbeat(session, "h" * 32, "polling") is True
    session.close()
    # Then its row is fresh and no lease moved
    assert db.scalar("SELECT COUNT(*) FROM nq_consumer WHERE last_seen > NOW(6) - INTERVAL 5 SECOND") == 1
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE lease_until > NOW(6) + INTERVAL 2 SECOND") == 0


def test_a_reaper_just_out_of_an_outage_judges_nobody_by_silence(db):
    """Regression (issue 16): after an outage that silenced every heartbeat (a Galera cluster
    without a primary component, seen in the cluster fault schedule), the first reaper back took
    consumers whose beats had failed like its own for dead, while they were reconnecting."""
    # Given a polling consumer whose heartbeat is older than POLLING_STALE_S
    cfg = db.config()
    ids = _polling_consumer_holding(db, 2, "o" * 32)
    db.query("UPDATE nq_consumer SET last_seen = NOW(6) - INTERVAL %s SECOND",
             (int(liveness.POLLING_STALE_S) + 1,))
    # When a reaper pass runs for a process whose own heartbeat has just come back from a gap
    result = reaper.reap_once(cfg.dsn, use_locks=False, judge_silence=False)
    # Then it takes nothing back
    assert result is not None and result.reclaimed == 0 and result.dead_consumers == 0
    assert db.query("SELECT id, status FROM nq_job ORDER BY id") == [(i, 2) for i in ids]
    # And a pass by a process that was heard steadily does
    result = reaper.reap_once(cfg.dsn, use_locks=False)
    assert result is not None and result.reclaimed == 2 and result.dead_consumers == 1


def test_a_heartbeat_says_how_long_it_has_landed_since_its_last_gap(db):
    from notifyq.consume.heartbeat import Heartbeat

    cfg = db.config()
    _polling_consumer_holding(db, 1, "h" * 32)
    beat = Heartbeat(cfg.dsn, lambda: "h" * 32, name="t", interval_s=0.1)
    try:
        # Given beats that landed with no gap yet: steady for ever (a process just started)
        beat.beat()
        assert beat.steady_s() == float("inf")
        # When no beat lands for longer than its gap (nobody beats here: no thread)
        wait_until(lambda: beat.steady_s() == 0.0, 10, message="the gap to show")
        # Then the next beat that lands starts the count again, from 0
        beat.beat()
        assert 0 < beat.steady_s() < 1.0
    finally:
        beat.stop()


def test_a_beat_more_than_a_second_late_is_a_gap_well_inside_the_galera_grace(db):
    """Regression: a gap took two intervals and a second (11 s with the 5 s beat), more than the
    10 s of silence after which a reaper then took a Galera peer with a free lock for dead. In the
    cluster fault schedule (seed 1) every heartbeat stopped while the cluster had no primary
    component; a second after it came back, a reaper whose own last beat was 10.5 s old still
    counted itself steady and reaped two live consumers reconnecting, its own process one of them."""
    from notifyq.consume.heartbeat import Heartbeat

    cfg = db.config()
    _polling_consumer_holding(db, 1, "g" * 32)
    # Given the beat every consumer on a Galera node runs (every 5 s): a peer whose
    # beats stopped with ours, up to a beat before, is silent for less than the Galera grace
    # while ours is silent for no longer than a gap
    galera_beat = Heartbeat(cfg.dsn, lambda: "g" * 32, name="t")
    galera_beat.stop()  # never started: only its timing is asked
    assert galera_beat.gap_s + galera_beat.interval_s < liveness.GALERA_LOCK_GRACE_S
    # And one beating every second, whose beat landed
    beat = Heartbeat(cfg.dsn, lambda: "g" * 32, name="t", interval_s=1.0)
    try:
        beat.beat()
        landed = time.monotonic()
        # When the next beat is 1.5 s late, two and a half intervals after the last landing
        wait_until(lambda: time.monotonic() - landed > 2.5, 10, message="2.5 s to pass")
        # Then our own heartbeat counts as in a gap: this process judges nobody by silence
        assert beat.steady_s() == 0.0
    finally:
        beat.stop()

def test_a_process_whose_liveness_lock_was_lost_never_reaps_its_own_jobs(db):
    """Regression: in the cluster fault schedule a consumer's liveness session lost its
    connection (its lock free on the server), and a reaper pass the process ran before it had
    taken its lock back found its own consumer dead. Its jobs would have run again while its
    handlers still ran them."""
    import threading

    from notifyq.consume import handlers
    from notifyq.consume.stats import Budget
    from notifyq.consume.worker import Worker

    # Given a lock-mode consumer running a job
    cfg = db.config(consumer={"reap_interval_s": 0.01})
    started, release, stop = threading.Event(), threading.Event(), threading.Event()
    worker = Worker(cfg, "q", handlers.PythonHandler(lambda job: (started.set(), release.wait(60)), False),
                    stop=stop, budget=Budget(None), batch_size=1)
    with Producer("q", cfg) as p:
        [job_id] = p.put_many([{"n": 1}])
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(started.is_set, 20, message="the job running")
        owner = worker.presence.consumer_id
        # When its liveness session's connection dies, which frees its lock on the server
        db.query(f"KILL CONNECTION {int(worker.presence.session.conn.thread_id())}")
        wait_until(lambda: db.scalar("SELECT IS_FREE_LOCK(lock_name) FROM nq_consumer WHERE id = %s",
                                     (owner,)) == 1, 20, message="the liveness lock free")
        # And the process runs a reaper pass before it notices (a reap hint that came on another session)
        worker._reap_soon()
        # Then the job is still its own, claimed and running
        assert db.query("SELECT status, owner FROM nq_job WHERE id = %s", (job_id,)) == [(2, owner)]
        assert db.scalar("SELECT COUNT(*) FROM nq_consumer WHERE id = %s", (owner,)) == 1
    finally:
        release.set()
        stop.set()
        thread.join(30)



def test_a_batchs_lease_is_extended_by_its_claims_lease_after_a_reload_lowers_it(db):
    """Regression (issue 26, item 6): after a SIGHUP lowered lease_s, a batch was paced by its
    claim's lease/3 but extended by the new, shorter lease, and its waiting jobs ran out between
    two extensions while their consumer ran the batch."""
    import dataclasses
    import threading

    from notifyq.consume import handlers
    from notifyq.consume.batch import Batch
    from notifyq.consume.stats import Budget
    from notifyq.consume.worker import Worker

    # Given a worker that claimed two jobs under a 300 s lease
    cfg = db.config()
    worker = Worker(cfg, "q", handlers.PythonHandler(lambda job: None, False), stop=threading.Event(),
                    budget=Budget(None))
    try:
        with Producer("q", cfg) as p:
            p.put_many([{"n": 1}, {"n": 2}])
        owner = worker.presence.ensure_registered(worker)
        claim = queries.claim(worker.work, "q", owner, 2, 300)
        batch = Batch(claim.token, claim.jobs, 300, time.monotonic(), claim.commit, owner=owner)
        # When a reload lowers the queue's lease to 3 s and the batch's lease is pushed out
        worker.qc = dataclasses.replace(worker.qc, lease_s=3)
        worker.make_run(batch, worker.qc, worker.handler).extend()
        # Then it is pushed out by the claim's own lease, which paces its extensions
        left = db.scalar("SELECT MIN(TIMESTAMPDIFF(SECOND, NOW(6), lease_until)) FROM nq_job")
        assert left > 200, left
    finally:
        worker.work.close()
        worker.presence.close()


def test_a_reload_racing_a_claim_leaves_its_batch_the_lease_the_claim_took(db, monkeypatch):
    """Regression: the claim sent the queue's lease, and its batch was built from the lease read
    again after the claim's round trip: a reload in between (the service's thread) paced the
    batch's extensions by a lease its jobs did not hold."""
    import threading

    from notifyq.consume import handlers
    from notifyq.consume import acking as acking_module
    from notifyq.consume.stats import Budget
    from notifyq.consume.worker import Worker

    # Given a worker on a 300 s lease, and a reload to a 3 s lease that lands while its claim is
    # on the wire
    cfg = db.config(defaults={"lease_s": 300})
    seen: list[float] = []
    worker = Worker(cfg, "q", handlers.PythonHandler(lambda job: seen.append(worker.current_run.batch.lease_s),
                                                     False), stop=threading.Event(), budget=Budget(None))
    real_claim = queries.claim

    def claim_then_reload(*args, **kwargs):
        claim = real_claim(*args, **kwargs)
        worker.reload(db.config(defaults={"lease_s": 3}))
        return claim

    monkeypatch.setattr(acking_module.queries, "claim", claim_then_reload)
    try:
        with Producer("q", cfg) as p:
            p.put({"n": 1})
        # When the worker claims and runs the job
        worker.presence.ensure_registered(worker)
        got, _ = worker._claim_and_run()
        # Then its batch tracks the lease the claim took, not the reloaded one
        assert got == 1 and seen == [300]
    finally:
        worker.acks.flush(worker.work)
        worker.work.close()
        worker.presence.close()


def test_a_long_job_that_extends_its_lease_keeps_its_finished_batch_mates_claimed(db):
    """Regression (issue 26's fault schedule, kill_session class): a job's extend_lease() pushed
    out its own lease and the waiting jobs', not those of the batch that had finished before it
    while their ack was still pending (acks go out about once a second, before a job starts).
    Those ran out and ran again on other consumers while the long job went on."""
    import threading

    from notifyq.consume import handlers
    from notifyq.consume.stats import Budget
    from notifyq.consume.worker import Worker

    # Given a batch of a quick job and then a long one that extends its lease (2 s)
    cfg = db.config(defaults={"lease_s": 2})
    long_started, release, stop = threading.Event(), threading.Event(), threading.Event()

    def handle(job) -> None:
        if job.payload["n"] == 2:
            long_started.set()
            while not release.wait(0.3):
                job.extend_lease()

    worker = Worker(cfg, "q", handlers.PythonHandler(handle, False), stop=stop, budget=Budget(None),
                    batch_size=2)
    with Producer("q", cfg) as p:
        quick, _ = p.put_many([{"n": 1}, {"n": 2}])
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(long_started.is_set, 20, message="the long job running")
        # When more than a lease passes while the long job runs
        started = time.monotonic()
        wait_until(lambda: time.monotonic() - started > 3, 10, message="a lease and a half")
        # Then no lease of the batch ran out: a reaper pass takes nothing back, and the quick job
        # is still the worker's, its ack pending
        result = reaper.reap_once(cfg.dsn)
        assert result is not None and result.expired == 0
        assert db.query("SELECT status FROM nq_job WHERE id = %s", (quick,)) == [(2,)]
    finally:
        release.set()
        stop.set()
        thread.join(30)
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0


def test_a_touch_on_a_session_that_does_not_hold_the_consumers_lock_leaves_its_last_seen_alone(db):
    """A lock-mode consumer's last_seen says, after a server restart, that it took its lock back
    on the new server (liveness.restart_started_s): a touch rerun on a reconnected session, before
    the lock is taken back, must not say so."""
    # Given a lock-mode consumer registered by the session holding its lock, an hour ago
    cfg = db.config()
    consumer_id = "t" * 32
    lock_name = locks.consumer_lock(cfg.dsn.database, consumer_id)
    home, reconnected = Session(cfg.dsn, autocommit=True), Session(cfg.dsn, autocommit=True)
    try:
        assert advisory.get_lock(home, lock_name, 0) == 1
        liveness.register_consumer(home, consumer_id, lock_name, "host", 1, ["q"], "locks")
        db.query("UPDATE nq_consumer SET last_seen = last_seen - INTERVAL 1 HOUR WHERE id = %s", (consumer_id,))

        def last_seen():
            return db.scalar("SELECT last_seen FROM nq_consumer WHERE id = %s", (consumer_id,))

        before = last_seen()
        # When a session that does not hold the lock touches the row
        liveness.touch_consumer(reconnected, consumer_id, "locks")
        # Then its last_seen stays as it was
        assert last_seen() == before
        # And a touch by the session holding the lock refreshes it
        liveness.touch_consumer(home, consumer_id, "locks")
        assert last_seen() > before
    finally:
        reconnected.close()
        home.close()


def test_a_worker_whose_liveness_session_was_killed_starts_no_job_a_reaper_took_back_meanwhile(db):
    """Regression (the fault schedule's long run, stale_start): a consumer's idle liveness
    session was KILLed while its one worker ran the first job of a batch; a peer's reaper took
    the batch back within its reap interval and another consumer ran the second job; the worker
    then started that job too: it judged itself alive from the lock seen held a moment before."""
    import threading

    from notifyq.consume import handlers
    from notifyq.consume.stats import Budget
    from notifyq.consume.worker import Worker

    # Given a lock-mode consumer with a claim of two jobs, running the first
    cfg = db.config(consumer={"reap_interval_s": 3600})
    started, release, stop = [], threading.Event(), threading.Event()
    first_running = threading.Event()

    def handle(job):
        started.append((job.id, run_of(job)._completion.token))  # (the claim it runs under)
        first_running.set()
        release.wait(60)

    worker = Worker(cfg, "q", handlers.PythonHandler(handle, False), stop=stop, budget=Budget(None), batch_size=2)
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": 1}, {"n": 2}])
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(first_running.is_set, 20, message="the first job running")
        owner = worker.presence.consumer_id
        # (waited for: a claim's first job starts while its COMMIT is still on the wire)
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE owner = %s AND status = 2", (owner,)) == 2,
                   10, message="both jobs claimed")
        # When its idle liveness session is KILLed, and a peer's reaper takes its claims back
        db.query(f"KILL CONNECTION {int(worker.presence.session.conn.thread_id())}")
        wait_until(lambda: db.scalar("SELECT IS_FREE_LOCK(lock_name) FROM nq_consumer WHERE id = %s",
                                     (owner,)) == 1, 20, message="the liveness lock free")
        result = reaper.reap_once(cfg.dsn)
        assert result is not None and db.scalar("SELECT COUNT(*) FROM nq_job WHERE owner = %s", (owner,)) == 0
        # And the first job's handler returns
        release.set()
        # Then the worker starts neither job again under the claim taken back: both run again
        # under a new claim (its own next one), once each
        wait_until(lambda: len(started) >= 3, 20, message="both jobs run again")
        first_token = started[0][1]
        assert started[0][0] == ids[0] and sorted(j for j, _ in started[1:]) == sorted(ids), started
        assert all(token != first_token for _, token in started[1:]), started
    finally:
        release.set()
        stop.set()
        thread.join(30)


def test_a_reaper_lock_held_by_a_stalled_pass_stops_the_other_passes_only_for_a_while(db):
    """Regression (the fault schedule's long run, stranded): processes SIGSTOPped in the middle of
    a pass held the reaper lock one after another (each for less than the pass session's idle
    timeout), and a dead consumer's jobs stayed claimed for 22 s: every other pass found the
    lock taken and did nothing."""
    # Given a dead consumer's claimed jobs, and the reaper lock held by a session that answers
    # nothing more (a stalled process's pass)
    cfg = db.config()
    _, ids = _dead_consumer_holding(db, 3)
    stalled = Session(cfg.dsn, autocommit=True)
    assert advisory.get_lock(stalled, locks.reaper_lock(cfg.dsn.database), 0) == 1
    try:
        # When another process runs its passes, one after another
        seen = reaper.HeldLock()
        first = reaper.reap_once(cfg.dsn, held=seen)
        # Then the first finds the lock taken and does nothing (a pass may be under way), but
        # once the same session has held it for a while, a pass goes on without it
        assert first is None
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE owner = %s", (DEAD,)) == 3
        results = []
        wait_until(lambda: results.append(reaper.reap_once(cfg.dsn, held=seen)) or results[-1] is not None,
                   10, message="a pass despite the stalled holder")
        assert results[-1].reclaimed == 3
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE owner = %s", (DEAD,)) == 0
        assert db.scalar("SELECT IS_USED_LOCK(%s)", (locks.reaper_lock(cfg.dsn.database),)) == stalled.connection_id
    finally:
        stalled.close()


def _claimed(db, queue: str, owner: str, n: int, lease_s: float) -> list[int]:
    """n jobs put on `queue` and claimed by `owner` with a lease of lease_s: their ids."""
    cfg = db.config()
    with Producer(queue, cfg) as p:
        p.put_many([{"n": i} for i in range(n)])
    work = Session(cfg.dsn)
    try:
        return [j.id for j in queries.claim(work, queue, owner, n, lease_s).jobs]
    finally:
        work.close()


def _claimed_rows_held_open(db, owner: str, n: int, lease_s: float) -> tuple[list[int], MySQLdb.Connection]:
    """n jobs claimed by `owner`, their rows locked by a transaction left open: a consumer
    stopped (SIGSTOP, a paused VM) in the middle of its ack. (connection, job ids)"""
    cfg = db.config()
    ids = _claimed(db, "other", owner, n, lease_s)
    conn = MySQLdb.connect(**cfg.dsn.connect_args())
    cur = conn.cursor()
    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    cur.execute("BEGIN")
    cur.execute("SELECT id FROM nq_job FORCE INDEX (PRIMARY) WHERE id IN (%s) FOR UPDATE" % ",".join(map(str, ids)))
    return ids, conn


def _pass_within(cfg, seconds: float) -> reaper.ReapResult:
    """One reaper pass, which must end well inside innodb_lock_wait_timeout (10 s)."""
    start = time.monotonic()
    result = reaper.reap_once(cfg.dsn)
    assert time.monotonic() - start < seconds, "the pass waited on a row another transaction holds"
    return result


def test_a_dead_consumers_jobs_come_back_while_a_peer_is_stopped_in_the_middle_of_an_ack(db):
    """Regression (issue 35, seed 8, stranded): a reaper's read of a dead consumer's claims walked
    the whole claimed range with FOR UPDATE, and waited (up to the lock wait timeout, again on
    every retry) on the rows of a live consumer stopped with its ack's transaction open."""
    # Given a dead consumer's 3 claimed jobs, and a live one's 2, their rows held by its open ack
    cfg = db.config()
    _, ids = _dead_consumer_holding(db, 3)
    held, stalled = _claimed_rows_held_open(db, "e" * 32, 2, 300)
    try:
        # When a reaper pass runs
        result = _pass_within(cfg, 5.0)
        # Then the dead consumer's jobs are back at once, the stalled one's left to their lease
        assert result.reclaimed == 3
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE owner = %s", (DEAD,)) == 0
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2 AND owner = %s", ("e" * 32,)) == 2
    finally:
        stalled.close()


def test_a_consumers_exit_neither_waits_on_nor_deadlocks_with_a_peers_ack_under_way(db):
    """Regression (the fault schedule's signal_gap and key_lock classes: run_twice): a consumer's
    exit unregistered with a DELETE whose subquery read the claimed range of ix_state, which
    took a shared lock on each claimed row it passed, every consumer's. It waited on a peer's
    ack under way (here: rows held by its open transaction), and once that ack went on to the
    index entries the exit had read-locked, InnoDB rolled one of them back as a deadlock: the ack,
    past its lease, and its jobs ran again."""
    # Given a registered consumer with no claim left, and a peer's claimed rows held by its ack
    cfg = db.config()
    exiting = _live_consumer(db, "d" * 32, "q")
    held, ack = _claimed_rows_held_open(db, "e" * 32, 2, 300)
    try:
        # When the consumer exits and unregisters
        start = time.monotonic()
        session = Session(cfg.dsn, name="exit", retry_s=5)
        try:
            gone = liveness.unregister_unclaiming(session, "d" * 32)
        finally:
            session.close()
        # Then its row went at once, not after the ack's transaction
        assert time.monotonic() - start < 3.0, "the exit waited on the peer's ack"
        assert gone and db.scalar("SELECT COUNT(*) FROM nq_consumer WHERE id = %s", ("d" * 32,)) == 0
        # And the ack goes on: it deletes its rows and commits, no deadlock
        cur = ack.cursor()
        cur.execute("DELETE FROM nq_job WHERE id IN (%s)" % ",".join(map(str, held)))
        ack.commit()
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE id IN (%s)" % ",".join(map(str, held))) == 0
    finally:
        ack.close()
        exiting.close()


def _live_consumer(db, consumer_id: str, queue: str) -> Session:
    """A registered lock-mode consumer whose liveness lock is held (by the returned session)."""
    cfg = db.config()
    lock_name = locks.consumer_lock(cfg.dsn.database, consumer_id)
    lock = Session(cfg.dsn, autocommit=True)
    assert advisory.get_lock(lock, lock_name, 0) == 1
    liveness.register_consumer(lock, consumer_id, lock_name, "host", 1, [queue], "locks")
    return lock


def test_expired_leases_come_back_while_another_expired_claim_is_held_by_an_open_transaction(db, caplog):
    """Regression (issue 35, seed 8, stranded): the expired-lease read locked every expired row
    of the owners it found, and waited on one a stopped consumer's open transaction held: every
    other expired claim stayed claimed until that transaction ended. Its rows are skipped now,
    and the whole of their claim with them (a claim's rows come back together)."""
    # Given two live consumers' claims whose leases have run out, one held by an open transaction
    cfg = db.config()
    alive = [_live_consumer(db, "e" * 32, "other"), _live_consumer(db, "f" * 32, "q")]
    held, stalled = _claimed_rows_held_open(db, "e" * 32, 2, 0.2)
    mine = _claimed(db, "q", "f" * 32, 3, 0.2)
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2 AND sort_at < NOW(6)") == 5,
                   10, message="the leases ran out")
        # When a reaper pass runs
        with caplog.at_level(logging.WARNING, logger="notifyq.reaper"):
            result = _pass_within(cfg, 5.0)
        # Then the free claim is back whole, the held one left for a later pass
        assert (result.reclaimed, result.expired) == (0, 3)
        # (and its line names them and their owner: the fault checker reads it)
        assert [r.getMessage() for r in caplog.records if "leases expired" in r.getMessage()] == [
            f"leases expired, jobs returned jobs=3 from={'f' * 32}:{','.join(map(str, sorted(mine)))}"]
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 0 AND id IN (%s)"
                         % ",".join(map(str, mine))) == 3
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2 AND owner = %s", ("e" * 32,)) == 2
    finally:
        stalled.close()
    # And once its transaction ends, the next pass takes it back too
    assert reaper.reap_once(cfg.dsn).expired == 2
    for session in alive:
        session.close()


def test_a_dead_consumers_claim_with_a_row_held_elsewhere_comes_back_whole_at_a_later_pass(db):
    """A row of a dead consumer's claim that another transaction holds is skipped, never waited
    for; the rest of that claim stays with it (taken back alone, a job would be charged), and so
    does the consumer's registration: the next pass judges it again and takes the claim back whole."""
    # Given a dead consumer's claim of 3 jobs, one of its rows held by an open transaction
    cfg = db.config()
    _, ids = _dead_consumer_holding(db, 3)
    conn = MySQLdb.connect(**cfg.dsn.connect_args())
    cur = conn.cursor()
    cur.execute("BEGIN")
    cur.execute("SELECT id FROM nq_job FORCE INDEX (PRIMARY) WHERE id = %s FOR UPDATE", (ids[0],))
    try:
        # When a reaper pass runs
        result = _pass_within(cfg, 5.0)
        # Then nothing of that claim comes back yet, and the consumer stays registered
        assert result.reclaimed == 0
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2 AND owner = %s", (DEAD,)) == 3
        assert db.scalar("SELECT COUNT(*) FROM nq_consumer WHERE id = %s", (DEAD,)) == 1
    finally:
        conn.close()
    # And the pass after the transaction ended takes the claim back whole, uncharged
    assert reaper.reap_once(cfg.dsn).reclaimed == 3
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 0 AND attempts = 0 AND id IN (%s)"
                     % ",".join(map(str, ids))) == 3
    assert db.scalar("SELECT COUNT(*) FROM nq_consumer WHERE id = %s", (DEAD,)) == 0


def test_the_expired_leases_of_a_consumer_asked_to_stop_come_back_uncharged(db):
    """Regression (the fault schedule's grace_restart episode): a consumer in its shutdown grace
    whose give-back met the server restarting exited with a job still claimed (its registration
    left, saying it was stopping); a reaper in the restart's grace did not judge it, its lease ran
    out, and the lease's path charged the job. docs/deploys.md promises it back uncharged."""
    # Given a registered consumer asked to stop, whose claim of one job (alone: a crash's is
    # charged) has run out its lease
    cfg = db.config()
    alive = _live_consumer(db, "f" * 32, "q")
    liveness.mark_stopping(alive, "f" * 32)
    mine = _claimed(db, "q", "f" * 32, 1, 0.2)
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2 AND sort_at < NOW(6)") == 1,
                   10, message="the lease ran out")
        # When a reaper pass takes them back by their lease
        assert reaper.reap_once(cfg.dsn).expired == 1
        # Then it is ready again with its attempt undone, recorded as interrupted
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 0 AND attempts = 0 AND id IN (%s)"
                         % ",".join(map(str, mine))) == 1
        assert db.scalar("SELECT COUNT(*) FROM nq_attempt WHERE outcome = 'interrupted' AND job_id IN (%s)"
                         % ",".join(map(str, mine))) == 1
    finally:
        alive.close()


def test_a_dead_consumers_jobs_come_back_while_producers_are_stopped_inside_their_transactions(db, monkeypatch):
    """Regression (an outside attack on "a pass never waits on a row lock"): producers stopped
    inside `producer.transaction()` after a put hold the counter slots their puts bumped, and a
    reaper's take-back bumped a random slot: on a held one it waited the lock wait timeout, on
    every retry, with the dead consumer's jobs. It bumps a slot nobody holds now."""
    from notifyq.store import signal

    # Given a dead consumer's jobs, and every slot of the queue's counter but one held by open
    # transactions (stopped producers'); the random slot a bump would take is a held one
    cfg = db.config()
    _, ids = _dead_consumer_holding(db, 3)
    for slot in range(signal.SIGNAL_SLOTS):
        db.query("INSERT IGNORE INTO nq_signal (queue, slot, seq) VALUES ('q', %s, 0)", (slot,))
    conn = MySQLdb.connect(**cfg.dsn.connect_args())
    cur = conn.cursor()
    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")  # as a producer's session
    cur.execute("BEGIN")
    for slot in range(signal.SIGNAL_SLOTS):
        if slot != 7:  # the bump each stopped producer's put made
            cur.execute("INSERT INTO nq_signal (queue, slot, seq) VALUES ('q', %s, 1) "
                        "ON DUPLICATE KEY UPDATE seq = seq + 1", (slot,))
    monkeypatch.setattr(signal, "slot", lambda: 3)
    try:
        # When a reaper pass runs
        result = _pass_within(cfg, 5.0)
        # Then the jobs are back at once, and the free slot counted them
        assert result.reclaimed == 3
        assert db.scalar("SELECT seq FROM nq_signal WHERE queue = 'q' AND slot = 7") >= 3
    finally:
        conn.close()
