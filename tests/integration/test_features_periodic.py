"""Periodic jobs and retention: the scheduler against a real server.

Most tests drive Scheduler.tick() with a hand-set clock (minutely crons, no waiting); the last
one runs two real `notifyq consume` processes on a per-second cron."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import threading
import time

import pytest
from conftest import REPO, notifyq_cmd, wait_until

from notifyq import errors
from notifyq.consume import periodic
from notifyq.jobs import Status
from notifyq.ops import admin
from notifyq.produce.producer import Producer

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 5, 12, 0, 30, tzinfo=UTC)


class ClockedScheduler(periodic.Scheduler):
    """The real scheduler with the server clock replaced by `now`, which the test moves."""

    def __init__(self, *args, now: dt.datetime = T0, **kw):
        self.now = now
        super().__init__(*args, leader_retry_s=0.0, retention_first_s=0.0, **kw)

    def _server_clock(self) -> float:
        return self.now.timestamp()

    def _server_now(self) -> dt.datetime:
        return self.now


def cron_config(db, cron: str = "* * * * *", **overrides):
    return db.config(queue={"cron": {"periodic": [{"cron": cron, "name": "report",
                                                   "payload": {"kind": "report"}}]}}, **overrides)


def jobs(db) -> list[tuple[str, str]]:
    """(tick, periodic name) of every job, in id order."""
    rows = db.query("SELECT payload FROM nq_job WHERE queue = 'cron' ORDER BY id")
    return [(p["tick"], p["periodic"]) for p in (json.loads(r[0]) for r in rows)]


def test_first_sight_is_a_baseline_then_every_tick_is_enqueued_once_with_its_time(db):
    sched = ClockedScheduler(cron_config(db), ("cron",))
    try:
        # Given an entry seen for the first time at 12:00:30
        sched.tick()
        # Then nothing is enqueued for 12:00 (the entry did not exist then), but it is recorded
        assert jobs(db) == []
        assert db.scalar("SELECT last_tick FROM nq_periodic") == dt.datetime(2026, 1, 5, 12, 0)
        # When the clock passes 12:01, ticking many times
        sched.now = T0.replace(minute=1, second=2)
        for _ in range(5):
            sched.tick()
        # Then 12:01 is enqueued once, the tick time and entry name in its payload
        assert jobs(db) == [("2026-01-05T12:01:00+00:00", "report")]
        payload = json.loads(db.scalar("SELECT payload FROM nq_job"))
        assert payload["kind"] == "report"
    finally:
        sched.close()


def test_after_downtime_only_the_most_recent_missed_tick_is_enqueued(db):
    sched = ClockedScheduler(cron_config(db), ("cron",))
    try:
        sched.tick()  # baseline 12:00
        # When the scheduler comes back at 12:07:10, seven ticks later
        sched.now = T0.replace(minute=7, second=10)
        sched.tick()
        # Then one job, for 12:07; 12:01 .. 12:06 are skipped and counted, not replayed
        assert jobs(db) == [("2026-01-05T12:07:00+00:00", "report")]
        assert sched.figures()["cron"] == {"leader": True, "enqueued": 1, "skipped": 6, "purged": 0}
    finally:
        sched.close()


def test_one_leader_per_queue_and_a_takeover_never_repeats_a_tick(db):
    # Given two consumer hosts' schedulers on the same config and clock
    cfg = cron_config(db)
    a, b = ClockedScheduler(cfg, ("cron",)), ClockedScheduler(cfg, ("cron",))
    try:
        a.tick()
        b.tick()
        assert a.figures()["cron"]["leader"] and not b.figures()["cron"]["leader"]
        # When ten minutes pass with both ticking
        for minute in range(1, 11):
            a.now = b.now = T0.replace(minute=minute)
            b.tick()
            a.tick()
        # Then the leader enqueued each tick once
        assert [t for t, _ in jobs(db)] == [f"2026-01-05T12:{m:02d}:00+00:00" for m in range(1, 11)]
        # When the leader dies (its session goes) in the middle of minute 10
        a.close()
        # (the server frees the lock once it has processed the disconnect: wait for that)
        wait_until(lambda: (b.tick(), b.figures()["cron"]["leader"])[1], 10, message="standby leads")
        # Then the other takes over, does not repeat 12:10, and carries on from 12:11
        for minute in (11, 12):
            b.now = T0.replace(minute=minute)
            b.tick()
        ticks = [t for t, _ in jobs(db)]
        assert len(ticks) == len(set(ticks)) == 12
        assert ticks[-1] == "2026-01-05T12:12:00+00:00"
    finally:
        a.close()
        b.close()


def test_a_leader_whose_connection_was_killed_steps_down_without_enqueuing(db):
    # Given a leader and a standby
    cfg = cron_config(db)
    a, b = ClockedScheduler(cfg, ("cron",)), ClockedScheduler(cfg, ("cron",))
    try:
        a.tick()
        b.tick()
        # When the server kills the leader's lock connection and the standby takes the lock
        db.query("KILL %s", (a._lock.connection_id,))
        wait_until(lambda: (b.tick(), b.figures()["cron"]["leader"])[1], 10, message="standby leads")
        # And both see 12:01 come
        a.now = b.now = T0.replace(minute=1)
        a.tick()
        b.tick()
        # Then the old leader noticed it lost the lock: the tick is enqueued once, by the new one
        assert not a.figures()["cron"]["leader"]
        assert jobs(db) == [("2026-01-05T12:01:00+00:00", "report")]
        assert b.figures()["cron"]["enqueued"] == 1
    finally:
        a.close()
        b.close()


def test_a_leader_whose_host_vanished_loses_the_lead_within_session_idle_s(db):
    # Given a leader and a standby, with a 2 s server idle timeout on lock sessions
    cfg = cron_config(db, consumer={"session_idle_s": 2})
    a, b = ClockedScheduler(cfg, ("cron",)), ClockedScheduler(cfg, ("cron",))
    try:
        a.tick()
        b.tick()
        assert a.figures()["cron"]["leader"] and not b.figures()["cron"]["leader"]
        # When the leader's host vanishes: its session stays open but says nothing more
        vanished_at = time.monotonic()
        # Then the server ends that session within the bound, and the standby takes the lead
        wait_until(lambda: (b.tick(), b.figures()["cron"]["leader"])[1], 15, 0.2, "standby leads")
        assert time.monotonic() - vanished_at < 2 + 5
    finally:
        a.close()
        b.close()


def test_a_leader_whose_ticks_are_far_apart_keeps_the_lead_past_session_idle_s(db):
    # Given a leader and a standby, with a 2 s server idle timeout on lock sessions
    cfg = cron_config(db, consumer={"session_idle_s": 2})
    a, b = ClockedScheduler(cfg, ("cron",)), ClockedScheduler(cfg, ("cron",))
    try:
        a.tick()
        b.tick()
        # When both keep ticking for three idle timeouts and no tick falls due
        until = time.monotonic() + 6
        while time.monotonic() < until:
            a.tick()
            b.tick()
            time.sleep(0.1)  # a main loop's pace
        # Then the leader is still the leader, on its first connection
        assert a.figures()["cron"]["leader"] and not b.figures()["cron"]["leader"]
        assert a._lock.generation == 1
    finally:
        a.close()
        b.close()


def test_two_schedulers_that_both_think_they_lead_still_enqueue_each_tick_once(db):
    # Given two schedulers without the leader lock (as with use_locks = false): both act
    cfg = cron_config(db, wakeup={"use_locks": False})
    scheds = [ClockedScheduler(cfg, ("cron",)), ClockedScheduler(cfg, ("cron",))]
    try:
        for s in scheds:
            s.tick()
        # When both fire the same 20 ticks at the same moment
        for minute in range(1, 21):
            barrier = threading.Barrier(2)

            def fire(s, minute=minute, barrier=barrier):
                s.now = T0.replace(minute=minute)
                barrier.wait(10)
                s.tick()

            threads = [threading.Thread(target=fire, args=(s,)) for s in scheds]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
        # Then the nq_periodic guard let exactly one job per tick through
        ticks = [t for t, _ in jobs(db)]
        assert sorted(ticks) == [f"2026-01-05T12:{m:02d}:00+00:00" for m in range(1, 21)]
        assert sum(s.figures()["cron"]["enqueued"] for s in scheds) == 20
    finally:
        for s in scheds:
            s.close()


def test_bad_periodic_payloads_are_config_errors():
    import dataclasses

    from notifyq import config as config_mod

    raw = {"queue": {"q": {"periodic": [{"cron": "* * * * *", "payload": {"tick": 1}}]}}}
    with pytest.raises(errors.ConfigError, match="tick"):
        config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"}, overrides=raw)
    cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"})  # and a Config built in code
    with pytest.raises(errors.ConfigError, match="tick"):
        periodic.Scheduler(dataclasses.replace(cfg, periodic={"q": tuple(raw["queue"]["q"]["periodic"])}), ("q",))


def test_latest_tick_includes_a_tick_exactly_at_now():
    exact = dt.datetime(2026, 1, 5, 12, 5, tzinfo=UTC)
    assert periodic.latest_tick("*/5 * * * *", exact) == exact
    assert periodic.latest_tick("*/5 * * * *", exact + dt.timedelta(seconds=1)) == exact
    assert periodic.missed_between("*/5 * * * *", exact, exact + dt.timedelta(minutes=20)) == 3


# ------------------------------------------------------------------ retention

def _finished_jobs(db, cfg, queue: str, n: int, status: int, hours_ago: float) -> list[int]:
    with Producer(queue, cfg) as p:
        ids = p.put_many([{"n": i} for i in range(n)])
    db.query("UPDATE nq_job SET status = %s, finished_at = NOW(6) - INTERVAL %s SECOND WHERE id IN %s",
             (status, int(hours_ago * 3600), ids))
    return ids


def test_the_leader_purges_done_and_dead_jobs_past_retention_and_keeps_the_rest(db):
    # Given old and recent done and dead jobs on a queue with 1 h retention, and another queue
    cfg = db.config(queue={"cron": {"retention_s": 3600.0}, "other": {"retention_s": 3600.0}})
    old = (_finished_jobs(db, cfg, "cron", 30, Status.DEAD, 2)
           + _finished_jobs(db, cfg, "cron", 20, Status.DONE, 2))
    recent = _finished_jobs(db, cfg, "cron", 5, Status.DEAD, 0.5)
    elsewhere = _finished_jobs(db, cfg, "other", 5, Status.DEAD, 2)
    with Producer("cron", cfg) as p:
        ready = [p.put({"ready": True})]
    # When the queue's scheduler runs its retention pass
    sched = ClockedScheduler(cfg, ("cron",))
    try:
        sched.tick()
        # (and, with no periodic entry to serve, keeps no connection open afterwards)
        assert sched._work is None and sched._lock is None
    finally:
        sched.close()
    # Then only the old finished jobs of that queue are gone
    left = {r[0] for r in db.query("SELECT id FROM nq_job")}
    assert left == set(recent + elsewhere + ready)
    assert sched.figures()["cron"]["purged"] == len(old)


def test_purge_works_in_chunks_and_can_stop_after_a_budget(db):
    cfg = db.config()
    _finished_jobs(db, cfg, "q", 35, Status.DEAD, 1)
    from notifyq.store.db import Session

    session = Session(cfg.dsn)
    try:
        assert admin.purge(session, [Status.DEAD], 60, chunk=10, max_chunks=2) == (20, False)
        assert admin.purge(session, [Status.DEAD], 60, chunk=10) == (15, True)
    finally:
        session.close()
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0


# ------------------------------------------------------------------ end to end

HANDLER = '''
import os

def record_tick(job):
    with open(os.path.join(os.environ["NQ_TEST_OUT"], "ticks.log"), "a") as f:
        f.write(f"{job.payload['tick']} {job.payload['periodic']} {os.getpid()}\\n")
'''


def test_two_consumer_processes_enqueue_a_per_second_cron_once_per_tick(db, tmp_path):
    # Given a config with a per-second entry, and two consumer processes of its queue
    (tmp_path / "nqperiodic.py").write_text(HANDLER)
    (tmp_path / "notifyq.toml").write_text(
        '[queue.cron]\nhandler = "nqperiodic:record_tick"\n'
        '[[queue.cron.periodic]]\ncron = "* * * * * *"\nname = "beat"\npayload = {kind = "beat"}\n')
    env = {**db.env, "NOTIFYQ_CONFIG": str(tmp_path / "notifyq.toml"), "NQ_TEST_OUT": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "tests" / "helpers")])}
    procs = [subprocess.Popen(notifyq_cmd("consume", "--profile", "cron"), env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    log = tmp_path / "ticks.log"

    def ticks() -> list[str]:
        return log.read_text().split("\n")[:-1] if log.exists() else []

    try:
        # When they run for a few ticks
        wait_until(lambda: len(ticks()) >= 4, 30, 0.05, "four ticks handled")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(30) for p in procs]
    assert codes == [0, 0], [p.stderr.read() for p in procs]
    # Then every tick was enqueued and handled once, in order, and carries its time
    seen = [line.split()[0] for line in ticks()]
    assert len(seen) == len(set(seen)), seen
    assert seen == sorted(seen)
    assert all(dt.datetime.fromisoformat(t).microsecond == 0 for t in seen)
    assert db.scalar("SELECT name FROM nq_periodic WHERE queue = 'cron'") == "beat"


def test_without_periodic_entries_the_scheduler_holds_no_lock_and_no_session(db):
    # Given a consumer's scheduler for a queue with retention on but no periodic entries
    sched = periodic.Scheduler(db.config(), ("plain",))
    try:
        # When its loop turns many times before the first retention pass is due
        for _ in range(50):
            sched.tick()
        # Then it never connected: a consumer process keeps exactly its workers' sessions
        assert sched._lock is None and sched._work is None
        assert sched.figures()["plain"]["leader"] is False
    finally:
        sched.close()
