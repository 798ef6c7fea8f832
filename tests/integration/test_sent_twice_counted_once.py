"""A job whose outcome is sent twice, by its worker and by the stop (the worker's send held by
the server past the grace's end: the stop sends `Batch.sending` again, fenced by the claim's
token), lands once in the table and counts once in the consumer's own counters (its summary,
its stopped line, its metrics): the send that finds the job acked already by the other one
counts nothing.

Regression: the second send's ack, fenced out, asked which of its jobs this claim had acked
(completions_landed, for a retried ack whose first reply was lost) and counted them done again:
done=2 for one job.
"""

from __future__ import annotations

import threading

from conftest import wait_until

from notifyq.consume.service import ConsumeOptions, ConsumerService
from notifyq.produce.producer import Producer
from notifyq.store import queries


def test_a_job_acked_by_its_worker_and_by_the_stop_counts_done_once(db, monkeypatch):
    # Given a consumer (one worker, a 1 s grace) running a job until the test releases it, whose
    # worker's ack of it is held (a server answering late) until the stop has sent it too
    cfg = db.config(defaults={"lease_s": 120.0}, consumer={"shutdown_grace_s": 1.0})
    with Producer("q", cfg) as p:
        [job] = p.put_many([{"n": 1}])
    entered, release = threading.Event(), threading.Event()

    def handler(job) -> None:
        entered.set()
        assert release.wait(30)

    real_ack = queries.ack
    stop_sent = threading.Event()
    acked_by: list[str] = []

    def ack(session, ids, token, keep, acks=None):
        name = threading.current_thread().name
        if name == "notifyq-w1":
            assert stop_sent.wait(30), "the stop sent the outcome too"
        try:
            return real_ack(session, ids, token, keep, acks)
        finally:
            acked_by.append(name)
            if name != "notifyq-w1":
                stop_sent.set()

    monkeypatch.setattr(queries, "ack", ack)
    service = ConsumerService(cfg, ConsumeOptions(queues=("q",), function=handler, workers=1, batch_size=1))
    stop = threading.Event()
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.setdefault("rc", service.run(stop)), daemon=True)
    runner.start()
    try:
        assert entered.wait(30), "the job started"
        # When the consumer is stopped and the job then ends: the worker's ack waits past the
        # grace's end, and the stop sends the job's outcome as well
        stop.set()
        wait_until(lambda: service.stop.is_set(), 10, message="the consumer draining")
        release.set()
        runner.join(30)
        [thread] = service.threads()
        thread.join(30)
    finally:
        release.set()
        stop_sent.set()
        stop.set()
    assert not runner.is_alive() and not thread.is_alive() and outcome.get("rc") == 0, outcome
    assert acked_by == ["notifyq-settle", "notifyq-w1"], acked_by
    # Then the job is done once in the table: gone, one attempt record, done
    assert db.query("SELECT id FROM nq_job WHERE id = %s", (job,)) == []
    assert db.query("SELECT outcome FROM nq_attempt WHERE job_id = %s", (job,)) == [("done",)]
    # And once in the consumer's counters, none of it lost
    totals = service.totals()
    assert (totals.succeeded, totals.lost_acks) == (1, 0), (totals.succeeded, totals.lost_acks)


def test_a_job_failed_by_its_worker_and_by_the_stop_counts_failed_once_and_never_lost(db, monkeypatch):
    """Regression: the failure's second send, fenced out, counted the job lost (lost_acks=1 and
    "acks lost: jobs were reclaimed from us") on top of failed=1: it could not tell its own
    claim's failure record, landed by the other send, from a reaper's take-back."""
    # Given a consumer (one worker, a 1 s grace) running a job that fails once the test releases
    # it, whose worker's send of the failure is held (a server answering late) until the stop
    # has sent it too
    cfg = db.config(defaults={"lease_s": 120.0}, consumer={"shutdown_grace_s": 1.0})
    with Producer("q", cfg) as p:
        [job] = p.put_many([{"n": 1}])
    entered, release = threading.Event(), threading.Event()

    def handler(job) -> None:
        entered.set()
        assert release.wait(30)
        raise RuntimeError("boom")

    real_fail = queries.reschedule_or_bury
    stop_sent = threading.Event()
    sent_by: list[str] = []

    def reschedule_or_bury(session, queue, token, failures, wake=False):
        name = threading.current_thread().name
        if name == "notifyq-w1":
            assert stop_sent.wait(30), "the stop sent the outcome too"
        try:
            return real_fail(session, queue, token, failures, wake)
        finally:
            sent_by.append(name)
            if name != "notifyq-w1":
                stop_sent.set()

    monkeypatch.setattr(queries, "reschedule_or_bury", reschedule_or_bury)
    service = ConsumerService(cfg, ConsumeOptions(queues=("q",), function=handler, workers=1, batch_size=1))
    stop = threading.Event()
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.setdefault("rc", service.run(stop)), daemon=True)
    runner.start()
    try:
        assert entered.wait(30), "the job started"
        # When the consumer is stopped and the job then fails: the worker's send waits past the
        # grace's end, and the stop sends the job's failure as well
        stop.set()
        wait_until(lambda: service.stop.is_set(), 10, message="the consumer draining")
        release.set()
        runner.join(30)
        [thread] = service.threads()
        thread.join(30)
    finally:
        release.set()
        stop_sent.set()
        stop.set()
    assert not runner.is_alive() and not thread.is_alive() and outcome.get("rc") == 0, outcome
    assert sent_by == ["notifyq-settle", "notifyq-w1"], sent_by
    # Then the failure landed once in the table: the job back to be retried, one failed record
    assert db.query("SELECT status, attempts FROM nq_job WHERE id = %s", (job,)) == [(1, 1)]
    assert db.query("SELECT outcome FROM nq_attempt WHERE job_id = %s", (job,)) == [("failed",)]
    # And once in the consumer's counters, none of it lost
    totals = service.totals()
    assert (totals.failed, totals.retried, totals.lost_acks) == (1, 1, 0), (totals.failed, totals.retried,
                                                                            totals.lost_acks)
