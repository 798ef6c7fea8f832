"""Dedup keys read current inside a caller's transaction (issue 26, item 12): a REPEATABLE READ
snapshot taken before another producer took the key, and callers in autocommit mode."""

from __future__ import annotations

import threading

import MySQLdb
import pytest

from notifyq.produce.producer import Producer


def _connect(db, autocommit: bool):
    return MySQLdb.connect(**db.dsn.connect_args(), autocommit=autocommit)


def _pending_with_key(db, key: str) -> list[int]:
    return [r[0] for r in db.query("SELECT id FROM nq_job WHERE dedup_key = %s AND status < 3 ORDER BY id", (key,))]


@pytest.mark.parametrize("key_row", ["new key", "key of an ended job"])
def test_a_put_in_a_repeatable_read_transaction_finds_the_key_another_producer_took_after_its_snapshot(db, key_row):
    cfg = db.config()
    caller = _connect(db, autocommit=False)
    try:
        with Producer("q", cfg) as other, Producer("q", cfg) as mine:
            if key_row == "key of an ended job":  # the key row exists, its job is gone
                ended = other.put({"n": 0}, dedup_key="K")
                db.query("DELETE FROM nq_job WHERE id = %s", (ended,))
            # Given a caller's REPEATABLE READ transaction that has read (its snapshot is taken)
            cur = caller.cursor()
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SELECT COUNT(*) FROM nq_job")
            # When another producer puts key K, then the caller puts K in its transaction
            first = other.put({"n": 1}, dedup_key="K")
            second = mine.put({"n": 2}, dedup_key="K", conn=caller)
            caller.commit()
        # Then the caller's put found the other's job: one pending job holds the key
        assert second == first
        assert _pending_with_key(db, "K") == [first]
    finally:
        caller.close()


def test_with_snapshot_isolation_a_put_on_a_key_taken_since_the_snapshot_fails_and_stores_nothing(db):
    # MariaDB's innodb_snapshot_isolation (on by default from 11.8): a locking read of a row
    # changed since the snapshot fails (1020), the caller's to rerun, instead of reading past it.
    caller = _connect(db, autocommit=False)
    try:
        cur = caller.cursor()
        try:
            cur.execute("SET SESSION innodb_snapshot_isolation = ON")
        except MySQLdb.Error:
            pytest.skip("the server has no innodb_snapshot_isolation")
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with Producer("q", db.config()) as other, Producer("q", db.config()) as mine:
            other.put({"n": 0}, dedup_key="K")  # the key row exists before the snapshot
            cur.execute("SELECT COUNT(*) FROM nq_job")
            first = other.put({"n": 1}, dedup_key="K2")
            db.query("UPDATE nq_dedup SET job_id = job_id WHERE dedup_key = 'K'")  # no change
            try:
                got = mine.put({"n": 2}, dedup_key="K2", conn=caller)
            except MySQLdb.Error as e:
                assert e.args[0] == 1020
                caller.rollback()
            else:
                caller.commit()
                assert got == first
        assert _pending_with_key(db, "K2") == [first]
    finally:
        caller.close()


def test_puts_of_one_key_on_autocommit_connections_at_once_make_one_job(db):
    # Given 8 threads, each with its own connection in autocommit mode (no transaction open)
    cfg = db.config()
    keys = [f"key-{i}" for i in range(25)]
    got: dict[str, set[int]] = {k: set() for k in keys}
    failures: list[BaseException] = []
    guard = threading.Lock()
    start = threading.Barrier(8)

    def work() -> None:
        conn = _connect(db, autocommit=True)
        try:
            with Producer("q", cfg) as p:
                start.wait()
                for key in keys:
                    job_id = p.put({"k": key}, dedup_key=key, conn=conn)
                    with guard:
                        got[key].add(job_id)
        except BaseException as e:  # noqa: BLE001
            failures.append(e)
        finally:
            conn.close()

    threads = [threading.Thread(target=work, daemon=True) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, repr(failures[0])
    # When they all put the same keys at once: then each key has one job, and every put said so
    twice = {k: ids for k, ids in got.items() if len(ids) != 1}
    assert not twice, f"{len(twice)} of {len(keys)} keys got more than one job: {list(twice.items())[:3]}"
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == len(keys)


def test_an_autocommit_connection_inside_begin_keeps_the_callers_transaction(db):
    # Given a caller's connection in autocommit mode that opened a transaction with BEGIN
    conn = _connect(db, autocommit=True)
    try:
        with Producer("q", db.config()) as p:
            conn.begin()
            p.put({"n": 1}, dedup_key="K", conn=conn)
            p.put_many([{"n": 2}, {"n": 3}], conn=conn)
            # When the caller rolls back: then none of it was committed on its own
            conn.rollback()
            assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
            # And outside a transaction the puts commit by themselves
            job_id = p.put({"n": 4}, dedup_key="K", conn=conn)
            assert p.put({"n": 5}, dedup_key="K", conn=conn) == job_id
            assert len(p.put_many([{"n": 6}, {"n": 7}], conn=conn)) == 2
        assert db.scalar("SELECT COUNT(*) FROM nq_job") == 3
    finally:
        conn.close()
