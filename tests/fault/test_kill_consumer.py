"""SIGKILL a `notifyq consume` process: its jobs come back within seconds and nothing is lost.

The victim is frozen with SIGSTOP first: its sessions (and so its liveness lock) stay open while
the test reads exactly which jobs it holds, then SIGKILL makes the kernel close them at once.
"""

from __future__ import annotations

import signal
import time

from conftest import wait_until

from notifyq.store import locks

from .conftest import (
    consumer_id_of,
    finished_counts,
    freeze_mid_batch,
    produce,
    read_runs,
    recorder_env,
    started_by,
)


def test_a_busy_consumer_killed_mid_batch_has_its_jobs_claimed_again_within_5_s_with_default_settings(
        fdb, procs, tmp_path):
    # Given two busy consumers with the default reap and wake-up settings (NOTIFYQ_CONFIG=/dev/null)
    out = tmp_path / "runs"
    env = recorder_env(fdb, out, sleep_s=0.05)
    victim = procs.consumer(env, "k", "--batch-size", "10")
    survivor = procs.consumer(env, "k", "--batch-size", "10")
    victim_id = consumer_id_of(fdb, victim.pid)
    consumer_id_of(fdb, survivor.pid)
    produce(fdb, "k", 150)
    wait_until(lambda: len(started_by(read_runs(out), victim.pid)) >= 5, 30, message="victim at work")

    # When the victim is SIGKILLed in the middle of a batch
    in_flight = freeze_mid_batch(fdb, victim, victim_id)
    started_unacked = in_flight & started_by(read_runs(out), victim.pid)
    victim.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    victim.wait(10)

    # Then within 5 s every job it held is claimed again (or already done) by the survivor
    wait_until(lambda: fdb.scalar(
        "SELECT COUNT(*) FROM nq_job WHERE id IN %s AND (owner IS NULL OR owner = %s)",
        (tuple(in_flight), victim_id)) == 0, 10, 0.01, "the victim's jobs claimed again")
    recovery_s = time.monotonic() - killed_at
    assert recovery_s < 5.0, f"jobs of the killed consumer came back after {recovery_s:.2f}s"

    # And every job is handled; only jobs the victim had started and not acked ran twice
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_job") == 0, 60, 0.1, "all 150 jobs acked")
    runs = read_runs(out)
    counts = finished_counts(runs)
    duplicates = {job for job, n in counts.items() if n > 1}
    assert len(counts) == 150
    assert duplicates <= started_unacked
    # And the killed claim is charged only if it held one job (the crash is that job's): jobs
    # taken back together are not, so the survivor ran them as attempt 1 (README, delivery contract)
    charged = {2} if len(in_flight) == 1 else {1}
    assert {r.attempt for r in runs if r.job in in_flight and r.pid == survivor.pid} == charged
    assert fdb.scalar("SELECT COUNT(*) FROM nq_consumer WHERE id = %s", (victim_id,)) == 0
    print(f"\nSIGKILL mid-batch: {len(in_flight)} jobs in flight ({len(started_unacked)} started), "
          f"claimed again after {recovery_s:.2f}s, {len(duplicates)} ran twice")


def _kill_idle(fdb, procs, tmp_path, kill_the_watcher: bool) -> None:
    # Given two idle consumers, one of them the queue's watcher, the other queued behind it
    out = tmp_path / "runs"
    env = recorder_env(fdb, out, sleep_s=0.0)
    first = procs.consumer(env, "idle")
    second = procs.consumer(env, "idle")
    ids = {p.pid: consumer_id_of(fdb, p.pid) for p in (first, second)}
    watch = locks.QueueLocks(fdb.admin.database, "idle").watch
    watcher_conn = wait_until(lambda: fdb.scalar("SELECT IS_USED_LOCK(%s)", (watch,)), 30,
                              message="a watcher")
    # (Each one's liveness lock, read alone: an idle consumer may not have opened its work session
    # yet, which consumer_sessions expects; under load it once had not.)
    lock_conn = {p.pid: wait_until(lambda p=p: fdb.scalar("SELECT IS_USED_LOCK(lock_name) FROM nq_consumer "
                                                          "WHERE pid = %s", (p.pid,)), 30, message="its lock")
                 for p in (first, second)}
    victim = next(p for p in (first, second) if (lock_conn[p.pid] == watcher_conn) == kill_the_watcher)
    survivor = second if victim is first else first

    # When the victim is SIGKILLed while waiting for work
    victim.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    victim.wait(10)

    # Then its registration row is cleaned up within 5 s
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_consumer WHERE id = %s", (ids[victim.pid],)) == 0,
               10, 0.01, "the dead consumer's row reaped")
    assert time.monotonic() - killed_at < 5.0
    # And the survivor handles every new job exactly once
    produce(fdb, "idle", 50)
    wait_until(lambda: len(finished_counts(read_runs(out))) == 50, 30, message="50 jobs handled")
    counts = finished_counts(read_runs(out))
    assert max(counts.values()) == 1
    assert {r.pid for r in read_runs(out)} == {survivor.pid}
    assert survivor.alive()


def test_an_idle_watcher_killed_is_reaped_and_the_other_consumer_takes_over(fdb, procs, tmp_path):
    _kill_idle(fdb, procs, tmp_path, kill_the_watcher=True)


def test_an_idle_consumer_queued_for_the_watch_lock_killed_is_reaped(fdb, procs, tmp_path):
    _kill_idle(fdb, procs, tmp_path, kill_the_watcher=False)
