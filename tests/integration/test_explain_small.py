"""Plans of the by-id statements on a SMALL table (300 jobs).

test_claim.py locks the claim's plan on 100k rows. On a few hundred rows the optimizer judged
a 100-id IN list not worth a range read and scanned instead (a full table scan, or a full scan
of PRIMARY or of a status index), and a locking scan locks every row it passes: consumers waited on,
and deadlocked over, each other's claimed rows. These statements now say FORCE INDEX (PRIMARY);
each EXPLAIN here must show a PRIMARY key range.
"""

import re

import pytest

from notifyq.produce.producer import Producer
from notifyq.store import admin_queries, queries
from notifyq.store.db import Session
from notifyq.store.driver import Ids, IntList
from notifyq.store.sql import QUERIES

OWNER = "e" * 32
# Pinned by name, not found by their hint: dropping FORCE INDEX from one of them must fail its
# test here, not quietly take it off the list.
BY_ID = ("claim_lock", "claim_mark", "ack_delete", "ack_keep", "give_back", "extend_lease",
         "claims_owned", "claims_owned_lock", "return_alone", "return_shared", "job_retry", "job_purge",
         "promote_due", "keyed_jobs", "attempt_acked", "attempt_acked_dense", "attempt_taken_back",
         "jobs_cancel_check", "job_record_gone", "jobs_status", "rate_keys", "require_version",
         "web_workflow_jobs", "unclaim_token", "claims_lock", "claims_expired_lock", "flow_count_release",
         "flow_count_forget_taken")
# The attempt records a batch's ids name: read by nq_attempt's primary key (job_id, claim_token).
ATTEMPTS_BY_ID = ("completions_landed", "results_missing", "attempts_purge")
CLAIM_STEPS = {"claim_lock", "claim_mark", "promote_due"}
GOOD_ACCESS = ("range", "const", "eq_ref")


@pytest.fixture
def small_queue(db):
    """300 jobs on queue q: 100 claimed by OWNER (the claim's token), 200 ready."""
    cfg = db.config()
    with Producer("q", cfg) as p:
        p.put_many([{"n": i} for i in range(300)])
    session = Session(cfg.dsn)
    try:
        claim = queries.claim(session, "q", OWNER, 100, 60)
        yield session, claim
    finally:
        session.conn.rollback()  # EXPLAIN opened a transaction: its metadata lock blocks the DROP
        session.close()


def explain(session: Session, sql: str, params: dict) -> list[dict]:
    cur = session.conn.cursor()
    cur.execute("EXPLAIN " + sql, params)
    names = [d[0] for d in cur.description]  # by name: MySQL 8 adds a `partitions` column
    return [dict(zip(names, row)) for row in cur.fetchall()]


def bound(name: str, claim: queries.Claim, ready_ids: list[int]) -> dict:
    """Real values for exactly the parameters the statement names: the claim steps take ready
    jobs, the others act on the claimed ones."""
    claimed = [job.id for job in claim.jobs]
    values = {"ids": Ids(ready_ids if name in CLAIM_STEPS else claimed), "owner": OWNER,
              "token": claim.token, "lease_us": 60_000_000, "error": "lease expired", "status": 3,
              "cancelled": "cancelled", "host": "h", "id_list": IntList(claimed),
              "started_offsets": IntList(-1000 for _ in claimed), "ended_offsets": IntList(0 for _ in claimed),
              "at": claim.clock[0],
              "why": "consumer died", "statuses": Ids([3, 4]), "outcome": "purged", "age_us": 0,
              "base": min(claimed) - 1, "version": 1}
    return {param: values[param] for param in re.findall(r"%\((\w+)\)s", QUERIES[name])}


@pytest.mark.parametrize("name", BY_ID)
def test_by_id_statement_reads_a_primary_key_range_on_300_rows(db, small_queue, name):
    # Given 300 jobs of one queue, 100 of them claimed
    session, claim = small_queue
    assert len(claim.jobs) == 100
    ready = [r[0] for r in db.query("SELECT id FROM nq_job WHERE status = 0 ORDER BY id LIMIT 100")]
    # When the statement is explained with 100 ids
    plan = explain(session, QUERIES[name], bound(name, claim, ready))
    # Then nq_job is read by a PRIMARY key range: no full scan of the table or of an index
    rows = [r for r in plan if r["table"] == "nq_job"]
    assert rows, plan
    for row in rows:
        assert row["key"] == "PRIMARY" and row["type"] in GOOD_ACCESS, (name, plan)


@pytest.mark.parametrize("name", ATTEMPTS_BY_ID)
def test_by_id_statement_on_attempt_records_reads_their_primary_key_range(db, small_queue, name):
    # Given 300 jobs with an attempt record each, 100 of them claimed again
    session, claim = small_queue
    db.query("INSERT INTO nq_attempt (job_id, claim_token, attempt, queue, outcome, ended_at) "
             "SELECT id, 1, 1, queue, 'done', NOW(6) FROM nq_job")
    db.query("ANALYZE TABLE nq_attempt")
    # When the statement is explained with their 100 ids
    plan = explain(session, QUERIES[name], bound(name, claim, []))
    # Then nq_attempt is read by its primary key (job_id first), never scanned
    rows = [r for r in plan if r["table"] == "nq_attempt"]
    assert rows, plan
    for row in rows:
        assert row["key"] == "PRIMARY" and row["type"] in GOOD_ACCESS, (name, plan)


def test_every_by_id_statement_is_pinned_above():
    # A new `IN %(ids)s` statement gets a plan test here
    by_id = {name for name, sql in QUERIES.items() if "IN %(ids)s" in sql}
    assert by_id == set(BY_ID) | set(ATTEMPTS_BY_ID) | set(GRAPH_BY_ID)  # (GRAPH_BY_ID: below)
    # (a single-table DELETE takes no index hint: attempts_purge's plan test is its pin)
    assert all("FORCE INDEX (PRIMARY)" in QUERIES[name] for name in (*BY_ID, "completions_landed", "results_missing"))


@pytest.mark.parametrize("name", ["claims_expired", "claims_of_owner"])
def test_claims_are_taken_back_through_the_claimed_range_of_ix_state_on_300_rows(db, small_queue, name):
    # Given 300 jobs of one queue, 100 of them claimed by one consumer
    session, claim = small_queue
    # When the reaper's read of a consumer's claims is explained for that owner
    plan = explain(session, QUERIES[name], {"owners": (OWNER, "f" * 32), "owner": OWNER})
    # Then nq_job is read through the claimed range of ix_state only (then locked by id:
    # claims_lock, claims_expired_lock): the 200 ready jobs are never passed
    rows = [r for r in plan if r["table"] == "nq_job"]
    assert rows and all(r["key"] == "ix_state" and r["type"] in ("range", "ref") for r in rows), plan


def test_a_watchers_one_step_claim_reads_the_ready_range_of_ix_state_in_order_on_300_rows(db, small_queue):
    # Given 300 jobs of one queue, 100 of them claimed
    session, claim = small_queue
    # When the watcher's locking read of the first ready jobs is explained
    plan = explain(session, QUERIES["claim_take"], {"queue": "q", "limit": 101})
    # Then nq_job is read through the ready range of ix_state in its order: a scan, or a sort,
    # would lock every row it passes (the claimed ones, and all 200 ready ones)
    rows = [r for r in plan if r["table"] == "nq_job"]
    assert rows and all(r["key"] == "ix_state" and r["type"] in ("range", "ref") for r in rows), plan
    assert "filesort" not in str(plan).lower(), plan


def test_the_trim_of_a_jobs_attempt_records_reads_only_that_jobs_records(db, small_queue):
    # Given 300 jobs with 12 attempt records each
    session, claim = small_queue
    twelve = " UNION ALL ".join(f"SELECT {n} AS n" for n in range(1, 13))
    db.query("INSERT INTO nq_attempt (job_id, claim_token, attempt, queue, outcome, ended_at) "
             f"SELECT id, t.n, 1, queue, 'snoozed', NOW(6) - INTERVAL t.n SECOND FROM nq_job, ({twelve}) t")
    db.query("ANALYZE TABLE nq_attempt")
    # When the trim sent with a failure is explained for one of them
    plan = explain(session, QUERIES["attempts_prune"], {"id": claim.jobs[0].id, "kept": 10})
    # Then nq_attempt is read by its primary key's job_id prefix both times, never scanned
    rows = [r for r in plan if r["table"] in ("a", "nq_attempt")]
    assert len(rows) == 2, plan
    for row in rows:
        assert row["key"] == "PRIMARY" and row["type"] in ("range", "ref"), plan


def test_retention_of_the_records_of_jobs_gone_reads_a_range_of_ix_ended_in_its_order(db, small_queue):
    # Given 300 jobs with 3 attempt records each, a day old
    session, claim = small_queue
    db.query("INSERT INTO nq_attempt (job_id, claim_token, attempt, queue, outcome, ended_at) "
             "SELECT id, t.n, 1, queue, 'failed', NOW(6) - INTERVAL 1 DAY FROM nq_job, "
             "(SELECT 1 AS n UNION ALL SELECT 2 UNION ALL SELECT 3) t")
    db.query("ANALYZE TABLE nq_attempt")
    # When retention's read of the next chunk is explained (retention_s = 0)
    start_at, start_id = admin_queries.GONE_ATTEMPTS_START
    plan = explain(session, QUERIES["gone_attempts_ids"], {"queue": "q", "age_us": 3_600_000_000, "limit": 100,
                                                           "after_at": start_at, "after_id": start_id})
    # Then nq_attempt is a range of ix_ended read in its order (no sort), and nq_job is read by id
    by_table = {r["table"]: r for r in plan}
    assert by_table["a"]["key"] == "ix_ended" and by_table["a"]["type"] == "range", plan
    assert "filesort" not in (by_table["a"]["Extra"] or ""), plan
    assert by_table["j"]["key"] == "PRIMARY" and by_table["j"]["type"] in GOOD_ACCESS, plan


# Workflows' and steps' statements on a batch's ids: their edges (nq_edge) and steps (nq_step)
# by primary key or the child index, and the jobs they name by primary key.
GRAPH_BY_ID = ("children_cancel", "children_cancelled_ids", "children_count_down", "children_failed_count",
               "children_left_waiting", "children_recount", "children_release", "children_released_queues",
               "children_revivable", "children_to_count",
               "children_wait_again", "children_waiting", "children_wake", "edges_counted", "edges_drop",
               "edges_mark_done", "edges_mark_done_any", "edges_mark_failed", "parents_gone", "parents_read",
               "parents_revive", "steps_purge", "web_workflow_edges")


def test_every_graph_statement_on_ids_is_pinned():
    by_id = {name for name, sql in QUERIES.items() if "IN %(ids)s" in sql}
    assert by_id == set(BY_ID) | set(ATTEMPTS_BY_ID) | set(GRAPH_BY_ID)


@pytest.mark.parametrize("name", GRAPH_BY_ID)
def test_a_graph_statement_on_ids_never_scans_a_table(db, small_queue, name):
    # Given 300 jobs, each the parent of two others (the claimed ones of two ready ones), edges of
    # other parents, attempt records and steps
    session, claim = small_queue
    db.query("INSERT INTO nq_edge (parent_id, child_id, child_queue, state) "
             "SELECT p.id, c.id, 'q', 0 FROM nq_job p JOIN nq_job c ON c.id IN (p.id + 100, p.id + 200)")
    db.query("INSERT INTO nq_edge (parent_id, child_id, child_queue, state) "  # and other parents' edges
             "SELECT p.id + 1000000, c.id, 'q', 0 FROM nq_job p JOIN nq_job c ON c.id IN (p.id + 1, p.id + 2)")
    db.query("INSERT INTO nq_attempt (job_id, claim_token, attempt, queue, outcome, ended_at) "
             "SELECT id, 1, 1, queue, 'done', NOW(6) FROM nq_job")
    db.query("INSERT INTO nq_step (job_id, name, result, claim_token, attempt, done_at) "
             "SELECT id, 's', '1', 1, 1, NOW(6) FROM nq_job")
    db.query("ANALYZE TABLE nq_edge, nq_attempt, nq_step")
    claimed = [job.id for job in claim.jobs]
    values = {"ids": Ids(claimed), "token": claim.token, "why": "dead", "n": 1, "mode": 0, "slot": 0, "limit": 5000}
    params = {p: values[p] for p in re.findall(r"%\((\w+)\)s", QUERIES[name])}
    # When the statement is explained with 100 ids
    plan = explain(session, QUERIES[name], params)
    # Then no table is scanned whole: each is read by a key (a range, or one row per join)
    for row in plan:
        if str(row["table"]).startswith("<"):  # a derived table: built from keyed reads
            continue
        assert row["type"] in (*GOOD_ACCESS, "ref", "unique_subquery") and row["key"], (name, plan)
