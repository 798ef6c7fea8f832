"""The store's promises to producers: a failed transaction leaves nothing behind, enqueue times
are UTC whatever the caller's session says, ids are the rows' own, and a payload too big for the
server is refused with notifyq's error before anything is written."""

from __future__ import annotations

import datetime as dt
import json
import time

import MySQLdb
import pytest
from conftest import SMALL_PACKET, wait_until

from notifyq import errors
from notifyq.consume import periodic
from notifyq.produce.producer import Producer
from notifyq.store import inserts, queries
from notifyq.store.db import Session

UTC = dt.timezone.utc


def caller_connection(db, **kw):
    return MySQLdb.connect(**db.dsn.connect_args(), autocommit=False, **kw)


# ---------------------------------------------------------------- item 6: any exception rolls back

def test_an_exception_that_is_not_a_driver_error_rolls_back_and_the_next_commit_writes_nothing_of_it(db):
    session = Session(db.dsn, name="test")
    try:
        def half_done(cur):
            cur.execute("INSERT INTO nq_queue (queue) VALUES ('half')")
            raise ValueError("bad input found after the first statement")

        # When a transaction's body fails with an exception that is not the driver's
        with pytest.raises(ValueError):
            session.run(half_done, what="half done")
        # And the session's next transaction commits
        session.run(lambda cur: cur.execute("INSERT INTO nq_queue (queue) VALUES ('next')"), what="next")
        # Then only the next one's work is there
        assert [r[0] for r in db.query("SELECT queue FROM nq_queue ORDER BY queue")] == ["next"]
    finally:
        session.close()


def test_a_periodic_entry_whose_payload_cannot_be_enqueued_does_not_use_up_its_ticks(db):
    t0 = dt.datetime(2026, 1, 5, 12, 0, 30, tzinfo=UTC)
    cfg = db.config(queue={"cron": {"periodic": [{"cron": "* * * * *", "name": "nan",
                                                  "payload": {"kind": "report"}}]}})

    class Clocked(periodic.Scheduler):
        def _server_clock(self) -> float:
            return self.now.timestamp()

        def _server_now(self) -> dt.datetime:
            return self.now

    sched = Clocked(cfg, ("cron",), leader_retry_s=0.0, retention_first_s=0.0)
    sched.now = t0
    try:
        sched.tick()  # the baseline: 12:00
        baseline = db.scalar("SELECT last_tick FROM nq_periodic")
        # Given an entry whose payload cannot be encoded (nan is not JSON)
        sched.entries[0].payload = {"kind": "report", "x": float("nan")}
        sched.now = t0.replace(minute=1)
        # When its tick fails, and the scheduler goes on using its session
        for _ in range(2):
            sched.tick()
            sched._pause_until = 0.0  # no 5 s error backoff in a test
        sched.entries[0].payload = {"kind": "report"}
        sched.tick()
        # Then the failed tick was not recorded as done: fixed, the entry enqueues it
        assert db.scalar("SELECT COUNT(*) FROM nq_job") == 1
        assert json.loads(db.scalar("SELECT payload FROM nq_job"))["tick"] == "2026-01-05T12:01:00+00:00"
        assert db.scalar("SELECT last_tick FROM nq_periodic") > baseline
    finally:
        sched.close()


# ---------------------------------------------------------------- item 7: UTC on the caller's session

@pytest.mark.parametrize("time_zone", ["+05:00", "-05:00"])
def test_transactional_enqueue_writes_utc_whatever_the_callers_session_time_zone(db, time_zone):
    # Given a caller whose session runs in another time zone
    conn = caller_connection(db)
    try:
        conn.cursor().execute("SET SESSION time_zone = %s", (time_zone,))
        with Producer("q", db.config()) as p:
            # When it enqueues in its own transaction, one job in 2 s and three at once
            delayed = p.put({"n": 1}, delay=2, conn=conn)
            now_ids = [*p.put_many([{"n": 2}, {"n": 3}], conn=conn), p.put({"n": 4}, dedup_key="k", conn=conn)]
            conn.commit()
            committed = time.monotonic()
        # Then its session is as it left it
        cur = conn.cursor()
        cur.execute("SELECT @@session.time_zone")
        assert cur.fetchone()[0] == time_zone
    finally:
        conn.close()
    # And run_at and created_at are UTC: created now, the delayed job due 2 s after it
    rows = db.query("SELECT id, TIMESTAMPDIFF(MICROSECOND, created_at, run_at), "
                    "TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) FROM nq_job ORDER BY id")
    due_after = {job_id: us / 1e6 for job_id, us, _ in rows}
    assert due_after[delayed] == 2.0 and all(due_after[i] == 0 for i in now_ids)
    assert all(0 <= age_us / 1e6 < 30 for _, _, age_us in rows)
    # And a consumer claims the delayed job once it is due: not hours early or late
    session = Session(db.dsn, name="claimer")
    try:
        first = queries.claim(session, "q", "c1", 10, 60)
        if time.monotonic() - committed < 1.5:  # (a very slow machine may be past the 2 s already)
            assert sorted(j.id for j in first.jobs) == sorted(now_ids)
        claimed = [j.id for j in first.jobs]

        def delayed_claimed() -> bool:
            claimed.extend(j.id for j in queries.claim(session, "q", "c1", 10, 60).jobs)
            return delayed in claimed

        wait_until(delayed_claimed, timeout=10, message="the delayed job to be claimed")
    finally:
        session.close()


# ---------------------------------------------------------------- issue 16: ids after an increment change

def _set_increment(conn, n: int) -> None:
    conn.cursor().execute("SET SESSION auto_increment_increment = %s", (n,))


@pytest.mark.parametrize("returning", [True, False], ids=["mariadb-returning", "increment-read"])
def test_put_many_returns_the_rows_ids_after_the_sessions_auto_increment_increment_changed(db, monkeypatch, returning):
    # Both ways of learning the ids: MariaDB's RETURNING, and MySQL's increment read with the insert
    monkeypatch.setattr(inserts, "returns_ids", lambda conn: returning, raising=False)
    with Producer("q", db.config(producer={"chunk_size": 3})) as p:
        before = p.put_many([{"n": i} for i in range(4)])
        # Given a session whose increment changes after it connected (a Galera node left or joined)
        _set_increment(p._session.conn, 3)
        # When more jobs are enqueued, in several chunks
        after = p.put_many([{"n": i} for i in range(4, 11)])
        one = p.put({"n": 11})
    # Then every id returned is the id of the row holding that payload
    rows = dict(db.query("SELECT id, payload FROM nq_job"))
    assert [json.loads(rows[i])["n"] for i in before + after + [one]] == list(range(12))


@pytest.mark.parametrize("returning", [True, False], ids=["mariadb-returning", "increment-read"])
@pytest.mark.parametrize("multi_statements", [True, False])
def test_put_many_on_the_callers_connection_returns_the_rows_ids_with_its_increment(
        db, monkeypatch, returning, multi_statements):
    monkeypatch.setattr(inserts, "returns_ids", lambda conn: returning)
    conn = caller_connection(db, multi_statements=multi_statements)
    try:
        _set_increment(conn, 5)
        with Producer("q", db.config(producer={"chunk_size": 3})) as p:
            ids = p.put_many([{"n": i} for i in range(7)], conn=conn)
        conn.commit()
    finally:
        conn.close()
    rows = dict(db.query("SELECT id, payload FROM nq_job"))
    assert [json.loads(rows[i])["n"] for i in ids] == list(range(7))


# ---------------------------------------------------------------- item 8: statement size vs max_allowed_packet

def big_config(db, **producer):
    return db.config(producer={"max_payload_bytes": 4 * SMALL_PACKET, **producer})


def test_put_many_splits_its_inserts_by_bytes_and_commits_all_of_them_in_one_transaction(db, small_packet):
    # Given payloads of 60 KB: 500 of them are 30 MB, thirty times the server's packet
    payloads = [{"n": i, "s": "x" * 60_000} for i in range(500)]
    with Producer("q", big_config(db)) as p:
        # When they are enqueued at once
        ids = p.put_many(payloads)
        # Then every one is there, in order
    assert len(ids) == 500
    rows = db.query("SELECT id, JSON_VALUE(payload, '$.n') FROM nq_job ORDER BY id")
    assert [r[0] for r in rows] == ids and [int(r[1]) for r in rows] == list(range(500))
    assert int(db.scalar("SELECT SUM(seq) FROM nq_signal")) == 500


@pytest.mark.parametrize("callers", [False, True], ids=["own-session", "callers-connection"])
def test_a_payload_too_big_for_the_server_raises_input_error_and_writes_nothing(db, small_packet, callers):
    fits = "y" * (SMALL_PACKET - 8192)  # near the limit, but it fits: not refused early
    too_big = "z" * SMALL_PACKET
    conn = caller_connection(db) if callers else None
    try:
        with Producer("q", big_config(db)) as p:
            # When one payload is too big, alone or among others
            with pytest.raises(errors.InputError, match="max_allowed_packet"):
                p.put(too_big, conn=conn)
            with pytest.raises(errors.InputError, match=r"payload 3 of 4 .*max_allowed_packet"):
                p.put_many([1, 2, too_big, 4], conn=conn)
            with pytest.raises(errors.InputError, match="max_allowed_packet"):
                p.put(too_big, dedup_key="k", conn=conn)
            # Then the session is usable and nothing of the refused calls is written
            job = p.put(fits, conn=conn)
            if conn is not None:
                conn.commit()
    finally:
        if conn is not None:
            conn.close()
    assert [r[0] for r in db.query("SELECT id FROM nq_job")] == [job]
    assert len(db.scalar("SELECT payload FROM nq_job")) == len(fits) + 2
    assert int(db.scalar("SELECT COALESCE(SUM(seq), 0) FROM nq_signal")) == 1
