"""A consumer asked to stop gives back at once what its batch claimed but had not started, while
the job ahead of it runs on in the grace: another consumer can run those jobs meanwhile.

Regression: the unstarted jobs stayed claimed, by the stopping consumer's batch, until its
running job returned or the grace ended (an outside attack measured them claimed 10 s with a
10 s grace).
"""

from __future__ import annotations

import threading
import time

from conftest import wait_until

from notifyq import errors
from notifyq.consume.service import ConsumeOptions, ConsumerService
from notifyq.jobs import Job
from notifyq.produce.producer import Producer
from notifyq.store import queries

GRACE_S = 30.0  # the held job ends inside it
LEASE_S = 120.0  # no lease ends within the test: what comes back was given back
BACK_WITHIN_S = 3.0  # the give-back lands within about a second of the stop; generous on a busy machine


class HeldBatch:
    """A consumer (one worker, batches of 3, no hand-back behind long jobs: batch_target_s 0)
    whose batch's first job holds until the test releases it, two claimed behind it."""

    def __init__(self, db):
        self.cfg = db.config(defaults={"lease_s": LEASE_S, "batch_target_s": 0},
                             consumer={"shutdown_grace_s": GRACE_S})
        with Producer("q", self.cfg) as p:
            self.held, *self.waiting = p.put_many([{"hold": True}, {"n": 1}, {"n": 2}])
        self.entered, self.release, self.stop = threading.Event(), threading.Event(), threading.Event()
        self.started: list[int] = []
        self.outcome: dict = {}

    def handler(self, job: Job) -> None:
        self.started.append(job.id)
        if job.payload.get("hold"):
            self.entered.set()
            assert self.release.wait(60), "never released"

    def start(self) -> None:
        self.service = ConsumerService(self.cfg, ConsumeOptions(queues=("q",), function=self.handler, workers=1,
                                                                batch_size=3))
        self.runner = threading.Thread(target=lambda: self.outcome.setdefault("rc", self.service.run(self.stop)),
                                       daemon=True)
        self.runner.start()

    def finish(self) -> None:
        """The held job released, the consumer stopped: it exits 0."""
        self.release.set()
        self.stop.set()
        self.runner.join(30)
        assert not self.runner.is_alive() and self.outcome.get("rc") == 0, self.outcome


def test_a_stopping_consumer_gives_back_its_unstarted_jobs_at_once_while_its_running_job_ends(db):
    # Given a consumer (one worker, batches of 3, no hand-back behind long jobs: batch_target_s
    # 0) whose batch's first job holds until the test releases it, two claimed behind it
    hb = HeldBatch(db)
    held, waiting, started = hb.held, hb.waiting, hb.started
    hb.start()
    try:
        assert hb.entered.wait(30), "the held job started"
        # (waited for: a claim's first job starts while its COMMIT is still on the wire)
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2 AND attempts = 1") == 3,
                   10, message="all three claimed by the one batch")

        # When it is stopped while the held job runs
        hb.stop.set()

        # Then, soon and while that job still runs, the two unstarted jobs are ready again,
        # unclaimed, their attempt undone (before: claimed until the held job returned)
        def given_back() -> bool:
            rows = db.query("SELECT status, attempts, owner FROM nq_job WHERE id IN (%s, %s)", tuple(waiting))
            return sorted(rows) == [(0, 0, None)] * 2

        wait_until(given_back, BACK_WITHIN_S, message="the unstarted jobs given back")
        assert not hb.release.is_set() and hb.runner.is_alive()
        assert db.query("SELECT status FROM nq_job WHERE id = %s", (held,)) == [(2,)]

        # And once the held job is released, it is acked and the consumer exits 0
        hb.finish()
    finally:
        hb.release.set()
        hb.stop.set()
    assert db.query("SELECT status FROM nq_job WHERE id = %s AND status <> 3", (held,)) == []
    assert sorted(db.query("SELECT status, attempts, owner FROM nq_job WHERE id IN (%s, %s)",
                           tuple(waiting))) == [(0, 0, None)] * 2
    # Never started by the stopped batch, and counted given back once
    assert started == [held]
    assert hb.service.totals().given_back == 2


def test_a_give_back_at_the_stop_that_fails_leaves_the_jobs_to_the_batch_which_never_starts_them(db, monkeypatch):
    # Given the same consumer, whose give-back at the stop fails (the server away then)
    hb = HeldBatch(db)
    held, waiting, started = hb.held, hb.waiting, hb.started

    real_give_back = queries.give_back
    failed = threading.Event()

    def give_back(session, queue, ids, token):
        if threading.current_thread().name == "notifyq-stopper":
            failed.set()
            raise errors.TransientDBError("give back failed after retrying: the server is away")
        return real_give_back(session, queue, ids, token)

    monkeypatch.setattr(queries, "give_back", give_back)
    hb.start()
    try:
        assert hb.entered.wait(30), "the held job started"
        # When it is stopped while the held job runs, and its give-back at the stop fails
        hb.stop.set()
        assert failed.wait(10), "the give-back at the stop was tried"
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2") == 3
        hb.finish()
    finally:
        hb.release.set()
        hb.stop.set()
    # Then the batch gave them back as it ended, without starting them; the held job acked
    assert started == [held]
    assert sorted(db.query("SELECT status, attempts, owner FROM nq_job WHERE id IN (%s, %s)",
                           tuple(waiting))) == [(0, 0, None)] * 2
    assert db.query("SELECT status FROM nq_job WHERE id = %s AND status <> 3", (held,)) == []
    assert hb.service.totals().given_back == 2
