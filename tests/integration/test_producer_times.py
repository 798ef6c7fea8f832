"""A put at a given time (put(run_at=...), `produce --at`) is due by the server's clock, not the
producer's (issue 26, also): the README says producer clocks never matter."""

from __future__ import annotations

import datetime as dt
import types

import MySQLdb
import pytest

from notifyq import errors
from notifyq.produce import producer as producer_mod
from notifyq.produce.producer import Producer


def _connect(db, autocommit: bool):
    return MySQLdb.connect(**db.dsn.connect_args(), autocommit=autocommit)


class _AnyDatetime(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, dt.datetime)


def _producer_clock_off_by(monkeypatch, skew: dt.timedelta) -> None:
    """The producer's clock (and only the producer module's) runs `skew` off the server's."""
    class SkewedDatetime(metaclass=_AnyDatetime):
        @staticmethod
        def now(tz=None):
            return dt.datetime.now(tz) + skew

    monkeypatch.setattr(producer_mod, "dt", types.SimpleNamespace(datetime=SkewedDatetime, timezone=dt.timezone,
                                                                  timedelta=dt.timedelta))


@pytest.mark.parametrize("conn", [False, True])
def test_a_put_at_a_given_time_is_due_by_the_servers_clock_whatever_the_producers_says(db, monkeypatch, conn):
    # Given a producer whose clock runs an hour ahead of the server's
    _producer_clock_off_by(monkeypatch, dt.timedelta(hours=1))
    server_now = db.scalar("SELECT UTC_TIMESTAMP(6)").replace(tzinfo=dt.timezone.utc)
    later = server_now + dt.timedelta(minutes=30)
    earlier = server_now - dt.timedelta(minutes=30)
    caller = _connect(db, autocommit=False) if conn else None
    try:
        with Producer("q", db.config()) as p:
            # When it puts one job for 30 minutes from now and one for 30 minutes ago (server time)
            ahead = p.put({"n": 1}, run_at=later, conn=caller)
            past = p.put({"n": 2}, run_at=earlier, conn=caller)
            many = p.put_many([{"n": 3}, {"n": 4}], run_at=later, conn=caller)
            if caller is not None:
                caller.commit()
    finally:
        if caller is not None:
            caller.close()
    rows = {r[0]: r[1:] for r in db.query(
        "SELECT id, status, run_at, run_at <= UTC_TIMESTAMP(6) FROM nq_job")}
    # Then the one ahead waits until exactly its time, and the one past is ready now
    for job_id in (ahead, *many):
        assert rows[job_id][0] == 1
        assert rows[job_id][1] == later.replace(tzinfo=None)
    assert rows[past][0] == 0 and rows[past][2] == 1


def test_a_put_at_a_given_time_still_refuses_a_naive_time_and_one_centuries_ahead(db):
    with Producer("q", db.config()) as p:
        with pytest.raises(errors.InputError):
            p.put({"n": 1}, run_at=dt.datetime(2030, 1, 1))
        with pytest.raises(errors.InputError):
            p.put({"n": 1}, run_at=dt.datetime(9000, 1, 1, tzinfo=dt.timezone.utc))
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
