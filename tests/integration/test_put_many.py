"""put_many against a real server: its rows, sent as one bound template per call with each
payload escaped by the driver (inserts._insert_uniform), hold what put() stores for the same
payload and options, on the producer's session and on a caller's connection."""

import datetime as dt
import json

import MySQLdb
import pytest

from notifyq.produce.producer import Producer

AWKWARD = ["it's", 'say "hi"', "back\\slash", "100%s done", "%(queue)s", "a;b\n-- c", "é 日本 🎉", "nul \0 byte",
           "'), ('q', 0, 0, UTC_TIMESTAMP(6), 5, 'x', UTC_TIMESTAMP(6)) -- "]
NOW = dt.datetime.now(dt.timezone.utc)
OPTIONS = [{}, {"priority": 5}, {"delay": 60}, {"run_at": NOW + dt.timedelta(hours=1)},
           {"run_at": NOW - dt.timedelta(hours=1)}, {"max_attempts": 2}, {"key": "k'1%s"},
           {"priority": -3, "key": "k\\2", "delay": 30}, {}]
# What a row holds, beside its id: the delay is run_at - created_at, in whole seconds (a run_at
# an hour ahead: 3,599 or 3,600 by the call's second)
COLUMNS = ("status, priority, max_attempts, attempts, payload, dedup_key, job_key, prio_key, "
           "ROUND(TIMESTAMPDIFF(MICROSECOND, created_at, run_at) / 1e6), "
           "ABS(TIMESTAMPDIFF(SECOND, created_at, UTC_TIMESTAMP(6))) < 60, sort_at = run_at")


@pytest.mark.parametrize("caller_mode", [None, "", "NO_BACKSLASH_ESCAPES"])
def test_put_many_stores_each_job_as_put_does_whatever_the_options_and_the_connection(db, caller_mode):
    # On a caller's connection whose server escapes by doubling quotes (NO_BACKSLASH_ESCAPES)
    # too, and with option sets that alternate, so that a template bound for one call is never
    # another's
    cfg = db.config(queue={"q": {"max_attempts": 7}})
    conn = None
    if caller_mode is not None:
        conn = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
        conn.cursor().execute("SET SESSION sql_mode = %s", (caller_mode,))
    pairs = []
    try:
        with Producer("q", cfg) as p:
            for i, options in enumerate(OPTIONS):
                payloads = [{"text": text, "call": i} for text in AWKWARD]
                many = p.put_many(payloads, conn=conn, **options)
                ones = [p.put(payload, conn=conn, **options) for payload in payloads]
                pairs += zip(many, ones)
            if conn is not None:
                conn.commit()
    finally:
        if conn is not None:
            conn.close()
    rows = {r[0]: r[1:] for r in db.query(f"SELECT id, {COLUMNS} FROM nq_job")}
    assert len(rows) == len(pairs) * 2
    for many, one in pairs:
        assert _same_second(rows[many], rows[one]), (many, one)
    stored = [json.loads(rows[many][4]) for many, _ in pairs]
    assert stored == [{"text": text, "call": i} for i in range(len(OPTIONS)) for text in AWKWARD]
    keys = {r[0] for r in db.query("SELECT job_key FROM nq_job WHERE job_key IS NOT NULL")}
    assert keys == {"k'1%s", "k\\2"}


def _same_second(a: tuple, b: tuple) -> bool:
    """Two rows alike, their delays a second apart at most (a run_at given is due at that time)."""
    return a[:8] == b[:8] and abs(a[8] - b[8]) <= 1 and a[9:] == b[9:] == (1, 1)


def test_a_key_bound_on_one_connection_is_bound_again_on_a_connection_that_escapes_otherwise(db):
    # The text around a payload is kept from call to call for the same options, but a job key's
    # literal depends on how the connection escapes: a key with a backslash, put on the
    # producer's session and then on a NO_BACKSLASH_ESCAPES connection, is stored as given both times
    key = "k\\'x"
    conn = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
    try:
        conn.cursor().execute("SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES'")
        with Producer("q", db.config()) as p:
            own = p.put_many([{"n": 1}, {"n": 2}], key=key)
            callers = p.put_many([{"n": 3}, {"n": 4}], key=key, conn=conn)
            conn.commit()
            again = p.put_many([{"n": 5}, {"n": 6}], key=key)
    finally:
        conn.close()
    rows = dict(db.query("SELECT id, job_key FROM nq_job"))
    assert [rows[i] for i in own + callers + again] == [key] * 6
