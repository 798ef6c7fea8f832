"""Version-aware claims (issue 40 item 11): a job put with min_version is never claimed by a
consumer of a lower code version; jobs without one are claimed by every consumer."""

from __future__ import annotations

import pytest
from conftest import admin_connect

import notifyq
from notifyq import errors
from notifyq.config import load
from notifyq.tasks import TaskRegistry
from notifyq.store import queries
from notifyq.store.db import Session
from notifyq.store.flow import FlowClaims, FlowLimits

OWNER = "o" * 32


def _claim_all(session: Session, version: int, batch_size: int = 10) -> list[int]:
    claim = queries.claim(session, "q", OWNER, batch_size, 60, version=version)
    return [job.id for job in claim.jobs]


def test_an_old_consumer_never_claims_a_job_that_needs_newer_code(db):
    # Given a plain job, one that needs version 3 and one that needs version 5
    cfg = db.config()
    with notifyq.Producer("q", cfg) as p:
        plain = p.put({"n": 0})
        v3 = p.put({"n": 3}, min_version=3)
        v5, v5b = p.put_many([{"n": 5}, {"n": 6}], min_version=5)
    session = Session(cfg.dsn)
    try:
        # When consumers of versions 0, 2, 4 and 5 claim in turn
        # Then each takes only what its code may run, and what it leaves stays ready
        assert _claim_all(session, 0) == [plain]
        assert _claim_all(session, 2) == []
        assert _claim_all(session, 4) == [v3]
        assert _claim_all(session, 5) == [v5, v5b]
    finally:
        session.close()
    assert db.query("SELECT id, min_version FROM nq_job ORDER BY id") == [
        (plain, None), (v3, 3), (v5, 5), (v5b, 5)]


def test_a_claim_that_finds_only_newer_jobs_takes_nothing_and_counts_as_drained(db):
    # Given only jobs that need version 2, more than one claim reads
    cfg = db.config()
    with notifyq.Producer("q", cfg) as p:
        p.put_many([{"n": i} for i in range(3 * 2 + 1)], min_version=2)
        signal_total = db.scalar("SELECT SUM(seq) FROM nq_signal WHERE queue = 'q'")
    session = Session(cfg.dsn)
    try:
        # When a version-1 consumer's watcher claims a batch of 2
        claim = queries.claim(session, "q", OWNER, 2, 60, version=1, as_watcher=True)
        # Then it takes nothing and says drained, and records every enqueue as watched: it
        # waits for the next wake-up (a new put) instead of claiming again in a loop
        assert claim.jobs == [] and claim.drained
        assert db.scalar("SELECT watched_seq FROM nq_queue WHERE queue = 'q'") == signal_total
        # And the jobs stay ready for a version-2 consumer
        assert len(_claim_all(session, 2)) == 7
    finally:
        session.close()


def test_an_old_consumer_takes_the_older_jobs_behind_a_long_run_of_newer_ones(db):
    # Given more jobs that need version 2 than one claim reads, ahead of (higher priority than)
    # a plain job
    cfg = db.config()
    with notifyq.Producer("q", cfg) as p:
        needs_new = p.put_many([{"n": i} for i in range(3 * 2 + 1)], min_version=2, priority=5)
        plain = p.put({"n": "plain"})
    session = Session(cfg.dsn)
    try:
        # When a version-1 consumer claims a batch of 2 (it reads 6 candidates)
        claim = queries.claim(session, "q", OWNER, 2, 60, version=1)
        # Then it takes the plain job, and the queue is drained for it
        assert [j.id for j in claim.jobs] == [plain] and claim.drained
        # And a version-2 consumer takes the rest in priority order
        assert _claim_all(session, 2) == needs_new
    finally:
        session.close()


def test_an_old_consumer_is_not_stalled_by_hundreds_of_newer_jobs_at_the_head_of_the_queue(db):
    # Given 400 jobs that need version 2 put first, then 5 that version 1 runs (3 without a
    # minimum, 2 that need version 1): claim order puts them last (same priority, put later)
    cfg = db.config()
    with notifyq.Producer("q", cfg) as p:
        p.put_many([{"n": i} for i in range(400)], min_version=2)
        old = p.put_many([{"n": i} for i in range(3)])
        old += p.put_many([{"n": i} for i in range(3, 5)], min_version=1)
    session = Session(cfg.dsn)
    try:
        # When a version-1 consumer claims a batch of 10 (it reads 30 candidates)
        claim = queries.claim(session, "q", OWNER, 10, 60, version=1)
        # Then it takes the jobs it may run at once, and has drained the queue for its code
        assert [j.id for j in claim.jobs] == old and claim.drained
    finally:
        session.close()
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 0 AND min_version = 2") == 400


def test_an_old_consumer_takes_jobs_fallen_due_behind_hundreds_of_newer_ones(db):
    # Given 400 ready jobs that need version 2, then 5 scheduled jobs any consumer runs, due now
    # (after the 400 in claim order): the claim promotes them and reads claim_candidates
    cfg = db.config()
    with notifyq.Producer("q", cfg) as p:
        p.put_many([{"n": i} for i in range(400)], min_version=2)
        old = p.put_many([{"n": i} for i in range(5)], delay=3600)
    db.query("UPDATE nq_job SET run_at = NOW(6) WHERE id IN %s", (old,))
    session = Session(cfg.dsn)
    try:
        # When a version-1 consumer claims a batch of 10
        claim = queries.claim(session, "q", OWNER, 10, 60, version=1)
        # Then it takes the 5 at once
        assert [j.id for j in claim.jobs] == old and claim.drained
    finally:
        session.close()


@pytest.mark.parametrize("limits, key", [
    (FlowLimits(limit_per_key=100), "a"),  # a key's first jobs (flow_key_ready)
    (FlowLimits(fair=True), "a"),
    (FlowLimits(limit=1000), None),  # a limited queue's unkeyed jobs (flow_unkeyed_ready)
], ids=["limit_per_key", "fair", "limit_unkeyed"])
def test_an_old_consumer_of_a_flow_controlled_queue_takes_the_jobs_behind_newer_ones(db, limits, key):
    # Given, on a queue with limits or fairness, 400 jobs that need version 2, then 5 that
    # version 1 runs, all of one key (or none)
    cfg = db.config()
    with notifyq.Producer("q", cfg) as p:
        p.put_many([{"n": i} for i in range(400)], min_version=2, key=key)
        old = p.put_many([{"n": i} for i in range(5)], key=key)
    session = Session(cfg.dsn)
    try:
        # When a version-1 consumer claims a batch of 10
        claim = queries.claim(session, "q", OWNER, 10, 60, version=1, flow=FlowClaims(limits))
        # Then it takes the 5 at once, and has drained the queue for its code
        assert [j.id for j in claim.jobs] == old and claim.drained
        # And a claim with only newer jobs left takes nothing and counts as drained (no busy loop)
        again = queries.claim(session, "q", OWNER, 10, 60, version=1, flow=FlowClaims(limits))
        assert again.jobs == [] and again.drained
    finally:
        session.close()


def _selects(session: Session) -> int:
    """The SELECT statements the session's connection has run (its claim's COMMIT read first)."""
    session.pipeline.read_reply()
    cur = session.conn.cursor()
    cur.execute("SHOW SESSION STATUS LIKE 'Com_select'")
    return int(cur.fetchone()[1])


def _claim_selects(db, jobs: list[tuple[int | None, int]]) -> int:
    """SELECT statements of one claim (batch 5, consumer version 1, which takes 5 jobs) of a
    fresh queue of `jobs` put in order, each (min_version, how many)."""
    db.query("DELETE FROM nq_job")
    with notifyq.Producer("q", db.config()) as p:
        for min_version, n in jobs:
            p.put_many([{"n": i} for i in range(n)], min_version=min_version)
    session = Session(db.config().dsn)
    try:
        before = _selects(session)
        claim = queries.claim(session, "q", OWNER, 5, 60, version=1)
        assert len(claim.jobs) == 5
        return _selects(session) - before
    finally:
        session.close()


def test_a_claim_reads_its_candidates_again_only_when_it_met_jobs_too_new_for_it(db):
    # Given queues a version-1 consumer claims a batch of 5 from (it reads 15 candidates):
    # plain jobs; 5 jobs that need version 1, then jobs too new for it; 20 jobs too new for it,
    # then 5 plain ones
    plain = _claim_selects(db, [(None, 20)])
    versioned = _claim_selects(db, [(1, 5), (2, 15)])
    behind_newer = _claim_selects(db, [(2, 20), (None, 5)])
    # Then a claim that locked no job too new for it reads as a plain one does (the version
    # filter is not on its candidate read, which every claim makes); one that did lock only
    # such jobs (three windows of 5) reads once more: the candidates past them, and the one
    # locking read of the 5 it takes
    assert versioned == plain
    assert behind_newer == plain + 2 + 2


def test_an_old_consumer_of_a_limited_key_takes_no_more_than_its_limit_over_both_reads(db):
    # Given a key limited to 3 running jobs, whose ready jobs alternate: one version 1 runs, one
    # that needs version 2, ... then more that version 1 runs
    cfg = db.config()
    with notifyq.Producer("q", cfg) as p:
        first = []
        for i in range(3):
            first.append(p.put({"n": i}, key="a"))
            p.put({"n": i}, key="a", min_version=2)
        later = p.put_many([{"n": i} for i in range(5)], key="a")
    session = Session(cfg.dsn)
    try:
        # When a version-1 consumer claims a batch of 10 (its first read stops at the key's 3
        # free slots: 2 jobs it runs and 1 too new)
        flow = FlowClaims(FlowLimits(limit_per_key=3))
        claim = queries.claim(session, "q", OWNER, 10, 60, version=1, flow=flow)
        # Then its read past the too-new jobs fills the key's last slot, in claim order, and no
        # more (the jobs the limit holds back count as taken: drained, as for any limited key)
        assert [j.id for j in claim.jobs] == first and claim.drained
        assert queries.claim(session, "q", OWNER, 10, 60, version=1, flow=flow).jobs == []
    finally:
        session.close()
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2") == 3
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 0 AND min_version IS NULL") == len(later)


def test_a_put_with_min_version_rides_the_callers_transaction(db):
    cfg = db.config()
    conn = admin_connect(db.admin, db.admin.database)
    conn.autocommit(False)
    try:
        with notifyq.Producer("q", cfg) as p:
            job = p.put({"n": 1}, min_version=7, conn=conn)
            conn.rollback()
            assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
            job = p.put({"n": 1}, min_version=7, conn=conn)
            conn.commit()
    finally:
        conn.close()
    assert db.query("SELECT id, min_version FROM nq_job") == [(job, 7)]


@pytest.mark.parametrize("kwargs, message", [
    ({"min_version": -1}, "min_version"),
    ({"min_version": 2 ** 32}, "min_version"),
    ({"min_version": "3"}, "min_version"),
    ({"min_version": 1, "dedup_key": "k"}, "min_version and dedup_key"),
])
def test_a_bad_min_version_is_one_clear_error_and_nothing_is_written(db, kwargs, message):
    with notifyq.Producer("q", db.config()) as p:
        with pytest.raises(errors.InputError, match=message):
            p.put({"n": 1}, **kwargs)
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0


def test_the_consumers_version_comes_from_its_config_or_the_environment(tmp_path):
    cfg = tmp_path / "nq.toml"
    cfg.write_text("[consumer]\nversion = 12\n")
    assert load({"NOTIFYQ_CONFIG": str(cfg)}).consumer.version == 12
    assert load({"NOTIFYQ_CONFIG": str(cfg), "NOTIFYQ_VERSION": "13"}).consumer.version == 13
    assert load({"NOTIFYQ_CONFIG": str(cfg)}, overrides={"consumer": {"version": 14}}).consumer.version == 14
    cfg.write_text("[consumer]\nversion = -1\n")
    with pytest.raises(errors.ConfigError, match="consumer.version"):
        load({"NOTIFYQ_CONFIG": str(cfg)})


def test_a_tasks_min_version_rides_every_enqueue(db):
    registry = TaskRegistry()
    registry.configure(db.config())
    try:
        @registry.task(queue="q", min_version=4)
        def needs_new(n: int) -> int:
            return n

        @registry.task(queue="q")
        def any_code(n: int) -> int:
            return n

        new_id, any_id = needs_new.enqueue(1), any_code.enqueue(2)
    finally:
        registry.close()
    assert db.query("SELECT id, min_version FROM nq_job ORDER BY id") == [(new_id, 4), (any_id, None)]
    with pytest.raises(errors.InputError, match="min_version"):
        registry.task(queue="q", min_version=-1)(lambda: None)


def test_a_waiting_workflow_job_keeps_its_min_version_once_released(db):
    # Given a parent and a child put after it that needs version 3
    cfg = db.config()
    with notifyq.Producer("q", cfg) as p:
        parent = p.put({"n": 0})
        child = p.put({"n": 1}, after=[parent], min_version=3)
    assert db.query("SELECT id, min_version FROM nq_job ORDER BY id") == [(parent, None), (child, 3)]
    session = Session(cfg.dsn)
    try:
        # When the parent is done (claimed and acked), which releases the child
        claim = queries.claim(session, "q", OWNER, 10, 60, version=0)
        assert [j.id for j in claim.jobs] == [parent]
        queries.claim(session, "q", OWNER, 10, 60, version=0,
                      acks=queries.Acks([parent], claim.token, keep=False))
        # Then an old consumer leaves the released child alone and a version-3 one takes it
        assert _claim_all(session, 2) == []
        assert _claim_all(session, 3) == [child]
    finally:
        session.close()
