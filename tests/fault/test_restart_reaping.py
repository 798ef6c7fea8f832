"""After a server restart, a consumer that took its liveness lock back on the new server and then
died has its jobs back within seconds: the reaper's restart grace is for consumers that have not
come back yet, not for every one, for as long as the grace lasts.

A consumer comes back by taking its lock back and writing its row on the new server; a row
written in the server's first second may be the old server's to a reaper (which knows the start
to the second only), so one that came back then touches its row again after that second
(Presence: RETOUCH_AFTER_S). The test waits for that, and then for the victim at work.

The victim is frozen with SIGSTOP first (conftest.freeze_mid_batch): its sessions, and so its
liveness lock, stay open while the test reads which jobs it holds, then SIGKILL closes them.
"""

from __future__ import annotations

import datetime
import signal
import time

from conftest import wait_until

from .conftest import freeze_mid_batch, produce, read_runs, recorder_env, started_by

# The grace a reaper gives a restarted server's consumers that have not come back yet, with the
# default session_idle_s (60 s: two keeper pings, Presence.reap_pass): the kill must land inside it.
RESTART_GRACE_S = 30.0


def test_a_consumer_killed_after_it_came_back_from_a_server_restart_has_its_jobs_back_within_5_s(
        server, fdb, procs, tmp_path):
    # Given two busy consumers with the default reap and wake-up settings (NOTIFYQ_CONFIG=/dev/null)
    out = tmp_path / "runs"
    env = recorder_env(fdb, out, sleep_s=0.05)
    victim = procs.consumer(env, "rr", "--batch-size", "10")
    survivor = procs.consumer(env, "rr", "--batch-size", "10")
    produce(fdb, "rr", 600)
    wait_until(lambda: len(started_by(read_runs(out), victim.pid)) >= 5, 30, message="victim at work")

    # When the server restarts, both consumers take their liveness locks back on it and work on
    server.restart()
    restarted_at = time.monotonic()

    def back_on_the_new_server(pid: int) -> str | None:
        """Its id once it holds its lock and its row was written after the server's first second."""
        rows = fdb.query(
            "SELECT c.id, c.last_seen, UNIX_TIMESTAMP() - s.VARIABLE_VALUE FROM nq_consumer c "
            "JOIN information_schema.GLOBAL_STATUS s ON s.VARIABLE_NAME = 'UPTIME' "
            "WHERE c.pid = %s AND IS_USED_LOCK(c.lock_name) IS NOT NULL", (pid,))
        if not rows:
            return None
        consumer_id, last_seen, started_s = rows[0]  # (one statement: one second of the clock)
        written_s = last_seen.replace(tzinfo=datetime.timezone.utc).timestamp()  # notifyq writes UTC
        return consumer_id if written_s >= int(started_s) + 1 else None

    victim_id = wait_until(lambda: back_on_the_new_server(victim.pid), 20, 0.05, "victim back")
    wait_until(lambda: back_on_the_new_server(survivor.pid), 20, 0.05, "survivor back")
    worked_before = len(started_by(read_runs(out), victim.pid))
    wait_until(lambda: len(started_by(read_runs(out), victim.pid)) > worked_before, 20, 0.05,
               "victim at work on the new server")

    # And the victim is SIGKILLed in the middle of a batch, well inside the restart grace
    in_flight = freeze_mid_batch(fdb, victim, victim_id)
    victim.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    victim.wait(10)
    assert killed_at - restarted_at < RESTART_GRACE_S - 10, "the kill came too late to test the grace"

    # Then within 5 s (the soak's target) every job it held is claimed again or done
    wait_until(lambda: fdb.scalar(
        "SELECT COUNT(*) FROM nq_job WHERE id IN %s AND (owner IS NULL OR owner = %s)",
        (tuple(in_flight), victim_id)) == 0, 10, 0.05, "the victim's jobs claimed again")
    recovery_s = time.monotonic() - killed_at
    assert recovery_s < 5.0, f"jobs of the killed consumer came back after {recovery_s:.2f}s"
    assert survivor.alive()
    print(f"\nSIGKILL {killed_at - restarted_at:.1f}s after a server restart: {len(in_flight)} jobs "
          f"in flight, claimed again after {recovery_s:.2f}s")
