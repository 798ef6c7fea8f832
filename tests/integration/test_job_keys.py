"""A job's flow-control key (`put(..., key=)`, nq_job.job_key) against a real server: every
enqueue path stores it, a bad one is one InputError with nothing written, and the claim hands
it to the handler as `job.key`."""

from __future__ import annotations

import datetime as dt

import MySQLdb
import pytest

import notifyq
from notifyq import errors
from notifyq.produce.producer import Producer
from notifyq.store import queries
from notifyq.store.db import Session

OWNER = "o" * 32


def _keys(db) -> dict[int, str | None]:
    return {r[0]: r[1] for r in db.query("SELECT id, job_key FROM nq_job WHERE queue = 'q'")}


def _claim_all(cfg) -> list:
    session = Session(cfg.dsn)
    try:
        jobs = []
        while True:
            claim = queries.claim(session, "q", OWNER, 10, 60)
            if not claim.jobs:
                return jobs
            jobs += claim.jobs
    finally:
        session.close()


def test_put_and_put_many_store_the_key_and_leave_it_null_without_one(db):
    # Given puts with and without a key, alternating (put() keeps the text of an unkeyed put's
    # statement from one call to the next: a keyed put must not take it, nor leave its key in it)
    cfg = db.config(producer={"chunk_size": 100})
    with Producer("q", cfg) as p:
        plain = p.put({"n": 1})
        keyed = p.put({"n": 2}, key="customer-42")
        plain_again = p.put({"n": 3})
        keyed_later = p.put({"n": 4}, key="customer-7", delay=3600, priority=3)
        at = p.put({"n": 5}, key="customer-7", run_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1))
        both = p.put({"n": 6}, key="customer-42", dedup_key="sync-42")
        many = p.put_many([{"n": i} for i in range(250)], key="tenant-a")  # three chunks
        many_plain = p.put_many([{"n": i} for i in range(3)])
    # Then each row holds its own key, and the unkeyed ones none
    keys = _keys(db)
    assert keys[plain] is None and keys[plain_again] is None
    assert keys[keyed] == "customer-42" and keys[both] == "customer-42"
    assert keys[keyed_later] == keys[at] == "customer-7"
    assert {keys[i] for i in many} == {"tenant-a"} and len(many) == 250
    assert {keys[i] for i in many_plain} == {None}
    assert db.scalar("SELECT dedup_key FROM nq_job WHERE id = %s", (both,)) == "sync-42"


def test_the_claim_hands_the_key_to_the_handler_as_job_key(db):
    cfg = db.config()
    with Producer("q", cfg) as p:
        keyed = p.put({"n": 1}, key="customer-42", dedup_key="d-1")
        plain = p.put({"n": 2})
        many = p.put_many([{"n": 3}, {"n": 4}], key="tenant-b")
    jobs = {job.id: job for job in _claim_all(cfg)}
    assert jobs[keyed].key == "customer-42" and jobs[keyed].dedup_key == "d-1"
    assert jobs[plain].key is None and jobs[plain].dedup_key is None
    assert [jobs[i].key for i in many] == ["tenant-b", "tenant-b"]


def test_a_key_of_191_four_byte_characters_is_stored_and_claimed_whole(db):
    key = "\N{GRINNING FACE}" * 190 + "k"
    cfg = db.config()
    with Producer("q", cfg) as p:
        job_id = p.put({"n": 1}, key=key)
    assert _keys(db)[job_id] == key
    assert [job.key for job in _claim_all(cfg)] == [key]


BAD_KEYS = [
    (42, "key: expected a string, got 42"),
    (b"bytes", "key: expected a string"),
    ("", "key must be 1 to 191 characters, got 0"),
    ("k" * 192, "key must be 1 to 191 characters, got 192"),
    ("a\udc80b", "key is not valid UTF-8"),
]


@pytest.mark.parametrize("bad,message", BAD_KEYS)
def test_a_bad_key_is_one_input_error_and_nothing_is_written(db, bad, message):
    cfg = db.config()
    conn = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
    try:
        with notifyq.Producer("q", cfg) as p:
            for call in (lambda: p.put({"n": 1}, key=bad),
                         lambda: p.put({"n": 1}, key=bad, dedup_key="d"),
                         lambda: p.put_many([{"n": 1}, {"n": 2}], key=bad),
                         lambda: p.put({"n": 1}, key=bad, conn=conn),
                         lambda: p.put_many([{"n": 1}], key=bad, conn=conn)):
                with pytest.raises(errors.InputError) as raised:
                    call()
                assert message in str(raised.value) and "\n" not in str(raised.value)
        conn.commit()
    finally:
        conn.close()
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    assert db.scalar("SELECT COUNT(*) FROM nq_dedup") == 0


def test_keys_on_the_callers_connection_and_in_its_transaction(db):
    cfg = db.config()
    conn = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
    try:
        with notifyq.Producer("q", cfg) as p:
            one = p.put({"n": 1}, key="c-1", conn=conn)
            two = p.put_many([{"n": 2}, {"n": 3}], key="c-2", conn=conn)
            conn.commit()
            with p.transaction(conn) as tx:
                three = tx.put({"n": 4}, key="c-3")
                four = tx.put_many([{"n": 5}], key="c-4")
    finally:
        conn.close()
    keys = _keys(db)
    assert keys[one] == "c-1" and [keys[i] for i in two] == ["c-2", "c-2"]
    assert keys[three] == "c-3" and [keys[i] for i in four] == ["c-4"]
