"""A reaper pass that fails is housekeeping that failed, not the worker: the pass runs on a
session of its own with a short retry budget, which a stopped process (SIGSTOP, a paused VM) or
an outage can use up; the worker goes on, and the next pass comes in reap_interval_s. Found by
the fault schedule (seed 4): a consumer SIGSTOPped inside a pass exited 5 when it woke."""

from __future__ import annotations

import dataclasses
import socket
import threading

from notifyq.consume import handlers, reaper
from notifyq.consume.presence import Presence
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer
from notifyq.store.db import Session


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def unreachable_reaper(monkeypatch) -> None:
    """Each pass's session talks to a port nobody listens on, with no retry budget left: a
    real connect failure, as when a stop used the budget up."""
    def open_session(dsn):
        gone = dataclasses.replace(dsn, host="127.0.0.1", port=closed_port(), unix_socket=None, hosts=())
        return Session(gone, name="reaper", retry_s=0)

    monkeypatch.setattr(reaper, "open_session", open_session)


def test_a_failed_reaper_pass_returns_an_empty_result_and_the_next_one_is_due_later(db, monkeypatch):
    cfg = db.config()
    presence = Presence(cfg, ["q"], threading.Event())
    presence.ensure_registered(object())
    unreachable_reaper(monkeypatch)
    try:
        result = presence.reap_pass()
        assert result == reaper.ReapResult()
        assert presence.maybe_reap(object(), Session(cfg.dsn), check=False) == 0
    finally:
        presence.close()


def test_a_worker_whose_reaper_pass_fails_goes_on_and_finishes_its_jobs(db, monkeypatch):
    # Given three jobs and a worker whose reaper passes cannot reach the server
    with Producer("q", db.config()) as p:
        ids = p.put_many([{"n": i} for i in range(3)])
    unreachable_reaper(monkeypatch)
    ran = []
    worker = Worker(db.config(), "q", handlers.PythonHandler(lambda job: ran.append(job.id), False),
                    stop=threading.Event(), budget=Budget(None), batch_size=3, exit_when_empty=True)
    # When it runs them and, finding the queue empty, runs a pass before it exits
    worker.run()
    # Then the failed pass did not fail the worker: its jobs are done, it ended cleanly
    assert worker.error is None, worker.error
    assert sorted(ran) == ids
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status <> 3 AND id IN (%s, %s, %s)", tuple(ids)) == 0
