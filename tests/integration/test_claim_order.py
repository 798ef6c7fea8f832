"""Claim order holds for every claimable job: ready, due scheduled and due retries are all taken
in (priority, run_at, id) order, and the claim stays index-bound however many jobs wait."""

from __future__ import annotations

from notifyq.produce.producer import Producer
from notifyq.store import queries
from notifyq.store.db import Session

OWNER = "o" * 32


def _claim_order(session: Session, batch_size: int = 1) -> list[int]:
    order = []
    while True:
        claim = queries.claim(session, "q", OWNER, batch_size, 60)
        if not claim.jobs:
            return order
        order += [job.id for job in claim.jobs]


def _make_due(db, ids: list[int], seconds_ago: float = 1.0) -> None:
    db.query("UPDATE nq_job SET run_at = NOW(6) - INTERVAL %s MICROSECOND WHERE id IN %s",
             (int(seconds_ago * 1e6), tuple(ids)))


def test_a_due_high_priority_job_is_claimed_before_due_low_priority_ones(db):
    # Given 5 due low-priority scheduled jobs, then 1 due high-priority one
    cfg = db.config()
    with Producer("q", cfg) as p:
        low = [p.put({"n": i}, delay=3600) for i in range(5)]
        high = p.put({"n": 99}, delay=3600, priority=9)
    _make_due(db, low + [high])
    # When a consumer claims one job at a time
    session = Session(cfg.dsn)
    order = _claim_order(session)
    session.close()
    # Then the high-priority job comes first, then the others oldest first
    assert order == [high] + low


def test_ready_due_scheduled_and_due_retries_are_claimed_in_one_priority_order(db):
    # Given ready jobs of priority 0 and 5, a due scheduled job of priority 5 that fell due
    # before the ready ones were enqueued, and a due retry of priority 9
    cfg = db.config()
    with Producer("q", cfg) as p:
        due_scheduled = p.put({"k": "scheduled"}, delay=3600, priority=5)
        retried = p.put({"k": "retry"}, priority=9)
        ready_low = p.put_many([{"k": "low"}] * 3)
        ready_mid = p.put_many([{"k": "mid"}] * 2, priority=5)
    session = Session(cfg.dsn)
    claim = queries.claim(session, "q", OWNER, 1, 60)
    assert [j.id for j in claim.jobs] == [retried]
    assert queries.fail(session, "q", claim.token, [(retried, 3600.0, "boom")]) == [retried]
    _make_due(db, [due_scheduled, retried], seconds_ago=60)
    # When a consumer claims one job at a time
    order = _claim_order(session)
    session.close()
    # Then: priority first; within a priority the earliest run_at (the job due a minute ago
    # before the ready ones enqueued since)
    assert order == [retried, due_scheduled, *ready_mid, *ready_low]


def test_a_due_job_with_the_best_priority_is_claimed_first_behind_a_big_backlog_of_due_jobs(db):
    # Given 500 due low-priority jobs (far more than the candidate read's window), then one due
    # high-priority job
    cfg = db.config()
    with Producer("q", cfg) as p:
        low = p.put_many([{"n": i} for i in range(500)], delay=3600)
        high = p.put({"n": "high"}, delay=3600, priority=3)
    _make_due(db, low + [high])
    # When a consumer claims a batch of 10
    session = Session(cfg.dsn)
    claim = queries.claim(session, "q", OWNER, 10, 60)
    session.close()
    # Then the high-priority job leads it, and the rest are the oldest low-priority ones
    assert [j.id for j in claim.jobs] == [high] + low[:9]


def test_a_paused_queue_promotes_nothing(db):
    # Given a paused queue with a due scheduled job
    cfg = db.config()
    with Producer("q", cfg) as p:
        job = p.put({"n": 1}, delay=3600)
    _make_due(db, [job])
    session = Session(cfg.dsn)
    queries.set_paused(session, "q", True)
    # When a consumer tries to claim
    claim = queries.claim(session, "q", OWNER, 10, 60)
    session.close()
    # Then nothing is claimed and the job is still scheduled
    assert claim.paused and not claim.jobs
    assert db.scalar("SELECT status FROM nq_job WHERE id = %s", (job,)) == 1


def test_a_batch_runs_in_the_claim_order_of_its_rows_as_locked_not_as_first_read(db, monkeypatch):
    # Given three ready jobs of one priority, and a peer that, between this claim's candidate
    # read and its locking read, retried the oldest one (due again now, so it sorts last)
    cfg = db.config()
    with Producer("q", cfg) as p:
        first, second, third = p.put_many([{"n": i} for i in range(3)])
    real_ids = queries.Ids
    retried = []

    def ids_then_retry_first(ids):
        if not retried:  # the first Ids() of a claim is its locking read's window
            retried.append(first)
            db.query("UPDATE nq_job SET status = 1, run_at = NOW(6), attempts = 1 WHERE id = %s", (first,))
        return real_ids(ids)

    monkeypatch.setattr(queries, "Ids", ids_then_retry_first)
    # When a consumer claims all three in one batch
    session = Session(cfg.dsn)
    claim = queries.claim(session, "q", OWNER, 3, 60)
    session.close()
    # Then the batch runs them by their current run_at: the retried job last
    assert retried == [first]
    assert [j.id for j in claim.jobs] == [second, third, first]
