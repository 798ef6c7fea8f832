"""Plans and costs of the claim (with its promotion of due jobs), retention and the metrics' queue
depth: index-bound, and flat from a small table to a large one.

Each statement runs once on a table of SMALL jobs and once on one of LARGE jobs with the same
mix (most of them kept history: done and dead; many scheduled in the future; few ready), and
the rows the server reads for it (the session's Handler_read_* counters) must not grow with
the table. The plans must name the intended index and sort nothing. LARGE defaults to 100k to
keep the suite fast; NOTIFYQ_EXPLAIN_ROWS=1000000 runs the full-size check.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import create_test_db, drop_test_db
from number_rows import numbers

from notifyq.store import admin_queries, queries, signal
from notifyq.store.db import Session
from notifyq.store.sql import QUERIES

SMALL = 1_000
LARGE = int(os.environ.get("NOTIFYQ_EXPLAIN_ROWS", "100000"))
LIMIT = 300  # the claim's candidate window (batch 100 x OVERFETCH)


def _fill(testdb, n: int) -> None:
    """n jobs, 2/3 on queue q: of every 100, 70 done, 20 dead (finished over the last n seconds),
    6 scheduled in the future, 2 ready, 1 due scheduled, 1 claimed."""
    testdb.query(
        "INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload, finished_at, "
        "                    owner, lease_until) "
        "SELECT IF(seq % 3 = 0, 'other', 'q'), st, seq % 7, "
        "       IF(st = 1 AND seq % 100 < 96, NOW(6) + INTERVAL seq SECOND, NOW(6) - INTERVAL seq SECOND), "
        "       5, '{}', IF(st >= 3, NOW(6) - INTERVAL seq SECOND, NULL), "
        "       IF(st = 2, 'x', NULL), IF(st = 2, NOW(6) + INTERVAL 1 HOUR, NULL) "
        "FROM (SELECT seq, CASE WHEN seq % 100 < 70 THEN 3 WHEN seq % 100 < 90 THEN 4 "
        "                       WHEN seq % 100 < 97 THEN 1 WHEN seq % 100 < 99 THEN 0 ELSE 2 END AS st "
        f"      FROM {numbers(n)}) s")
    testdb.query("ANALYZE TABLE nq_job")


@pytest.fixture(scope="module")
def tables(server_dsn, runtime_user):
    """{size: TestDB} filled once for the module."""
    made = {}
    try:
        for n in (SMALL, LARGE):
            made[n] = create_test_db(server_dsn, runtime_user)
            _fill(made[n], n)
        yield made
    finally:
        for testdb in made.values():
            drop_test_db(testdb)


def _rows_read(session: Session, run) -> int:
    """Rows the server read (index and table, every access method) while `run(cur)` ran."""
    cur = session.conn.cursor()

    def counters() -> int:
        cur.execute("SHOW SESSION STATUS LIKE 'Handler_read%%'")
        return sum(int(v) for k, v in cur.fetchall() if k != "Handler_read_key")

    before = counters()
    run(cur)
    after = counters()
    session.conn.rollback()  # nothing is changed: the costs are read, not the effects
    return after - before


def _explain(session: Session, name: str, params: dict) -> list[dict]:
    cur = session.conn.cursor()
    cur.execute("EXPLAIN " + QUERIES[name], params)
    names = [d[0] for d in cur.description]
    plan = [dict(zip(names, row)) for row in cur.fetchall()]
    session.conn.rollback()
    return plan


CHECKS = {
    # label: (statement, params, the index every nq_job access must use)
    "claim_ready": ("claim_ready", {"queue": "q", "limit": LIMIT}, {"ix_state"}),
    "due_any": ("due_any", {"queue": "q"}, {"ix_state"}),
    # A watcher's claim, read and locked in one: it locks what it reads, so in the index's order
    # (a sort would lock every ready row first) and only its window
    "claim_take": ("claim_take", {"queue": "q", "limit": LIMIT}, {"ix_state"}),
    # Its looks before it (the count, a due job, the pause): the due part as due_any's
    "watcher_looks": ("watcher_looks", {"queue": "q"}, {"ix_state"}),
    "claim_candidates": ("claim_candidates", {"queue": "q", "limit": LIMIT}, {"ix_state"}),
    # Read again past the jobs too new for an old consumer, only by a claim that met such jobs
    "claim_ready_for_version": ("claim_ready_for_version", {"queue": "q", "limit": LIMIT, "version": 1},
                                {"ix_state"}),
    "claim_candidates_for_version": ("claim_candidates_for_version", {"queue": "q", "limit": LIMIT, "version": 1},
                                     {"ix_state"}),
    "flow_key_ready": ("flow_key_ready", {"queue": "q", "key": "k", "limit": LIMIT}, {"ix_key"}),
    "flow_key_ready_for_version": ("flow_key_ready_for_version",
                                   {"queue": "q", "key": "k", "limit": LIMIT, "version": 1}, {"ix_key"}),
    "due_ids": ("due_ids", {"queue": "q", "limit": queries.PROMOTE_MAX}, {"ix_state"}),
    # An idle claim that came back empty asks it: a few rows, never the queue's backlog
    "claimable_left": ("claimable_left", {"queue": "q", "version": 1}, {"ix_state"}),
    "queue_depth": ("queue_depth", {"queue": "q", "cap": admin_queries.DEPTH_HISTORY_CAP}, {"ix_state"}),
    "retention_ids": ("retention_ids", {"queue": "q", "status": 3, "age_us": 0, "limit": 1000}, {"ix_state"}),
    # nothing old enough yet (a 30-day retention): the id-paged read this replaced walked the
    # whole table on every pass to find nothing
    "retention_ids_none": ("retention_ids", {"queue": "q", "status": 3, "age_us": 30 * 86400 * 10**6,
                                             "limit": 1000}, {"ix_state"}),
    # The reaper's questions, on the claimed range of ix_state: consumers x batch rows, however
    # many jobs wait or are kept (here the claimed rows are 1% of the table: the bound is them).
    "reap_needed": ("reap_needed", {"stale_us": 30 * 10**6}, {"ix_state"}),
    "expired_leases": ("expired_leases", {}, {"ix_state"}),
    "claims_of_owner": ("claims_of_owner", {"owner": "x"}, {"ix_state"}),
    "claims_expired": ("claims_expired", {"owners": ("x", "y")}, {"ix_state"}),
    "claim_ages": ("claim_ages", {}, {"ix_state"}),
}


DISTINCT_OWNERS = {"expired_leases"}


@pytest.mark.parametrize("label", sorted(CHECKS))
def test_statement_reads_an_index_range_without_sorting(tables, label):
    # Given the large table
    name, params, indexes = CHECKS[label]
    session = Session(tables[LARGE].dsn)
    try:
        # When the statement is explained
        plan = _explain(session, name, params)
    finally:
        session.close()
    # Then every read of nq_job is a range or ref on the intended index, with no filesort
    # or temporary table: the rows come in the order the statement needs
    text = json.dumps([{k: str(v) for k, v in row.items()} for row in plan]).lower()
    assert "filesort" not in text, plan
    # (expired_leases' DISTINCT collects the owners of the expired claims in a temporary table:
    # a handful of rows out of the claimed range, which the rows-read test below bounds)
    assert label in DISTINCT_OWNERS or "temporary" not in text, plan
    jobs = [row for row in plan if row["table"] == "nq_job"]
    assert jobs, plan
    for row in jobs:
        assert row["key"] in indexes and row["type"] in ("range", "ref"), (name, plan)


def _run(name: str, params: dict):
    def run(cur):
        cur.execute(QUERIES[name], params)
        if cur.description:
            cur.fetchall()
    return run


def _work_rows(testdb) -> int:
    return testdb.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = 'q' AND status IN (0, 1, 2)")


@pytest.mark.parametrize("label", sorted(CHECKS))
def test_rows_read_stay_flat_from_a_small_table_to_a_large_one(tables, label):
    name, params, _ = CHECKS[label]
    read = {}
    for n, testdb in tables.items():
        session = Session(testdb.dsn)
        try:
            overhead = _rows_read(session, lambda cur: cur.execute("DO 0"))  # SHOW STATUS's own reads
            read[n] = _rows_read(session, _run(name, params)) - overhead
        finally:
            session.close()
    print(f"\n{label}: rows read {read[SMALL]} with {SMALL} jobs, {read[LARGE]} with {LARGE}")
    # What each statement may read: its window or its chunk, never a share of the table. The
    # depth counts the queue's work exactly (ready, scheduled, claimed) and its history (done,
    # dead: 90% of the jobs here) only up to the cap (each capped count reads its rows twice:
    # the index, then the derived table).
    claimed = tables[LARGE].scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2")
    bound = {"claim_ready": LIMIT + 10, "claim_take": LIMIT + 10, "watcher_looks": 10 + signal.SIGNAL_SLOTS, "due_any": 10, "claim_candidates": 2 * LIMIT + 10, "due_ids": queries.PROMOTE_MAX + 10,
             "claimable_left": 10,
             "claim_ready_for_version": LIMIT + 10, "claim_candidates_for_version": 2 * LIMIT + 10,
             "flow_key_ready": LIMIT + 10, "flow_key_ready_for_version": LIMIT + 10,
             "retention_ids": 1000 + 10, "retention_ids_none": 10,
             "queue_depth": _work_rows(tables[LARGE]) + 4 * admin_queries.DEPTH_HISTORY_CAP + 10,
             "reap_needed": claimed + 10, "expired_leases": claimed + 10, "claims_of_owner": 2 * claimed + 10,
             "claims_expired": claimed + 10, "claim_ages": 2 * claimed + 10}[label]
    assert read[LARGE] <= bound, (read, bound)


@pytest.mark.parametrize("name", ["claim_ready", "claim_candidates", "flow_key_ready"])
def test_every_claims_candidate_read_of_ready_jobs_is_index_only(tables, name):
    # Given the large table
    params = {"queue": "q", "key": "k", "limit": LIMIT}
    session = Session(tables[LARGE].dsn)
    try:
        # When a candidate read that every claim makes (of a plain, due or limited queue) is explained
        plan = _explain(session, name, {p: v for p, v in params.items() if f"%({p})s" in QUERIES[name]})
    finally:
        session.close()
    # Then its read of the ready jobs (the first; claim_candidates' due part reads the few due
    # rows for their priority) is the index alone, no row ("Using index" itself, not "Using
    # index condition"): the version filter, which needs each candidate's row, is in the
    # *_for_version reads that only a claim that met jobs too new for its consumer makes
    ready = [row for row in plan if row["table"] == "nq_job"][0]
    assert "using index" in [e.strip() for e in str(ready["Extra"]).lower().split(";")], plan
