"""Plans of the status page's reads (notifyq web) on 100k jobs: every read of nq_job rides
ix_state (a range or a ref, never a full scan of the table or of the index) and sorts nothing;
the dedup key and job lookups go by primary key."""

import json
import re

import pytest
from number_rows import numbers

from notifyq.store import admin_queries
from notifyq.store.db import Session
from notifyq.store.sql import QUERIES

WEB_READS = ("web_depth", "web_oldest", "web_oldest_after", "web_oldest_rest", "web_rate", "web_jobs", "web_jobs_newest",
             "web_claims_by_owner")


@pytest.fixture
def many_jobs(db):
    """100k jobs over two queues and every status; finished ones finished within the hour."""
    db.query(
        "INSERT INTO nq_job (queue, status, priority, run_at, attempts, max_attempts, owner, lease_until, "
        "finished_at, payload) "
        "SELECT IF(seq % 3 = 0, 'other', 'q'), seq % 5, seq % 7, NOW(6) + INTERVAL CAST(seq % 11 AS SIGNED) - 5 MINUTE, "
        "seq % 2, 5, IF(seq % 5 = 2, LPAD(seq % 4, 32, 'o'), NULL), "
        "IF(seq % 5 = 2, NOW(6) + INTERVAL 1 MINUTE, NULL), "
        f"IF(seq % 5 >= 3, NOW(6) - INTERVAL (seq % 3600) SECOND, NULL), '{{}}' FROM {numbers(100000)}")
    db.query("INSERT INTO nq_dedup (queue, dedup_key, job_id) VALUES ('q', 'k', 1), ('q', 'l', 2)")
    db.query("ANALYZE TABLE nq_job")
    return db


def _plan(db, name: str, params: dict) -> list[dict]:
    wanted = {p: params[p] for p in re.findall(r"%\((\w+)\)s", QUERIES[name])}
    rows = db.query("EXPLAIN " + QUERIES[name], wanted)
    names = ("id", "select_type", "table", "type", "possible_keys", "key", "key_len", "ref", "rows", "extra")
    return [dict(zip(names, r[:6] + r[-4:] if len(r) > 10 else r)) for r in rows]


PARAMS = {"queue": "q", "cap": 100_000, "sample": 1000, "minutes": 15, "buckets": 16, "status": 4, "limit": 50,
          "after": -6}


@pytest.mark.parametrize("name", WEB_READS)
def test_every_status_page_read_rides_ix_state_without_a_sort(many_jobs, name):
    # Given 100k jobs of every status on two queues
    # When the read is explained
    plan = _plan(many_jobs, name, PARAMS)
    # Then nq_job is read through ix_state, by range or ref, and nothing is sorted (the few
    # rows a GROUP BY makes are not sorted either: ORDER BY NULL)
    text = json.dumps([{k: str(v) for k, v in r.items()} for r in plan]).lower()
    assert "filesort" not in text, (name, plan)
    reads = [r for r in plan if r["table"] == "nq_job"]
    assert reads, (name, plan)
    for r in reads:
        assert r["key"] == "ix_state" and r["type"] in ("range", "ref"), (name, r)


def _index_entries_read(db, run) -> dict[str, int]:
    """The session's Handler_read_* counters that grew while `run(session)` ran."""
    session = Session(db.dsn)
    try:
        cur = session.conn.cursor()

        def counters() -> dict[str, int]:
            cur.execute("SHOW SESSION STATUS LIKE 'Handler_read%%'")
            return {k: int(v) for k, v in cur.fetchall()}

        before = counters()
        run(session)
        after = counters()
        return {k: after[k] - before[k] for k in after}
    finally:
        session.close()


def test_the_oldest_ready_job_is_found_by_probes_not_by_reading_the_ready_entries(many_jobs):
    # Given 100k jobs, a third of them ready, over seven priorities, on two queues
    # When a page of three queues is read with every count capped at one entry (so nearly
    # every entry the page reads is the oldest job's)
    reads = _index_entries_read(many_jobs, lambda s: admin_queries.web_queue_figures(
        s, ["q", "other", "none"], cap=1, sample=1))
    # Then the oldest ready job's time took index probes (a few per priority in use), not a
    # walk over the 20,000 ready entries: on schema 10's ix_state a GROUP BY prio_key lost its
    # loose index scan and read them all
    assert reads["Handler_read_next"] + reads["Handler_read_prev"] < 100, reads
    assert reads["Handler_read_key"] < 100, reads


@pytest.fixture
def priorities(db):
    """Ready jobs of queue 'q' over ten sparse priorities, 1000 each, each priority's earliest
    a few minutes old and the oldest (90 minutes) at priority 4, in the middle; a queue 'one'
    of one ready job an hour old and one scheduled."""
    db.query(
        "INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload) "
        "SELECT 'q', 0, ELT(1 + seq % 10, -500, -7, 0, 1, 4, 9, 30, 31, 1000, 32000), "
        "NOW(6) - INTERVAL IF(seq <= 10, ELT(1 + seq % 10, 2, 3, 5, 6, 90, 8, 9, 10, 11, 12), 0) MINUTE, "
        f"5, '{{}}' FROM {numbers(10000)}")
    db.query("INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload) "
             "VALUES ('one', 0, 3, NOW(6) - INTERVAL 1 HOUR, 5, '{}'), "
             "('one', 1, 3, NOW(6) + INTERVAL 1 HOUR, 5, '{}')")
    db.query("ANALYZE TABLE nq_job")
    return db


@pytest.mark.parametrize("rounds", (None, 3, 0))
def test_the_oldest_ready_job_is_the_earliest_of_every_priority(priorities, rounds):
    # Given ten priorities in use, the oldest job at one in the middle, and a queue of one job
    bound = {} if rounds is None else {"rounds": rounds}

    def run(session):
        run.out = session.run(lambda cur: admin_queries.web_oldest(cur, ["q", "one", "none"], **bound), what="oldest")

    reads = _index_entries_read(priorities, run)
    # When the oldest times are read (with every round of probes it needs, or cut short after
    # `rounds`: the priorities left are read whole)
    # Then they are the earliest run_at of each queue's ready and scheduled jobs
    earliest = "SELECT MIN(run_at) FROM nq_job WHERE status = %s AND queue = %s"
    expect = {q: {"ready": priorities.scalar(earliest, (0, q)), "scheduled": priorities.scalar(earliest, (1, q))}
              for q in ("q", "one", "none")}
    assert run.out == expect
    assert run.out["q"]["ready"] < run.out["one"]["ready"]
    # And with every round, a probe per priority: no ready entry walked
    if rounds is None:
        assert reads["Handler_read_next"] + reads["Handler_read_prev"] == 0, reads


def test_the_dedup_key_lookup_reads_one_primary_key_entry(many_jobs):
    plan = _plan(many_jobs, "web_dedup_job", {"queue": "q", "key": "k"})
    assert plan[0]["key"] == "PRIMARY" and plan[0]["type"] in ("const", "eq_ref", "ref"), plan


@pytest.mark.parametrize("name", ("web_depth", "web_oldest", "web_rate"))
def test_a_page_of_queues_read_in_one_statement_keeps_each_queues_plan(many_jobs, name):
    # Given the overview's read repeated for a page of queues, as one statement
    from notifyq.store import admin_queries

    text, params = admin_queries._per_queue(name, ["q", "other", "none"], PARAMS)
    # When it is explained
    rows = many_jobs.query("EXPLAIN " + text, params)
    names = ("id", "select_type", "table", "type", "possible_keys", "key", "key_len", "ref", "rows", "extra")
    plan = [dict(zip(names, r[:6] + r[-4:] if len(r) > 10 else r)) for r in rows]
    # Then every copy reads nq_job through ix_state by range or ref, and nothing is sorted
    single = [r for r in _plan(many_jobs, name, PARAMS) if r["table"] == "nq_job"]
    reads = [r for r in plan if r["table"] == "nq_job"]
    assert len(reads) == 3 * len(single), plan
    assert "filesort" not in json.dumps([{k: str(v) for k, v in r.items()} for r in plan]).lower(), plan
    for r in reads:
        assert r["key"] == "ix_state" and r["type"] in ("range", "ref"), (name, r)


# ---------------------------------------------------------------- the operations console

@pytest.fixture
def many_attempts(many_jobs):
    """100k attempt records over two queues, ended over the last 10 hours."""
    many_jobs.query(
        "INSERT INTO nq_attempt (job_id, claim_token, attempt, queue, outcome, started_at, ended_at) "
        "SELECT seq + 1, seq + 1, 1, IF(seq % 3 = 0, 'other', 'q'), ELT(1 + seq % 4, 'done', 'failed', 'dead', 'cancelled'), "
        "NOW(6) - INTERVAL (seq % 36000) SECOND - INTERVAL 1 SECOND, NOW(6) - INTERVAL (seq % 36000) SECOND "
        f"FROM {numbers(100000)}")
    many_jobs.query("ANALYZE TABLE nq_attempt")
    return many_jobs


@pytest.mark.parametrize("name", ("web_running", "web_search", "web_search_newest"))
def test_the_consoles_job_reads_ride_a_bounded_range_of_ix_state(many_jobs, name):
    # Given 100k jobs of every status on two queues
    params = {**PARAMS, "status": 0 if name == "web_search" else 4, "text": "x", "task": "", "scan": 10_000,
              "since": "2000-01-01"}
    # When the running page's read and the payload search are explained
    plan = _plan(many_jobs, name, params)
    # Then nq_job is read through ix_state by range or ref in the index's order (the search's
    # inner read, which its scan LIMIT stops), never as a whole table; only the search's matches
    # (at most its scan bound, in a derived table) are put in order again
    reads = [r for r in plan if r["table"] == "nq_job"]
    assert reads, (name, plan)
    for r in reads:
        assert r["key"] == "ix_state" and r["type"] in ("range", "ref"), (name, r)
        assert "filesort" not in str(r["extra"]).lower(), (name, r)
    assert all(r["table"].startswith("<derived") for r in plan if "filesort" in str(r["extra"]).lower()), plan
    if name != "web_running":
        assert "LIMIT %(scan)s) s" in QUERIES[name]


def test_the_history_reads_a_time_range_of_ix_ended_and_its_jobs_by_primary_key(many_attempts):
    # Given 100k attempt records over 10 hours and 100k jobs
    # When a queue's last hour is explained
    plan = _plan(many_attempts, "web_history", {"queue": "q", "minutes": 60, "cap": 20_000})
    # Then the records are a range of ix_ended (queue, ended_at), read in its order (no sort),
    # and each one's job is one primary-key lookup
    text = json.dumps([{k: str(v) for k, v in r.items()} for r in plan]).lower()
    assert "filesort" not in text and "join buffer" not in text, plan
    (records,) = [r for r in plan if r["table"] == "a"]
    assert records["key"] == "ix_ended" and records["type"] == "range", records
    (job,) = [r for r in plan if r["table"] == "j"]
    assert job["key"] == "PRIMARY" and job["type"] == "eq_ref", job
    # And the range holds the window's rows, not the table's: about a tenth of the queue's
    assert int(records["rows"]) < 20_000, records


# ---------------------------------------------------------------- the console's flow and workflow reads

@pytest.fixture
def held_jobs(db):
    """100k ready jobs of one queue: 50k of one key, the rest over 500 keys; 100 claimed."""
    db.query("INSERT INTO nq_job (queue, status, run_at, max_attempts, payload, job_key, owner) "
             "SELECT 'q', IF(seq <= 100, 2, 0), NOW(6), 5, '{}', "
             "IF(seq <= 50000, 'hot', CONCAT('k', LPAD(seq % 500, 3, '0'))), IF(seq <= 100, REPEAT('o', 32), NULL) "
             f"FROM {numbers(100000)}")
    db.query("INSERT INTO nq_edge (parent_id, child_id, child_queue, state) "
             f"SELECT seq, 100001, 'q', seq % 4 FROM {numbers(20000)}")
    db.query("ANALYZE TABLE nq_job, nq_edge")
    return db


@pytest.mark.parametrize("name", ("web_flow_running", "web_flow_ready", "web_flow_key_ready"))
def test_the_flow_pages_reads_are_a_bounded_index_range(held_jobs, name):
    # Given 100k held jobs of one queue
    # When the flow page's read is explained
    plan = _plan(held_jobs, name, {"queue": "q", "key": "hot", "cap": 1000})
    # Then nq_job is a range or ref of ix_state (running, ready) or ix_key (a key's ready jobs,
    # index-only), stopped by the read's LIMIT, and nothing is sorted
    text = json.dumps([{k: str(v) for k, v in r.items()} for r in plan]).lower()
    assert "filesort" not in text, (name, plan)
    (read,) = [r for r in plan if r["table"] == "nq_job"]
    assert read["key"] == ("ix_key" if name == "web_flow_key_ready" else "ix_state"), (name, read)
    assert read["type"] in ("range", "ref"), (name, read)
    if name != "web_flow_running":  # (the running read takes each claimed job's key from its row)
        assert "using index" in str(read["extra"]).lower(), (name, read)
    assert "LIMIT %(cap)s) r" in QUERIES[name]


@pytest.mark.parametrize("name", ("web_job_parents", "web_job_children", "web_job_progress", "job_progress"))
def test_a_jobs_workflow_reads_are_a_bounded_range_of_its_edges(held_jobs, name):
    # Given a job with 20,000 parents
    # When the job page's workflow reads are explained (and the API's progress: its edges all, counted alike)
    plan = _plan(held_jobs, name, {"id": 100001, "limit": 50, "cap": 10000})
    # Then the edges are a ref of the child index or the primary key, in its order, and each
    # edge's job is one primary-key lookup
    text = json.dumps([{k: str(v) for k, v in r.items()} for r in plan]).lower()
    assert "filesort" not in text, (name, plan)
    (edges,) = [r for r in plan if r["table"] == "e" or r["table"] == "nq_edge"]
    assert edges["key"] == ("PRIMARY" if name == "web_job_children" else "ix_child"), (name, edges)
    assert edges["type"] in ("ref", "range"), (name, edges)
    jobs = [r for r in plan if r["table"] in ("p", "c")]
    assert jobs and all(r["key"] == "PRIMARY" and r["type"] == "eq_ref" for r in jobs), (name, plan)
