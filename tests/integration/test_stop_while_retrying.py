"""A worker stopped while a statement under a running handler retried a lost server (a
command's lease extension, as the server restarts during a shutdown) leaves its job as the
grace expiry does: interrupted, back to ready, no attempt charged. The stop is the shutdown's
doing, not the job's; charging it pushed long jobs toward dead, one deploy at a time."""

from __future__ import annotations

import threading

from notifyq import errors
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer


class StoppedWhileExtending:
    """A handler whose lease extension ends as a stopping consumer's does when the server is
    gone: the stop is set, and the retry raises (what CommandHandler's call raises, once it has
    ended the command's process group)."""

    per_batch = False

    def __init__(self, stop: threading.Event):
        self.stop = stop

    def __call__(self, jobs, extend) -> None:
        self.stop.set()
        raise errors.TransientDBError("stopped while connecting to the server: MySQL error 2002")


def test_a_job_whose_worker_stopped_while_retrying_is_given_back_interrupted_not_charged(db):
    # Given a job, and a worker whose handler's extension meets a lost server as it stops
    cfg = db.config()
    with Producer("q", cfg) as p:
        [job] = p.put_many([{"n": 1}])
    stop = threading.Event()
    worker = Worker(cfg, "q", StoppedWhileExtending(stop), stop=stop, budget=Budget(None), batch_size=1)
    # When it runs (the server answers again by the time the batch settles)
    worker.run()
    # Then it ended on the stop, not on an error of its own
    assert worker.error is None
    # And the job is back to ready, its attempt undone and recorded as interrupted
    status, attempts, owner = db.query("SELECT status, attempts, owner FROM nq_job WHERE id = %s", (job,))[0]
    assert (status, attempts, owner) == (0, 0, None)
    [(outcome, error)] = db.query("SELECT outcome, error FROM nq_attempt WHERE job_id = %s", (job,))
    assert outcome == "interrupted" and "stopped while its server was unreachable" in error, error
