"""A consumer whose batch could not be settled at its run's end gives its jobs back before it
exits, once its server answers within the settle bound (service.SETTLE_AT_EXIT_S).

A SIGTERM stops the batch after its running job: the worker acks what finished and gives back
what never started. Here the server goes away as that job ends, and comes back only after the
grace: the worker's retries end at the grace's end (worker.RetryStop), and its settle fails.
The batch must not count as settled then: the shutdown settles it on its own session, which
waits for the server within the bound.

Regression: the worker marked the batch settled whatever its settle did, and the shutdown
(Worker.abandon) passed over it; the consumer exited 0 saying it was stopping, its unstarted
job still claimed until its lease ended (120 s here), the finished one to run again then.
"""

from __future__ import annotations

import signal
import time

from conftest import run_cli, wait_until

from .conftest import read_runs, recorder_env, wait_claimed, write_config

QUEUE = "q"
GRACE_S = 8.0  # room for the server's clean stop and the handler's release inside it
LEASE_S = 120.0  # no lease ends within the test: what comes back came back at the exit
SETTLE_AT_EXIT_S = 12.0  # service.SETTLE_AT_EXIT_S: the exit's bound after the grace


def test_a_batch_whose_settle_met_the_server_away_at_the_graces_end_is_settled_before_the_exit(
        server, fdb, procs, tmp_path):
    # Given a consumer (one worker, batches of 2) whose batch holds a job that runs until the
    # test releases it, and a job waiting behind it
    config = write_config(tmp_path / "nq.toml", f"[defaults]\nlease_s = {LEASE_S}\n"
                                                f"[consumer]\nshutdown_grace_s = {GRACE_S}\n")
    out = tmp_path / "out"
    env = recorder_env(fdb, out, NOTIFYQ_CONFIG=str(config), NOTIFYQ_CONNECT_RETRY_S="60")
    put = run_cli(env, "produce", "-q", QUEUE, "--print-ids", input='{"hold": true}\n{"n": 2}\n')
    assert put.returncode == 0, put.stderr
    held, waiting = (int(line) for line in put.stdout.split())
    consumer = procs.consumer(env, QUEUE, "--workers", "1", "--batch-size", "2",
                              handler="nqhandlers:hold_until_released")
    wait_until(lambda: [r.job for r in read_runs(out)] == [held], 30, 0.02, "the held job started")
    wait_claimed(fdb, (held, waiting))  # both claimed by the one batch

    # When it is stopped, the server stops, and the running job ends inside the grace: the
    # worker's ack and give-back retry the server until the grace's end, and fail
    consumer.signal(signal.SIGTERM)
    stopped_at = time.monotonic()
    wait_until(lambda: fdb.scalar("SELECT stopping FROM nq_consumer WHERE pid = %s", (consumer.pid,)),
               10, 0.02, "the consumer draining (its registration says so)")
    server.stop()
    (out / "release").touch()
    assert time.monotonic() - stopped_at < GRACE_S - 2, "the server stopped too late: the job outlasted the grace"
    wait_until(lambda: "worker stopped while retrying" in consumer.stderr_text(), GRACE_S + 10, 0.02,
               "the worker's retries ended by the grace")
    assert [r.job for r in read_runs(out) if r.finished] == [held], consumer.stderr_text()[-3000:]
    # And the server is back within the settle bound
    server.start()
    back_at = time.monotonic()

    # Then the consumer exits 0 within the bound, having settled the batch itself: the finished
    # job acked, the unstarted one ready again with its attempt undone (no lease ended meanwhile,
    # and no other consumer ran a reaper)
    code = consumer.wait(SETTLE_AT_EXIT_S + 10)
    log = consumer.stderr_text()
    assert code == 0, log[-3000:]
    assert time.monotonic() - back_at < SETTLE_AT_EXIT_S, log[-3000:]
    rows = {job: (status, attempts, owner) for job, status, attempts, owner in fdb.query(
        "SELECT id, status, attempts, owner FROM nq_job WHERE id IN (%s, %s)", (held, waiting))}
    assert rows.get(waiting) == (0, 0, None), (rows, log[-3000:])
    assert held not in rows or rows[held][0] == 3, (rows, log[-3000:])  # acked: gone, or kept done
    assert fdb.scalar("SELECT COUNT(*) FROM nq_consumer WHERE pid = %s", (consumer.pid,)) == 0, log[-3000:]
