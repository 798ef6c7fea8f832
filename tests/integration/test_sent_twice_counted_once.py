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


def _sent_by_both(db, monkeypatch, send_name: str, fails: bool):
    """Run one job on a consumer (one worker, a 1 s grace) that is stopped while the job runs;
    the job then ends (or fails, `fails`), and its worker's send (`queries.<send_name>`) is held,
    as by a server answering late, until the stop has sent the outcome too. Returns (the job's
    id, the consumer's totals, the threads' names in the order they sent)."""
    cfg = db.config(defaults={"lease_s": 120.0}, consumer={"shutdown_grace_s": 1.0})
    with Producer("q", cfg) as p:
        [job] = p.put_many([{"n": 1}])
    entered, release = threading.Event(), threading.Event()

    def handler(job) -> None:
        entered.set()
        assert release.wait(30)
        if fails:
            raise RuntimeError("boom")

    real_send = getattr(queries, send_name)
    stop_sent = threading.Event()
    sent_by: list[str] = []

    def send(*args, **kwargs):
        name = threading.current_thread().name
        if name == "notifyq-w1":
            assert stop_sent.wait(30), "the stop sent the outcome too"
        try:
            return real_send(*args, **kwargs)
        finally:
            sent_by.append(name)
            if name != "notifyq-w1":
                stop_sent.set()

    monkeypatch.setattr(queries, send_name, send)
    service = ConsumerService(cfg, ConsumeOptions(queues=("q",), function=handler, workers=1, batch_size=1))
    stop = threading.Event()
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.setdefault("rc", service.run(stop)), daemon=True)
    runner.start()
    try:
        assert entered.wait(30), "the job started"
        # (the consumer stopped, then the job ends: the worker's send waits past the grace's
        # end, and the stop sends the job's outcome as well)
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
    return job, service.totals(), sent_by


def test_a_job_acked_by_its_worker_and_by_the_stop_counts_done_once(db, monkeypatch):
    # Given a consumer stopped while its job runs, whose worker's ack of it is held (a server
    # answering late) until the stop has sent it too
    # When the job ends
    job, totals, sent_by = _sent_by_both(db, monkeypatch, "ack", fails=False)
    assert sent_by == ["notifyq-settle", "notifyq-w1"], sent_by
    # Then the job is done once in the table: gone, one attempt record, done
    assert db.query("SELECT id FROM nq_job WHERE id = %s", (job,)) == []
    assert db.query("SELECT outcome FROM nq_attempt WHERE job_id = %s", (job,)) == [("done",)]
    # And once in the consumer's counters, none of it lost
    assert (totals.succeeded, totals.lost_acks) == (1, 0), (totals.succeeded, totals.lost_acks)


def test_a_job_failed_by_its_worker_and_by_the_stop_counts_failed_once_and_never_lost(db, monkeypatch):
    """Regression: the failure's second send, fenced out, counted the job lost (lost_acks=1 and
    "acks lost: jobs were reclaimed from us") on top of failed=1: it could not tell its own
    claim's failure record, landed by the other send, from a reaper's take-back."""
    # Given a consumer stopped while its job runs, whose worker's send of the job's failure is
    # held (a server answering late) until the stop has sent it too
    # When the job fails
    job, totals, sent_by = _sent_by_both(db, monkeypatch, "reschedule_or_bury", fails=True)
    assert sent_by == ["notifyq-settle", "notifyq-w1"], sent_by
    # Then the failure landed once in the table: the job back to be retried, one failed record
    assert db.query("SELECT status, attempts FROM nq_job WHERE id = %s", (job,)) == [(1, 1)]
    assert db.query("SELECT outcome FROM nq_attempt WHERE job_id = %s", (job,)) == [("failed",)]
    # And once in the consumer's counters, none of it lost
    assert (totals.failed, totals.retried, totals.lost_acks) == (1, 1, 0), (totals.failed, totals.retried,
                                                                            totals.lost_acks)
