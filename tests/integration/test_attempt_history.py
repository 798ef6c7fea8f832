"""Every attempt keeps its record (nq_attempt): start, end, consumer, host, outcome, error and
traceback, bounded; `jobs show` shows it, and a job that is gone says what became of it."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from test_effects import drain, put

from notifyq import errors
from notifyq.consume import periodic
from notifyq.ops import admin
from notifyq.store import queries
from notifyq.store.db import Session


@pytest.fixture
def session(db):
    s = Session(db.config().dsn)
    yield s
    s.close()


def test_each_attempt_is_recorded_with_its_error_traceback_and_where_it_ran(db, session):
    # Given a job that fails twice (the second time with a huge non-ASCII error) and then succeeds
    [job_id] = put(db, max_attempts=5)

    def handler(job):
        if job.attempts == 1:
            raise ValueError("first")
        if job.attempts == 2:
            raise RuntimeError("\u6f22" * 30000)

    # When a worker runs it to the end
    drain(db, handler)

    # Then its three attempts are on record, in order, with where and when they ran
    history = admin.attempts(session, job_id)
    assert [(h["attempt"], h["outcome"]) for h in history] == [(1, "failed"), (2, "failed"), (3, "done")]
    assert history[0]["error"] == "ValueError: first" and "raise ValueError" in history[0]["traceback"]
    assert all(h["host"] == queries.HOST and h["consumer"] and h["started_at"] <= h["ended_at"] for h in history)
    # And an error is cut by bytes, on a character boundary
    assert len(history[1]["error"].encode()) <= queries.ATTEMPT_ERROR_BYTES
    assert history[1]["error"].startswith("RuntimeError: \u6f22\u6f22")


def test_a_job_keeps_only_its_last_attempts(db, session, monkeypatch):
    # Given a job kept to its last 2 attempt records, that fails 4 times and then ends dead
    monkeypatch.setattr(queries, "ATTEMPTS_KEPT", 2)
    [job_id] = put(db, max_attempts=4)

    def handler(job):
        raise ValueError(f"attempt {job.attempts}")

    drain(db, handler)
    # Then only the last two records are kept: the third failure and the burial
    assert [(h["attempt"], h["outcome"], h["error"]) for h in admin.attempts(session, job_id)] == [
        (3, "failed", "ValueError: attempt 3"), (4, "dead", "ValueError: attempt 4")]


def test_a_job_that_keeps_snoozing_keeps_only_its_last_records(db, session):
    # Given a job that snoozes 14 times (a snooze spends no attempt: its number stays 1), then
    # fails once and is done
    [job_id] = put(db, max_attempts=3)
    runs = []

    def handler(job):
        runs.append(job.attempts)
        if len(runs) <= 14:
            job.snooze(0)
        elif len(runs) == 15:
            raise ValueError("once")

    drain(db, handler)
    # Then its records are the last ATTEMPTS_KEPT before the one that ended it, not one per run
    history = admin.attempts(session, job_id)
    assert len(runs) == 16
    assert [h["outcome"] for h in history] == ["snoozed"] * (queries.ATTEMPTS_KEPT - 1) + ["failed", "done"]


def test_a_job_that_is_gone_says_whether_it_was_done_cancelled_purged_or_never_existed(db, session):
    # Given a job done (and deleted), one cancelled before it ran, one purged once dead
    done, dead = put(db, 2, max_attempts=1)

    def handler(job):
        if job.id == dead:
            raise ValueError("no")

    drain(db, handler)
    [cancelled] = put(db)
    assert admin.cancel(session, cancelled) == "deleted"
    assert admin.purge(session, [4], 0.0) == (1, True)

    # Then `no job N` says which, and for an id never used, that it never existed
    def message(job_id):
        with pytest.raises(errors.InputError) as e:
            admin.get_job(session, job_id)
        return str(e.value)

    assert f"no job {done}: it was done at " in message(done)
    assert f"no job {cancelled}: it was cancelled at " in message(cancelled)
    assert f"no job {dead}: it was purged at " in message(dead)
    assert "never existed" in message(10_000)


def test_jobs_show_prints_the_history_and_json_carries_it(db):
    # Given a job that failed once and is waiting for its retry
    [job_id] = put(db, max_attempts=3)

    def handler(job):
        raise ValueError("boom")

    cfg = db.config(defaults={"retry_base_s": 3600, "retry_max_s": 3600})
    from notifyq.consume import handlers
    from notifyq.consume.stats import Budget
    from notifyq.consume.worker import Worker
    import threading

    Worker(cfg, "q", handlers.PythonHandler(handler, False), stop=threading.Event(), budget=Budget(None),
           batch_size=10, exit_when_empty=True).run()

    # When an operator looks at it
    shown = run_cli(db.env, "jobs", "show", str(job_id))
    as_json = run_cli(db.env, "jobs", "show", str(job_id), "--json")

    # Then the attempt, its error and its traceback are there, in both forms
    assert shown.returncode == 0, shown.stderr
    assert "history:" in shown.stdout and "attempt 1  failed" in shown.stdout and "ValueError: boom" in shown.stdout
    record = json.loads(as_json.stdout)["history"]
    assert [(h["attempt"], h["outcome"], h["error"]) for h in record] == [(1, "failed", "ValueError: boom")]
    assert "Traceback" in record[0]["traceback"]


def test_retention_drops_attempt_records_past_the_queues_retention(db, session):
    # Given a done job's record
    [job_id] = put(db)
    drain(db, lambda job: None)
    assert len(admin.attempts(session, job_id)) == 1
    # When retention runs with a retention shorter than its age
    db.query("UPDATE nq_attempt SET ended_at = ended_at - INTERVAL 2 DAY")
    assert periodic.purge_finished(session, "q", 86400.0)[1]
    # Then the record is gone
    assert admin.attempts(session, job_id) == []


def test_with_retention_0_the_records_of_jobs_gone_go_and_those_of_jobs_kept_stay(db, session):
    # Given a queue that keeps finished jobs for ever (retention_s = 0) but not done ones
    # (keep_done = false): a job done, so deleted at its ack, and one dead, so kept; both
    # records older than the week the records of a job gone are kept
    done, dead = put(db, 2, max_attempts=1)

    def handler(job):
        if job.id == dead:
            raise ValueError("no")

    drain(db, handler, retention_s=0)
    db.query("UPDATE nq_attempt SET ended_at = ended_at - INTERVAL 8 DAY")
    # When a retention pass runs
    scheduler = periodic.Scheduler(db.config(defaults={"retention_s": 0}), ("q",), retention_first_s=0)
    try:
        scheduler.tick()
    finally:
        scheduler.close()
    # Then the done job's record is gone, and the dead job's stays with its job
    assert admin.attempts(session, done) == []
    assert [h["outcome"] for h in admin.attempts(session, dead)] == ["dead"]


def test_the_records_of_jobs_gone_are_found_behind_those_of_kept_jobs_chunk_by_chunk(db, session):
    # Given, oldest first, the records of three dead jobs (kept) and of three done jobs (gone)
    ids = put(db, 6, max_attempts=1)

    def handler(job):
        if job.id in ids[:3]:
            raise ValueError("no")

    drain(db, handler)
    db.query("UPDATE nq_attempt SET ended_at = ended_at - INTERVAL 10 DAY WHERE job_id IN %s", (ids[:3],))
    db.query("UPDATE nq_attempt SET ended_at = ended_at - INTERVAL 9 DAY WHERE job_id IN %s", (ids[3:],))
    # When retention for retention_s = 0 runs in chunks of 2, one chunk a pass
    after, passes = periodic.admin_queries.GONE_ATTEMPTS_START, []
    while len(passes) < 10:
        deleted, complete, after = periodic.purge_gone_attempts(session, "q", 86400.0, after, chunk=2, max_chunks=1)
        passes.append((deleted, complete))
        if complete:
            break
    # Then each record was read once: the kept jobs' did not stop the passes, and the gone
    # jobs' records went
    assert passes == [(0, False), (1, False), (2, False), (0, True)]
    assert db.scalar("SELECT COUNT(*) FROM nq_attempt") == 3
    assert sorted(r[0] for r in db.query("SELECT job_id FROM nq_attempt")) == ids[:3]


def test_an_attempt_taken_back_by_a_reaper_is_on_record(db, session):
    # Given a job claimed by a consumer whose lease runs out before it finishes
    from notifyq.store import liveness

    [job_id] = put(db)
    claim = queries.claim(session, "q", "d" * 32, 1, 60)
    assert [j.id for j in claim.jobs] == [job_id]
    db.query("UPDATE nq_job SET lease_until = NOW(6) - INTERVAL 1 SECOND WHERE id = %s", (job_id,))
    # When a reaper takes it back
    assert liveness.reclaim_expired(session) == 1
    # Then its attempt is on record: taken back, by whom it was held, why
    [h] = admin.attempts(session, job_id)
    assert (h["attempt"], h["outcome"], h["consumer"]) == (1, "taken back", "d" * 32)
    assert "lease expired" in h["error"]


@pytest.mark.parametrize("spread", [1, 10], ids=["ids-close-together", "ids-far-apart"])
def test_an_acks_records_carry_each_jobs_own_times_whether_its_ids_lie_close_or_far_apart(db, session, spread):
    # Given 30 claimed jobs, and an ack of 3 of them whose ids lie next to each other or 10 apart
    # (attempt_acked_dense lays the times out by id, attempt_acked finds them by the id's place)
    put(db, 30)
    claim = queries.claim(session, "q", "c" * 32, 30, 60)
    session.pipeline.read_reply()
    ids = [job.id for job in claim.jobs][::spread][:3]
    # each started and ended at its own time: the second job ran 2 ms, the others 1 and 3 ms
    started, ended = [100.0, 100.010, 100.020], [100.001, 100.012, 100.023]
    acks = queries.Acks(ids, claim.token, keep=False, started=started, ended=ended)
    assert (acks.statements()[0][0] == queries.Q["attempt_acked_dense"]) == (spread == 1)

    # When they are acked
    assert queries.ack(session, ids, claim.token, keep=False, acks=acks) == 3

    # Then each record holds its own job's run: its length and its start after the first's
    records = {r[0]: (r[1], r[2]) for r in db.query(
        "SELECT job_id, started_at, ended_at FROM nq_attempt WHERE claim_token = %s", (claim.token,))}
    first_start = records[ids[0]][0]
    lengths = [(records[i][1] - records[i][0]).total_seconds() for i in ids]
    starts = [(records[i][0] - first_start).total_seconds() for i in ids]
    # (to the microsecond: each age is the client's float difference, cut to whole microseconds)
    assert all(abs(got - want) <= 2e-6 for got, want in zip(lengths, [0.001, 0.002, 0.003])), lengths
    assert all(abs(got - want) <= 2e-6 for got, want in zip(starts, [0.0, 0.010, 0.020])), starts
