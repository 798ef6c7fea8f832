"""Enqueue against a real server: the signal bump travels with the jobs, in every path."""

import json

import MySQLdb
import pytest

from notifyq import errors
from notifyq.produce.producer import Producer


def _signal(db) -> int:
    return int(db.scalar("SELECT COALESCE(SUM(seq), 0) FROM nq_signal WHERE queue = 'q'"))


def test_put_and_put_many_bump_the_signal_by_exactly_the_jobs_they_commit(db):
    cfg = db.config(producer={"chunk_size": 100})
    with Producer("q", cfg) as p:
        one = p.put({"n": -1})
        assert _signal(db) == 1
        many = p.put_many([{"n": i} for i in range(250)])  # three chunks, one bump of 250
        assert _signal(db) == 251
        again = p.put({"n": 250})
    assert _signal(db) == 252
    rows = db.query("SELECT id, payload FROM nq_job WHERE queue = 'q' ORDER BY id")
    assert [r[0] for r in rows] == [one, *many, again]
    assert [json.loads(r[1])["n"] for r in rows] == list(range(-1, 251))


def test_a_put_with_the_defaults_stores_what_the_same_values_given_explicitly_store(db):
    # put()'s defaults skip the argument checks and render without literal(): the rows must not
    # tell the two calls apart, and the queue's own max_attempts must still be taken.
    cfg = db.config(defaults={"max_attempts": 3}, queue={"q": {"max_attempts": 7}})
    with Producer("q", cfg) as p:
        plain = p.put({"n": 1})
        given = p.put({"n": 1}, priority=0, delay=0.0, max_attempts=7)
    with Producer("other", cfg) as p:
        other = p.put({"n": 1})
    columns = "status, priority, max_attempts, attempts, payload, dedup_key, run_at <= created_at + INTERVAL 1 SECOND"
    rows = {r[0]: r[1:] for r in db.query(f"SELECT id, {columns} FROM nq_job")}
    assert rows[plain] == rows[given] == (0, 0, 7, 0, '{"n":1}', None, 1)
    assert rows[other][2] == 3


@pytest.mark.parametrize("multi_statements", [True, False])
def test_put_on_the_callers_connection_commits_and_rolls_back_with_it(db, multi_statements):
    # A caller's connection opened with multi_statements=False gets the bump as its own
    # statement; with them on, in the INSERT's round trip. Either way it is the caller's
    # transaction: rolled back, nothing of it stays; committed, the jobs and the bump do.
    dsn = db.dsn
    conn = MySQLdb.connect(**dsn.connect_args(), autocommit=False, multi_statements=multi_statements)
    try:
        with Producer("q", db.config()) as p:
            p.put({"n": 1}, conn=conn)
            p.put_many([{"n": 2}, {"n": 3}], conn=conn)
            conn.rollback()
            assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
            assert _signal(db) == 0
            ids = [p.put({"n": 4}, conn=conn), *p.put_many([{"n": 5}, {"n": 6}], conn=conn)]
            conn.cursor().execute("SELECT 1")  # the connection is in sync: nothing left unread
            conn.commit()
    finally:
        conn.close()
    assert [r[0] for r in db.query("SELECT id FROM nq_job ORDER BY id")] == ids
    assert _signal(db) == 3


def test_a_closed_callers_connection_or_one_without_notifyq_tables_is_one_clear_error(db):
    # Given a caller's connection that is closed, and one to a database without notifyq's tables
    closed = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
    closed.close()
    admin = MySQLdb.connect(**db.admin.connect_args(), autocommit=False)
    admin.cursor().execute("CREATE DATABASE IF NOT EXISTS nq_no_tables")
    admin.select_db("nq_no_tables")
    try:
        with Producer("q", db.config()) as p:
            # When a job is enqueued on each, by every path
            for call in (lambda c: p.put({"n": 1}, conn=c), lambda c: p.put_many([{"n": 1}], conn=c),
                         lambda c: p.put({"n": 1}, conn=c, dedup_key="k")):
                # Then notifyq's own errors, one line each, say what to do
                with pytest.raises(errors.DatabaseError, match="conn: the connection is closed or was lost"):
                    call(closed)
                with pytest.raises(errors.InputError, match="conn: its database has no notifyq tables") as e:
                    call(admin)
                assert "\n" not in str(e.value)
    finally:
        admin.cursor().execute("DROP DATABASE nq_no_tables")
        admin.close()
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0


AWKWARD = ["it's", 'say "hi"', "back\\slash", "100%s done", "%(queue)s", "a;b\n-- c", "é 日本 🎉", "nul \0 byte"]


@pytest.mark.parametrize("caller_mode", [None, "", "NO_BACKSLASH_ESCAPES"])
def test_a_put_stores_its_payload_and_options_as_given_whatever_the_put_before_it_gave(db, caller_mode):
    # put() sends the text around its payload rendered once per set of options (inserts._insert_one):
    # each row must still hold its own payload, byte for byte, and its own options, when calls
    # with and without options alternate, on the producer's session and on a caller's connection
    # (whose server may escape by doubling quotes, NO_BACKSLASH_ESCAPES, instead of backslashes).
    cfg = db.config(queue={"q": {"max_attempts": 7}})
    conn = None
    if caller_mode is not None:
        conn = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
        conn.cursor().execute("SET SESSION sql_mode = %s", (caller_mode,))
    calls = [({}, None), ({"priority": 5}, None), ({}, "k'1%s"), ({"max_attempts": 2}, None), ({}, None),
             ({"priority": 5}, None), ({"delay": 60}, None), ({"priority": -3}, "k\\2"), ({}, None)]
    expected = {}
    try:
        with Producer("q", cfg) as p:
            for i, (options, key) in enumerate(calls):
                payload = {"text": AWKWARD[i % len(AWKWARD)], "i": i}
                job_id = p.put(payload, dedup_key=key, conn=conn, **options)
                expected[job_id] = (json.dumps(payload, separators=(",", ":"), ensure_ascii=False),
                                    options.get("priority", 0), options.get("max_attempts", 7),
                                    1 if options.get("delay") else 0)
            if conn is not None:
                conn.commit()
    finally:
        if conn is not None:
            conn.close()
    rows = {r[0]: r[1:] for r in db.query("SELECT id, payload, priority, max_attempts, status FROM nq_job")}
    assert rows == expected
    keys = {r[0]: r[1] for r in db.query("SELECT dedup_key, job_id FROM nq_dedup WHERE queue = 'q'")}
    assert set(keys) == {"k'1%s", "k\\2"} and set(keys.values()) <= set(expected)
    assert _signal(db) == len(calls)
