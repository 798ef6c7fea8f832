"""A host that vanishes while holding the reaper lock blocks reaping only for a bounded time.

The server frees a session's advisory locks when the session ends; for a client host that is
gone without a FIN, only the session's idle timeout ends it (wait_timeout, 8 h by default). A
reaper pass runs on a session of its own whose idle timeout is reaper.REAPER_IDLE_TIMEOUT_S.
"""

from __future__ import annotations

import signal
import time

from conftest import wait_until

from notifyq.consume import reaper

from .conftest import consumer_id_of, finished_counts, produce, read_runs, recorder_env, write_config


def test_a_consumer_frozen_mid_reap_holding_the_reaper_lock_blocks_reaping_only_for_the_bound(fdb, procs, tmp_path):
    out = tmp_path / "runs"
    # Given a consumer holding 5 slow jobs, and an idle one whose reaper passes stall once
    # inside the reaper lock
    victim = procs.consumer(recorder_env(fdb, out, sleep_s=60), "r", "--batch-size", "5")
    consumer_id_of(fdb, victim.pid)
    produce(fdb, "r", 5)
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2") == 5, 30,
               message="the victim holds the 5 jobs")
    holder = procs.consumer(recorder_env(fdb, out), "r", handler="nqstall:record")
    consumer_id_of(fdb, holder.pid)
    # When the busy consumer is killed, the other one enters its pass, takes the reaper lock,
    # and is frozen there (SIGSTOP: a host gone without closing its connections)
    victim.signal(signal.SIGKILL)
    wait_until(lambda: (out / "stalled").exists(), 30, message="the holder inside its reaper pass")
    holder.signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    # (queued behind the frozen watcher: it looks again every idle_wait_s)
    config = write_config(tmp_path / "nq.toml", "[wakeup]\nidle_wait_s = 2\n[consumer]\nreap_interval_s = 0.5\n")
    survivor = procs.consumer(recorder_env(fdb, out, sleep_s=0, NOTIFYQ_CONFIG=str(config)), "r",
                              handler="nqhandlers:record")
    # Then the survivor's reaper takes the jobs back once the server ends the frozen session,
    # within the reaper session's idle timeout (plus reap intervals), and runs them
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_job") == 0, reaper.REAPER_IDLE_TIMEOUT_S + 20, 0.1,
               "the dead consumer's jobs handled by the survivor")
    took = time.monotonic() - frozen_at
    assert took < reaper.REAPER_IDLE_TIMEOUT_S + 10, took
    assert survivor.alive()
    print(f"\nreaping resumed {took:.1f}s after the reaper-lock holder froze "
          f"(bound {reaper.REAPER_IDLE_TIMEOUT_S}s)")


def test_a_consumer_whose_host_vanished_loses_its_jobs_within_session_idle_s(fdb, procs, tmp_path):
    out = tmp_path / "runs"
    config = write_config(tmp_path / "nq.toml", "[consumer]\nsession_idle_s = 3\nreap_interval_s = 0.5\n[wakeup]\nidle_wait_s = 1\n")
    env = {"NOTIFYQ_CONFIG": str(config)}
    # Given a consumer holding 5 slow jobs (leases of 300 s: only its liveness lock can free them)
    victim = procs.consumer(recorder_env(fdb, out, sleep_s=60, **env), "v", "--batch-size", "5")
    consumer_id_of(fdb, victim.pid)
    produce(fdb, "v", 5)
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2") == 5, 30,
               message="the victim holds the 5 jobs")
    # When its host vanishes (SIGSTOP: its connections stay open and say nothing more), with a
    # healthy consumer next to it
    victim.signal(signal.SIGSTOP)
    vanished_at = time.monotonic()
    procs.consumer(recorder_env(fdb, out, sleep_s=0, **env), "v", handler="nqhandlers:record")
    # Then the server ends its lock session after session_idle_s, and the survivor runs the jobs
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_job") == 0, 3 + 30, 0.1,
               "the vanished consumer's jobs handled by the survivor")
    took = time.monotonic() - vanished_at
    assert took < 3 + 15, took
    print(f"\njobs of a vanished consumer back after {took:.1f}s (session_idle_s 3)")


def test_a_handler_that_runs_past_session_idle_s_keeps_its_consumer_alive(fdb, procs, tmp_path):
    out = tmp_path / "runs"
    config = write_config(tmp_path / "nq.toml", "[consumer]\nsession_idle_s = 2\nreap_interval_s = 0.5\n[wakeup]\nidle_wait_s = 1\n")
    env = {"NOTIFYQ_CONFIG": str(config)}
    # Given a consumer running one job of 8 s (four server idle timeouts of its lock session)
    slow = procs.consumer(recorder_env(fdb, out, sleep_s=8, **env), "k")
    consumer_id_of(fdb, slow.pid)
    produce(fdb, "k", 1)
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2") == 1, 30,
               message="the job is running")
    # And a second consumer whose reaper looks for dead peers twice a second
    procs.consumer(recorder_env(fdb, out, sleep_s=0, **env), "k", handler="nqhandlers:record")
    # When the slow consumer's handler finishes
    wait_until(lambda: any(r.finished and r.pid == slow.pid for r in read_runs(out)), 60, 0.1,
               "the slow handler finished")
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_job") == 0, 30, 0.1, "the job acked")
    # Then it ran once: the slow consumer's liveness lock was never dropped meanwhile
    runs = read_runs(out)
    assert [(r.pid, r.finished) for r in runs if not r.finished] == [(slow.pid, False)], runs
    assert finished_counts(runs) == {runs[0].job: 1}, runs
