"""The claim path against a real server: plans, order, SKIP LOCKED behaviour, scheduling."""

import json

from conftest import numbers

from notifyq.produce.producer import Producer
from notifyq.store import queries
from notifyq.store.db import Session
from notifyq.store.sql import QUERIES


def _explain(db, name, params):
    conn_rows = db.query("EXPLAIN " + QUERIES[name], params)
    return conn_rows


def test_claim_query_uses_indexes_and_no_filesort_with_100k_rows(db):
    # Given 100k jobs spread over two queues and every status
    db.query(
        "INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload) "
        "SELECT IF(seq % 3 = 0, 'other', 'q'), seq % 5, seq % 7, NOW(6) - INTERVAL seq SECOND, 5, '{}' "
        f"FROM {numbers(100000)}")
    db.query("ANALYZE TABLE nq_job")
    # When the candidate reads are explained: the usual one's statements, and the union a claim
    # that found due jobs reads
    for name in ("claim_ready", "due_any", "claim_candidates"):
        plan = _explain(db, name, {"queue": "q", "limit": 300})
        # Then every part reads an index in order: no filesort, no full scan
        text = json.dumps([list(map(str, row)) for row in plan])
        assert "filesort" not in text.lower(), (name, plan)
        tables = [row for row in plan if row[2] and row[2].startswith("nq_job")]
        assert tables, (name, plan)
        for row in tables:
            assert row[5] == "ix_state", (name, row)
            assert row[3] in ("ref", "range"), (name, row)
    # And the locking read goes by primary key range only
    ids = [r[0] for r in db.query("SELECT id FROM nq_job WHERE queue='q' AND status=0 LIMIT 100")]
    plan = _explain(db, "claim_lock", {"ids": ids})
    assert plan[0][3] == "range" and plan[0][5] == "PRIMARY", plan


def test_higher_priority_first_then_oldest(db):
    cfg = db.config()
    with Producer("q", cfg) as p:
        low = p.put_many([{"n": i} for i in range(20)])
        high = p.put_many([{"n": i} for i in range(5)], priority=10)
    session = Session(cfg.dsn)
    claim = queries.claim(session, "q", "me" * 16, 10, 60)
    assert [j.id for j in claim.jobs] == high + low[:5]
    assert not claim.drained
    session.close()


def test_scheduled_jobs_wait_for_their_time(db):
    cfg = db.config()
    with Producer("q", cfg) as p:
        later = p.put({"x": 1}, delay=3600)
        now = p.put({"x": 2})
    session = Session(cfg.dsn)
    claim = queries.claim(session, "q", "me" * 16, 10, 60)
    assert [j.id for j in claim.jobs] == [now]
    db.query("UPDATE nq_job SET run_at = NOW(6) - INTERVAL 1 SECOND WHERE id = %s", (later,))
    claim = queries.claim(session, "q", "me" * 16, 10, 60)
    assert [j.id for j in claim.jobs] == [later]
    session.close()


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
