"""What a consumer and `jobs show` say of a job's end: a cancel is a cancel (not an error, not
dead), a lost ack names its job, a taken-back attempt says on which host it ran, and a job done
and not kept still shows its records."""

from __future__ import annotations

import json
import logging
import re
import threading

import pytest
from conftest import run_cli

import notifyq
from notifyq.consume import handlers
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.ops import admin
from notifyq.produce.producer import Producer
from notifyq.store import liveness
from notifyq.store.db import Session


class Lines(logging.Handler):
    """(level, message) of the notifyq.consumer log, caught on the logger itself."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelname, record.getMessage()))

    def __enter__(self) -> "Lines":
        self._logger = logging.getLogger("notifyq.consumer")
        self._level = self._logger.level
        self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


@pytest.fixture
def session(db):
    s = Session(db.config().dsn)
    yield s
    s.close()


def run_worker(cfg, handler) -> Worker:
    worker = Worker(cfg, "q", handlers.PythonHandler(handler, False), stop=threading.Event(),
                    budget=Budget(None), batch_size=10, exit_when_empty=True)
    worker.run()
    assert worker.error is None, worker.error
    return worker


def test_a_job_cancelled_while_it_ran_is_logged_and_counted_as_cancelled_not_as_dead(db, session):
    # Given a job whose cancel is requested while its handler runs, which then stops it
    cfg = db.config()
    with Producer("q", cfg) as p:
        job_id = p.put({"n": 1})

    def handler(job):
        assert admin.cancel(session, job.id, by="ops") == "requested"
        assert job.cancel_requested(max_age_s=0)
        job.fail("cancelled", retry=False)

    # When the worker records its end
    with Lines() as log:
        worker = run_worker(cfg, handler)
    # Then it ends cancelled, said at INFO as a cancel: no error line, no "job dead"
    assert db.scalar("SELECT status FROM nq_job WHERE id = %s", (job_id,)) == 5
    assert [level for level, _ in log.lines if level in ("ERROR", "WARNING")] == [], log.lines
    assert ("INFO", f"job cancelled queue=q job={job_id} attempt=1/5 error=cancelled") in log.lines
    # And counted as a cancel (the summary's cancelled=), neither failed nor dead
    assert (worker.stats.dead, worker.stats.failed, getattr(worker.stats, "cancelled", None)) == (0, 0, 1)


def stale_run(db, session) -> tuple[int, Worker, Lines]:
    """A job whose lease runs out while its first run goes on, taken back by a reaper; that
    run's completion is then refused (ClaimLost), and the next run does it: (job id, the
    worker, its log)."""
    cfg = db.config()
    with Producer("q", cfg) as p:
        job_id = p.put({"n": 1})

    def handler(job):
        if job.attempts > 1:
            return  # the run after the take-back: done
        db.query("UPDATE nq_job SET lease_until = NOW(6) - INTERVAL 1 SECOND WHERE id = %s", (job.id,))
        assert liveness.reclaim_expired(session) == 1
        with job.transaction():  # the stale run's completion: refused
            pass

    with Lines() as log:
        worker = run_worker(cfg, handler)
    return job_id, worker, log


def test_a_stale_runs_lost_outcome_names_its_job(db, session):
    # Given a stale run that ended with ClaimLost
    job_id, worker, log = stale_run(db, session)
    # Then the lost outcome is counted, and its line names the job
    lost = [line for level, line in log.lines if line.startswith("acks lost")]
    assert lost == [f"acks lost: jobs were reclaimed from us queue=q n=1 jobs={job_id}"], log.lines
    assert worker.stats.lost_acks == 1


def test_an_attempt_taken_back_for_its_expired_lease_says_on_which_host_it_ran(db, session):
    # Given a run taken back when its lease ran out, and the run after it
    job_id, _, _ = stale_run(db, session)
    # Then the taken-back attempt's record names its consumer's host, as the next run's does
    records = admin.attempts(session, job_id)
    assert [h["outcome"] for h in records] == ["taken back", "done"], records
    assert records[0]["host"] and records[0]["host"] == records[1]["host"], records


def test_jobs_show_shows_a_job_done_and_not_kept_from_its_records(db):
    # Given a job done on a queue that does not keep done jobs (its row deleted at the ack)
    cfg = db.config()
    with Producer("q", cfg) as p:
        job_id = p.put({"n": 1})
    run_worker(cfg, lambda job: None)
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE id = %s", (job_id,)) == 0
    # When `jobs show` is asked for it
    shown = run_cli(db.env, "jobs", "show", str(job_id))
    as_json = run_cli(db.env, "jobs", "show", str(job_id), "--json")
    # Then it shows what the records know, with exit 0: done, not kept, and its attempt
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"^status +done$", shown.stdout, re.M), shown.stdout
    assert re.search(r"^note +no row \(its records remain\): it was done at .* and not kept$", shown.stdout, re.M)
    assert "history:\n  attempt 1  done" in shown.stdout
    data = json.loads(as_json.stdout)
    assert (data["id"], data["status"], [h["outcome"] for h in data["history"]]) == (job_id, "done", ["done"])
    # And an id that never existed is still one error line, exit 4
    never = run_cli(db.env, "jobs", "show", str(job_id + 1000))
    assert never.returncode == notifyq.errors.EXIT_INPUT and never.stderr.count("\n") == 1
