"""A claimed Job's run_at and created_at: the server's text (bytes), decoded when first read, and then
the same datetimes, repr and fields a Job built with datetimes has (jobs.claimed)."""

import dataclasses
import datetime as dt
import inspect
import pickle

from notifyq.jobs import Job, claimed, run_of

RUN_AT = dt.datetime(2026, 11, 30, 4, 52, 47, 123456)
CREATED_AT = dt.datetime(2026, 11, 30, 4, 52, 46, 1)


def made() -> Job:
    return Job(id=7, queue="q", payload={"a": 1}, priority=2, attempts=1, max_attempts=5, run_at=RUN_AT,
               created_at=CREATED_AT, dedup_key="d", key="k")


def taken() -> Job:
    return claimed(7, "q", {"a": 1}, 2, 1, 5, b"2026-11-30 04:52:47.123456", b"2026-11-30 04:52:46.000001",
                   "d", "k")


def test_a_claimed_jobs_times_read_as_the_datetimes_the_driver_gives():
    job = taken()
    assert job.run_at == RUN_AT and job.created_at == CREATED_AT
    assert type(job.run_at) is dt.datetime and job.run_at.tzinfo is None and job.created_at.tzinfo is None
    assert job.run_at is job.run_at  # decoded once, then kept


def test_a_claimed_job_is_a_job_as_job_makes_it():
    job, other = taken(), made()
    assert repr(job) == repr(other)
    assert [f.name for f in dataclasses.fields(job)] == [f.name for f in dataclasses.fields(other)]
    drop = {"_run_state"}
    assert ({k: v for k, v in dataclasses.asdict(job).items() if k not in drop}
            == {k: v for k, v in dataclasses.asdict(other).items() if k not in drop})
    assert job != other and job == job  # identity, as before (eq=False)
    assert run_of(job).error is None and job.error is None and job.retry
    assert dataclasses.replace(job, id=8).run_at == RUN_AT
    assert pickle.loads(pickle.dumps(taken())).created_at == CREATED_AT


def test_jobs_signature_and_stored_values_stay():
    params = inspect.signature(Job).parameters
    assert params["run_at"].default is inspect.Parameter.empty
    assert params["created_at"].default is inspect.Parameter.empty
    job = made()
    assert job.run_at is RUN_AT  # what Job() was given, untouched
    job.created_at = "anything"  # a plain attribute to whoever sets it
    assert job.created_at == "anything"
    fresh = taken()
    fresh.run_at = RUN_AT.replace(year=2030)
    assert fresh.run_at.year == 2030


def test_a_zero_date_reads_as_none_as_the_driver_reads_it():
    job = claimed(1, "q", {}, 0, 1, 5, b"0000-00-00 00:00:00.000000", b"2026-01-01 00:00:00.000000", None, None)
    assert job.run_at is None and job.created_at == dt.datetime(2026, 1, 1)
