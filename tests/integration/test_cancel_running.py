"""Cancel of a running job of every kind (issue 29): a job cancelled while it ran ends
`cancelled`, not dead, with who and when; a --command is stopped at once; a per-batch handler
learns which of its jobs were cancelled; status and `jobs list --status` tell them apart."""

from __future__ import annotations

import sys
import threading
import time

from conftest import run_cli, wait_until

import notifyq
from notifyq.consume import commands, handlers
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.ops import admin, status
from notifyq.produce.producer import Producer
from notifyq.store.db import Session


def _worker(cfg, handler) -> Worker:
    return Worker(cfg, "q", handler, stop=threading.Event(), budget=Budget(None), batch_size=10,
                  exit_when_empty=True)


def _status_of(db, job_id):
    return db.scalar("SELECT status FROM nq_job WHERE id = %s", (job_id,))


def test_a_cancelled_command_is_stopped_at_once_and_its_job_ends_cancelled(db, tmp_path):
    # Given a --command job that would run 60 s, ignoring SIGTERM (so SIGKILL has to come)
    script = tmp_path / "stubborn.py"
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n")
    cfg = db.config()
    with Producer("q", cfg) as p:
        job_id = p.put({"n": 1})
    worker = _worker(cfg, commands.CommandHandler(f"{sys.executable} {script}", False, 120.0))
    t = threading.Thread(target=worker.run)
    t.start()
    session = Session(cfg.dsn)
    try:
        wait_until(lambda: _status_of(db, job_id) == 2, 15, message="the command running")
        # When an operator cancels it
        asked = time.monotonic()
        assert admin.cancel(session, job_id, by="ops@test") == "requested"
        # Then the command is stopped (SIGTERM, then SIGKILL 2 s later) and the job ends cancelled
        wait_until(lambda: _status_of(db, job_id) == 5, 15, message="the job cancelled")
        took = time.monotonic() - asked
    finally:
        worker.stop.set()
        t.join(30)
        session.close()
    assert took < 6.0, took
    job = admin.get_job(Session(cfg.dsn), job_id, history=True)
    assert job["status"] == "cancelled" and job["cancelled_by"] == "ops@test" and job["cancelled_at"]
    assert job["last_error"].startswith("cancelled: the command was stopped")
    assert [h["outcome"] for h in job["history"]] == ["cancelled"]


def test_a_per_batch_handler_learns_which_of_its_jobs_were_cancelled(db):
    # Given a batch of three jobs whose handler waits until it sees a cancel
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(3)])
    seen: list[list[int]] = []
    started = threading.Event()

    def handler(jobs):
        started.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            gone = notifyq.cancelled(jobs)
            if gone:
                seen.append([j.id for j in gone])
                for job in gone:
                    job.fail("cancelled", retry=False)
                return
            time.sleep(0.02)  # a handler's own pace between checks

    worker = _worker(cfg, handlers.PythonHandler(handler, True))
    t = threading.Thread(target=worker.run)
    t.start()
    session = Session(cfg.dsn)
    try:
        assert started.wait(15)
        # When one of them is cancelled
        assert admin.cancel(session, ids[1]) == "requested"
        t.join(30)
    finally:
        worker.stop.set()
        t.join(30)
        session.close()
    # Then the handler was told exactly that one; it ends cancelled, the others done
    assert seen == [[ids[1]]]
    assert _status_of(db, ids[1]) == 5
    assert _status_of(db, ids[0]) is None and _status_of(db, ids[2]) is None


def test_status_and_jobs_list_tell_cancelled_from_dead(db):
    # Given one job that ends dead and one cancelled while it ran
    cfg = db.config(defaults={"max_attempts": 1})
    with Producer("q", cfg) as p:
        dead, cancelled = p.put_many([{"n": 0}, {"n": 1}])
    session = Session(cfg.dsn)

    def handler(job):
        if job.id == cancelled:
            assert admin.cancel(session, cancelled) == "requested"
        raise ValueError("no")

    try:
        _worker(cfg, handlers.PythonHandler(handler, False)).run()
        # Then status counts each in its own column
        figures = status.collect(session)["queues"]["q"]
        assert (figures["dead"], figures["cancelled"]) == (1, 1)
    finally:
        session.close()
    # And `jobs list --status` lists each apart
    listed = run_cli(db.env, "jobs", "list", "--status", "cancelled", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [j["id"] for j in __import__("json").loads(listed.stdout)] == [cancelled]
    listed = run_cli(db.env, "jobs", "list", "--status", "dead", "--json")
    assert [j["id"] for j in __import__("json").loads(listed.stdout)] == [dead]
