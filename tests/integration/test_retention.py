"""Retention through ix_state (periodic.purge_finished): chunks, budget, and what it spares."""

from __future__ import annotations

from notifyq.consume import periodic
from notifyq.jobs import Status
from notifyq.produce.producer import Producer
from notifyq.store.db import Session


def _finished(db, cfg, queue: str, n: int, status: int, seconds_ago: int) -> list[int]:
    with Producer(queue, cfg) as p:
        ids = p.put_many([{"n": i} for i in range(n)])
    db.query("UPDATE nq_job SET status = %s, finished_at = NOW(6) - INTERVAL %s SECOND WHERE id IN %s",
             (status, seconds_ago, ids))
    return ids


def test_retention_purges_in_chunks_within_a_budget_and_spares_recent_other_and_pending_jobs(db):
    # Given 25 old done and 10 old dead jobs of queue q, recent ones, another queue's, and pending ones
    cfg = db.config()
    _finished(db, cfg, "q", 25, Status.DONE, 7200)
    _finished(db, cfg, "q", 10, Status.DEAD, 7200)
    keep = (_finished(db, cfg, "q", 3, Status.DONE, 60) + _finished(db, cfg, "q", 3, Status.DEAD, 60)
            + _finished(db, cfg, "other", 4, Status.DEAD, 7200))
    with Producer("q", cfg) as p:
        keep += [p.put({"ready": 1}), p.put({"later": 1}, delay=3600)]
    session = Session(cfg.dsn)
    try:
        # When retention (1 h) runs with chunks of 10 and a budget of 2 chunks, then again
        first = periodic.purge_finished(session, "q", 3600, chunk=10, max_chunks=2)
        second = periodic.purge_finished(session, "q", 3600, chunk=10, max_chunks=10)
    finally:
        session.close()
    # Then the first pass stops after 20 rows, the second finishes, and only the old finished
    # jobs of q are gone
    assert first == (20, False)
    assert second == (15, True)
    assert sorted(r[0] for r in db.query("SELECT id FROM nq_job")) == sorted(keep)


def test_a_job_retried_between_the_read_and_the_delete_is_spared_and_the_pass_ends(db):
    # Given old dead jobs, one of which an operator sends back to ready after retention read it
    cfg = db.config()
    ids = _finished(db, cfg, "q", 5, Status.DEAD, 7200)
    session = Session(cfg.dsn)
    real = periodic.admin_queries.retention_ids

    def read_then_retry(*args, **kw):
        found = real(*args, **kw)
        db.query("UPDATE nq_job SET status = 0, finished_at = NULL WHERE id = %s", (ids[0],))
        return found

    periodic.admin_queries.retention_ids = read_then_retry
    try:
        deleted, complete = periodic.purge_finished(session, "q", 3600, chunk=5)
    finally:
        periodic.admin_queries.retention_ids = real
        session.close()
    # Then the retried job stays and the pass completes
    assert (deleted, complete) == (4, True)
    assert db.query("SELECT id, status FROM nq_job") == [(ids[0], 0)]


def test_the_retention_index_migration_can_run_again_after_an_interrupted_init(db):
    # Given a database whose init added the index but stopped before recording the version
    from notifyq.store import schema
    from notifyq.store.sql import migrations

    mine = next(v for v, text in migrations() if "ix_finished" in text)
    db.query("UPDATE nq_meta SET value = %s WHERE name = 'schema_version'", (str(mine - 1),))
    # When `notifyq init` runs again (it applies every migration from there on)
    assert schema.init(db.admin) == (mine - 1, schema.code_version())
    # Then the version is current, and the index that took over ix_finished's range (version 5)
    # is there once, ix_finished (made again by its migration) gone again
    indexes = [r[0] for r in db.query("SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS "
                                      "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'nq_job'")]
    assert "ix_state" in indexes and "ix_finished" not in indexes, indexes


def test_the_sweep_drops_the_keys_of_ended_jobs_and_keeps_the_held_ones(db):
    # Given keys held by pending jobs and keys whose jobs ended (done and kept, acked and deleted)
    from notifyq.store import dedup

    cfg = db.config()
    with Producer("q", cfg) as p:
        held = {k: p.put({}, dedup_key=k) for k in ("a", "c", "e")}
        ended = [p.put({}, dedup_key=k) for k in ("b", "d", "f", "g")]
    db.query("UPDATE nq_job SET status = 3, finished_at = NOW(6) WHERE id IN %s", (ended[:2],))
    db.query("DELETE FROM nq_job WHERE id IN %s", (ended[2:],))
    session = Session(cfg.dsn)
    try:
        # When the sweep runs in chunks of 2 until it has read every key of the queue
        deleted, after, passes = 0, "", 0
        while True:
            n, after = dedup.sweep(session, "q", after, chunk=2)
            deleted, passes = deleted + n, passes + 1
            if not after:
                break
    finally:
        session.close()
    # Then the ended jobs' keys are gone, in more than one pass, and the held ones stay
    assert (deleted, passes) == (4, 3)
    assert db.query("SELECT dedup_key, job_id FROM nq_dedup ORDER BY dedup_key") == sorted(held.items())
    # And the keys behave as before: held ones dedup, swept ones take a new job
    with Producer("q", cfg) as p:
        assert p.put({}, dedup_key="a") == held["a"]
        assert p.put({}, dedup_key="b") not in ended
