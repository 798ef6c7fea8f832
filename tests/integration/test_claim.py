"""The claim path against a real server: the order jobs are claimed in (priority, then run_at,
then id, for ready, due scheduled and due retried jobs alike), scheduling, pausing, SKIP LOCKED
behaviour. (The claim's plans are pinned by test_explain_small.py and test_explain_large.py.)"""

from __future__ import annotations

import json

from notifyq.produce.producer import Producer
from notifyq.store import queries
from notifyq.store.db import Session
from notifyq.store.sql import QUERIES

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


# ------------------------------------------------------------------ order


def test_claim_order_is_priority_then_oldest_run_at_then_id_for_ready_due_and_retried_jobs(db):
    # Given ready jobs at two priorities (one made older by hand), a scheduled job of priority 5
    # that fell due before the ready ones were enqueued, and a due retry of priority 9
    cfg = db.config()
    with Producer("q", cfg) as p:
        retried = p.put({"k": "retry"}, priority=9)
        a, c = p.put_many([{"n": "a"}, {"n": "c"}])  # one statement: one run_at, told apart by id
        b, d = p.put_many([{"n": "b"}, {"n": "d"}], priority=5)
        e = p.put({"n": "e"})
        f = p.put({"n": "f"}, priority=5, delay=3600)
    session = Session(cfg.dsn)
    try:
        claim = queries.claim(session, "q", OWNER, 1, 60)
        assert [j.id for j in claim.jobs] == [retried]
        assert queries.reschedule_or_bury(session, "q", claim.token, [(retried, 3600.0, "boom")]) == [retried]
        _make_due(db, [retried], seconds_ago=60)
        _make_due(db, [f], seconds_ago=600)
        _make_due(db, [e], seconds_ago=3600)
        # When a batch of 4 is claimed, then the rest one job at a time
        first = queries.claim(session, "q", OWNER, 4, 60)
        rest = _claim_order(session)
    finally:
        session.close()
    # Then higher priority comes first; within a priority the oldest run_at (a due scheduled or
    # retried job counts from when it became due), then the lower id; and a batch that left
    # jobs behind does not report the queue drained
    assert [j.id for j in first.jobs] == [retried, f, b, d]
    assert not first.drained
    assert rest == [e, a, c]


def test_a_retried_job_goes_behind_jobs_already_waiting_at_its_priority(db):
    # Given three ready jobs of one priority
    cfg = db.config()
    with Producer("q", cfg) as p:
        a, b, c = p.put_many([{"n": i} for i in range(3)])
    session = Session(cfg.dsn)
    try:
        # When the head job fails and is retried at once (no backoff)
        first = queries.claim(session, "q", OWNER, 1, 60)
        assert [j.id for j in first.jobs] == [a]
        queries.reschedule_or_bury(session, "q", first.token, [(a, 0.0, "boom")])
        # Then it queues behind the others: a failing job cannot hog the head of its level
        order = [queries.claim(session, "q", OWNER, 1, 60).jobs[0].id for _ in range(3)]
    finally:
        session.close()
    assert order == [b, c, a]


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


# ------------------------------------------------------------------ scheduling and pausing


def test_scheduled_jobs_are_invisible_to_claims_until_due(db):
    cfg = db.config()
    with Producer("q", cfg) as p:
        later = p.put({"x": 1}, delay=3600)
        now = p.put({"x": 2})
    session = Session(cfg.dsn)
    try:
        claim = queries.claim(session, "q", OWNER, 10, 60)
        assert [j.id for j in claim.jobs] == [now]
        _make_due(db, [later])
        claim = queries.claim(session, "q", OWNER, 10, 60)
        assert [j.id for j in claim.jobs] == [later]
    finally:
        session.close()


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


# ------------------------------------------------------------------ concurrency and parameters


def test_two_claimers_never_share_a_job_and_skip_each_others_locks(db):
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(50)])
    a, b = Session(cfg.dsn), Session(cfg.dsn)
    # A holds its lock step open (rows locked, not yet committed) ...
    cur = a.conn.cursor()
    cur.execute(QUERIES["claim_lock"], {"ids": ids[:20]})
    assert len(cur.fetchall()) == 20
    # ... while B claims: it skips A's rows instead of waiting, and takes the next ones
    claim = queries.claim(b, "q", "b" * 32, 20, 60)
    assert {j.id for j in claim.jobs} == set(ids[20:40])
    a.conn.rollback()
    a.close(), b.close()


def test_a_claim_of_one_job_takes_the_next_ready_one_past_a_few_that_peers_are_claiming(db):
    # Given 50 ready jobs, and peers whose claims hold the first 6 locked (rows locked, not yet
    # committed): as many consumers claiming at once do
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(50)])
    peer, mine = Session(cfg.dsn), Session(cfg.dsn)
    try:
        cur = peer.conn.cursor()
        cur.execute(QUERIES["claim_lock"], {"ids": ids[:6]})
        assert len(cur.fetchall()) == 6
        # When a consumer claims one job (a claim sized down for slower jobs)
        claim = queries.claim(mine, "q", "b" * 32, 1, 60)
        # Then it takes the next ready job: it read past the few its peers hold (it read 3
        # candidates, came back empty with 44 jobs ready, and its worker went idle)
        assert [j.id for j in claim.jobs] == [ids[6]]
        assert not claim.drained
        peer.conn.rollback()
    finally:
        peer.close(), mine.close()


def test_put_many_returns_the_stored_ids_and_payloads(db):
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(1234)])
    rows = db.query("SELECT id, payload FROM nq_job ORDER BY id")
    assert [r[0] for r in rows] == ids
    assert [json.loads(r[1])["n"] for r in rows] == list(range(1234))


def test_in_list_parameter_renders_as_a_parenthesised_list(db):
    # The claim's `IN %(ids)s` relies on mysqlclient rendering a sequence as (a,b,c);
    # callers never pass an empty list (store guards it): `IN ()` is a syntax error.
    session = Session(db.config().dsn)
    assert session.conn.literal([1, 2, 3]) == b"(1,2,3)"
    session.close()


def test_a_claimed_jobs_times_are_its_rows(db):
    """run_at and created_at come as text (bytes) from the claim, decoded when read: the same
    datetimes the driver reads from the row, naive (UTC), to the microsecond; by both claims
    (a watcher's one-step claim_take and the two steps)."""
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = [p.put({"n": n}) for n in range(3)]
    _make_due(db, ids[:1], seconds_ago=12.345678)
    rows = {r[0]: (r[1], r[2]) for r in db.query("SELECT id, run_at, created_at FROM nq_job WHERE id IN %s",
                                                 (tuple(ids),))}
    session = Session(cfg.dsn)
    try:
        jobs = queries.claim(session, "q", OWNER, 1, 60, as_watcher=True).jobs
        jobs += queries.claim(session, "q", OWNER, 2, 60).jobs
    finally:
        session.close()
    assert sorted(j.id for j in jobs) == ids
    for job in jobs:
        assert (job.run_at, job.created_at) == rows[job.id]
        assert job.run_at.tzinfo is None and job.run_at.microsecond == rows[job.id][0].microsecond
