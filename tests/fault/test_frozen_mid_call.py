"""A consumer frozen in the middle of a call for longer than connect_retry_s, while the server
restarted, goes on when it resumes: its call's retry budget counts from the call's first failure
(the lost connection it finds on resuming), not from the call's start, which lay before the
freeze. Found by the fault schedule (a 32.5 s SIGSTOP mid-claim, then exit 5 with the server up).

The call is made to wait on the server on purpose: the job's row is locked by another session
when the job ends, so its ack waits for the row lock; then the consumer is frozen, the server
restarted (the lock's holder goes with it) and the freeze outlasts connect_retry_s."""

from __future__ import annotations

import signal
import time

from conftest import admin_connect, wait_until

from .conftest import produce, read_runs, recorder_env

RETRY_S = 3.0


def _ack_waiting_on_the_row(fdb) -> bool:
    """(Polled no more often than every 0.1 s: InnoDB refreshes INNODB_TRX only after 0.1 s without
    a read of it, so quicker polls read a stale copy for ever.)"""
    return fdb.scalar("SELECT COUNT(*) FROM information_schema.INNODB_TRX "
                      "WHERE trx_state = 'LOCK WAIT'") > 0


def test_a_consumer_frozen_mid_ack_past_connect_retry_s_while_the_server_restarted_goes_on(
        server, fdb, procs, tmp_path):
    # Given a consumer with connect_retry_s = 3, one job at a time, running a job for a second
    out = tmp_path / "runs"
    env = recorder_env(fdb, out, sleep_s=1.0, NOTIFYQ_CONNECT_RETRY_S=str(RETRY_S))
    consumer = procs.consumer(env, "fz", "--batch-size", "1")
    produce(fdb, "fz", 1)
    wait_until(lambda: any(not r.finished for r in read_runs(out)), 60, 0.05, "the job started")
    job_id = read_runs(out)[0].job

    # And its ack waits on the job's row, which another session holds
    holder = admin_connect(fdb.admin, fdb.admin.database)
    holder.autocommit(False)
    holder.cursor().execute("SELECT id FROM nq_job WHERE id = %s FOR UPDATE", (job_id,))
    wait_until(lambda: _ack_waiting_on_the_row(fdb), 30, 0.25, "the ack waiting on the row lock")

    # When the consumer is frozen in that call, the server restarts meanwhile, and the freeze
    # outlasts connect_retry_s
    consumer.signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    server.restart()
    try:
        holder.close()
    except Exception:  # the restart ended it
        pass
    wait_until(lambda: time.monotonic() - frozen_at > RETRY_S + 2, RETRY_S + 10, 0.1,
               "the freeze past connect_retry_s")
    consumer.signal(signal.SIGCONT)

    # Then it goes on: the job is done, a new one is run by it, and it never gave up
    def queue_empty_while_alive() -> bool:
        assert consumer.alive(), consumer.stderr_text()[-3000:]
        return fdb.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = 'fz'") == 0

    wait_until(queue_empty_while_alive, 60, 0.1, "the job acked")
    produce(fdb, "fz", 1)
    wait_until(queue_empty_while_alive, 60, 0.1, "a new job run")
    assert "failed after retrying" not in consumer.stderr_text()
