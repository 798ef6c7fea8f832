"""A handler's return value never makes its job run twice: it is rendered as kept when the
handler returns (not held to the ack, where its cost fell outside the lease), and a batch's
finished jobs are acked at once when their lease is due an extension at the batch's end."""

from __future__ import annotations

import threading
import time

from test_effects import put

from notifyq.consume import handlers
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer


class _Watched(dict):
    """A result that says when the encoder reads it."""

    def __init__(self, said: list, job_id: int):
        super().__init__(id=job_id)
        self.said = said

    def items(self):
        self.said.append(("encoded", self["id"]))
        return super().items()


def test_a_result_is_encoded_when_its_handler_returns_before_the_next_job_starts(db):
    # Given two jobs in one batch of a queue that keeps results, whose values say when they are read
    ids = put(db, 2)
    said: list[tuple[str, int]] = []

    def handler(job):
        said.append(("ran", job.id))
        return _Watched(said, job.id)

    # When one worker runs them
    worker = Worker(db.config(defaults={"keep_done": True}), "q", handlers.PythonHandler(handler, False),
                    stop=threading.Event(), budget=Budget(None), batch_size=2, exit_when_empty=True)
    worker.run()
    assert worker.error is None, worker.error
    # Then each value was encoded as its handler returned, not when the batch's acks went out
    assert said == [("ran", ids[0]), ("encoded", ids[0]), ("ran", ids[1]), ("encoded", ids[1])]
    # And both are kept, each job done once
    with Producer("q", db.config()) as p:
        assert [p.result(i) for i in ids] == [{"id": ids[0]}, {"id": ids[1]}]
    assert worker.stats.succeeded == 2 and worker.stats.lost_acks == 0


def test_a_batchs_finished_jobs_are_acked_at_once_when_their_lease_is_due_an_extension(db):
    # Given a job whose handler runs past a third of its 1.5 s lease (the point its lease is
    # due an extension), in a queue that keeps results
    [job_id] = put(db)

    def handler(job):
        time.sleep(0.6)  # the job's own work, not a wait on anything
        return {"ok": job.id}

    worker = Worker(db.config(defaults={"keep_done": True, "lease_s": 1.5}), "q",
                    handlers.PythonHandler(handler, False), stop=threading.Event(), budget=Budget(None),
                    batch_size=1, exit_when_empty=True)
    try:
        worker.presence.ensure_registered(worker)  # registered, as run() does first
        # When it claims and runs the batch
        got, _ = worker._claim_and_run()
        # Then its ack went out as the batch ended, not left for a next claim that may come
        # after the lease ran out: the job is done, its result kept
        assert got == 1 and not worker.acks.waiting
        assert db.query("SELECT status FROM nq_job WHERE id = %s", (job_id,)) == [(3,)]
        assert worker.stats.succeeded == 1
        with Producer("q", db.config()) as p:
            assert p.result(job_id) == {"ok": job_id}
    finally:
        worker.work.close()
        worker.presence.close()
