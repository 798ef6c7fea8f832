"""A server frozen (SIGSTOP) when the consumer is stopped, answering again within the stop's
settle bound (service.SETTLE_AT_EXIT_S) but after the grace: what finished is acked once and
counted once before the exit, and the stopping consumer starts nothing more.

Regressions (an outside attack on the deploys page's grace):
- A job that finished just as the server froze had its ack handed to its worker's pending acks
  (for the next claim to carry), its batch settled. The worker's claim, or ack, then waited on the
  frozen server; the stop saw no unsettled batch, exited 2 s after the grace saying "this consumer
  held no job" (or, with the server back sooner, "exiting while holding claimed jobs"), and the
  reaper took the finished job back: it ran a second time. When the worker's own send landed as
  the process exited, its summary said done=0 beside a `done` record.
- The worker looked at the stop before a batch's next job, then sent an ack (or a lease
  extension) that the frozen server held past the grace's end; once the server answered, it
  started that next job, 3-6 s after the grace, which the stop then recorded interrupted and
  another consumer ran again.
"""

from __future__ import annotations

import os
import re
import signal
import time

from conftest import run_cli, wait_until

from .conftest import read_runs, recorder_env, wait_claimed, write_config

QUEUE = "q"
GRACE_S = 3.0
LEASE_S = 120.0  # no lease ends within the test: nothing comes back through a reaper
UNREGISTER_UNREACHABLE_S = 2.0  # service's: the old exit's bound after the grace, holding "no job"
SETTLE_AT_EXIT_S = 12.0  # service's: the exit's bound after the grace, for a server that answers again
AWAY_PAST_GRACE_S = UNREGISTER_UNREACHABLE_S + 1.0  # the server frozen this long past the grace's end


def _consumer(fdb, procs, tmp_path, batch_size: int, payloads: list[str]):
    """A one-worker consumer of hold_until_released with claims of `batch_size`, the jobs put
    (in order) first: (the consumer, the job ids, the handler's output directory)."""
    config = write_config(tmp_path / "nq.toml", f"[defaults]\nlease_s = {LEASE_S}\nbatch_target_s = 0\n"
                                                f"[consumer]\nshutdown_grace_s = {GRACE_S}\n")
    out = tmp_path / "out"
    env = recorder_env(fdb, out, NOTIFYQ_CONFIG=str(config), NOTIFYQ_CONNECT_RETRY_S="60")
    put = run_cli(env, "produce", "-q", QUEUE, "--print-ids", input="".join(p + "\n" for p in payloads))
    assert put.returncode == 0, put.stderr
    ids = [int(line) for line in put.stdout.split()]
    consumer = procs.consumer(env, QUEUE, "--workers", "1", "--batch-size", str(batch_size),
                              handler="nqhandlers:hold_until_released")
    wait_until(lambda: [r.job for r in read_runs(out)] == [ids[0]], 30, 0.02, "the held job started")
    return consumer, ids, out


def _stop_with_the_server_frozen(server, consumer, out, job: int) -> None:
    """The server freezes while `job` runs, the job then ends (its ack meets the frozen server),
    the consumer is stopped, and the server answers again AWAY_PAST_GRACE_S after the grace's end."""
    server_pid = server._proc.pid
    os.kill(server_pid, signal.SIGSTOP)
    try:
        (out / "release").touch()
        wait_until(lambda: any(r.job == job and r.finished for r in read_runs(out)), 10, 0.005,
                   "the held job ended")
        consumer.signal(signal.SIGTERM)
        wait_until(lambda: "grace period over" in consumer.stderr_text(), GRACE_S + 10, 0.02, "the grace's end")
        time.sleep(AWAY_PAST_GRACE_S)  # (the outage's length past the grace, not a wait for anything)
    finally:
        os.kill(server_pid, signal.SIGCONT)


def _summary_done(log: str) -> int:
    [done] = re.findall(r"consumer stopped claimed=\d+ done=(\d+)", log)
    return int(done)


def test_a_finished_jobs_ack_that_met_the_frozen_server_is_sent_by_the_stop_once_it_answers(
        server, fdb, procs, tmp_path):
    # Given a consumer claiming one job at a time, running the first of two; the server freezes
    # as that job ends (its ack waits for the next claim, which meets the frozen server), the
    # consumer is stopped, and the server answers again after the grace, within the settle bound
    consumer, (first, second), out = _consumer(fdb, procs, tmp_path, 1, ['{"hold": true}', '{"n": 2}'])
    _stop_with_the_server_frozen(server, consumer, out, first)

    # Then the stop acks the finished job before the exit, exit 0: acked once (one `done` record,
    # its row gone), counted done once in the summary; the other job never ran here and is ready
    code = consumer.wait(SETTLE_AT_EXIT_S + 10)
    log = consumer.stderr_text()
    assert code == 0, log[-3000:]
    assert fdb.scalar("SELECT COUNT(*) FROM nq_job WHERE id = %s", (first,)) == 0, log[-3000:]
    assert [o for (o,) in fdb.query("SELECT outcome FROM nq_attempt WHERE job_id = %s", (first,))] == ["done"], \
        log[-3000:]
    assert _summary_done(log) == 1, log[-3000:]
    assert "held no job" not in log and "exiting while holding claimed jobs" not in log, log[-3000:]
    assert [r.job for r in read_runs(out) if not r.finished] == [first], log[-3000:]
    assert fdb.query("SELECT status, attempts, owner FROM nq_job WHERE id = %s", (second,)) == [(0, 0, None)], \
        log[-3000:]


def test_a_stopping_worker_never_starts_the_batchs_next_job_once_the_frozen_server_answers(
        server, fdb, procs, tmp_path):
    # Given a consumer whose batch holds two jobs, the first running over a second (so its ack
    # is sent before the next job starts) until the test releases it
    consumer, (first, second), out = _consumer(fdb, procs, tmp_path, 2,
                                               ['{"hold": true, "at_least_s": 1.2}', '{"n": 2}'])
    wait_claimed(fdb, (first, second))  # both claimed by the one batch

    # When the server freezes, the first job ends (the worker looked at the stop, then sent its
    # ack, which the frozen server holds), the consumer is stopped, and the server answers again
    # after the grace
    _stop_with_the_server_frozen(server, consumer, out, first)

    # Then the second job never starts in the stopped consumer: given back unstarted (ready, its
    # attempt undone), the first acked once, exit 0
    code = consumer.wait(SETTLE_AT_EXIT_S + 10)
    log = consumer.stderr_text()
    assert code == 0, log[-3000:]
    assert [r.job for r in read_runs(out) if not r.finished] == [first], log[-3000:]
    assert fdb.query("SELECT status, attempts, owner FROM nq_job WHERE id = %s", (second,)) == [(0, 0, None)], \
        log[-3000:]
    assert [o for (o,) in fdb.query("SELECT outcome FROM nq_attempt WHERE job_id = %s", (first,))] == ["done"], \
        log[-3000:]
    assert not fdb.query("SELECT outcome FROM nq_attempt WHERE job_id = %s", (second,)), log[-3000:]
    assert _summary_done(log) == 1, log[-3000:]
