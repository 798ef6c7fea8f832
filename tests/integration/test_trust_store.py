"""The store's promises to producers: a failed transaction leaves nothing behind, enqueue times
are UTC whatever the caller's session says, ids are the rows' own, and a payload too big for the
server is refused with notifyq's error before anything is written."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from notifyq.consume import periodic
from notifyq.store.db import Session

UTC = dt.timezone.utc


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
