"""A SIGHUP's reload on a running ConsumerService against a real server, through its main loop
(Supervisor._reload): a config that would take from a queue the process serves what it runs
with (its section, its handler) is refused as a whole, the old config running on; the next
good one applies."""

from __future__ import annotations

import contextlib
import json
import logging
import threading

import pytest
from conftest import wait_until

from notifyq.consume.service import ConsumeOptions, ConsumerService


class Notifier:
    """Stands in for systemd: what the loop reports."""

    watchdog_interval_s = None

    def __init__(self) -> None:
        self.ready_lines: list[str] = []

    def ready(self, status: str | None = None) -> None:
        self.ready_lines.append(status or "")

    def reloading(self, status: str | None = None) -> None:
        pass

    def status(self, text: str) -> None:
        pass

    def watchdog(self) -> None:
        pass

    def stopping(self, status: str | None = None) -> None:
        pass


@contextlib.contextmanager
def supervised(cfg, options: ConsumeOptions, service_class=ConsumerService):
    """The service on its main loop in a thread; yields reload(config), which SIGHUPs it with
    `config` and returns the STATUS= its READY=1 carried once the reload is over."""
    service = service_class(cfg, options)
    notifier = service.notifier = Notifier()
    stop, reload_requested = threading.Event(), threading.Event()
    pending: dict = {}
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.setdefault(
        "rc", service.run(stop, reload_requested, lambda: pending["config"])), daemon=True)
    thread.start()

    def reload(new):
        readies = len(notifier.ready_lines)
        pending["config"] = new
        reload_requested.set()
        wait_until(lambda: len(notifier.ready_lines) > readies or outcome, 20, message="the reload over")
        assert "rc" not in outcome, f"service ended: {outcome}"
        return notifier.ready_lines[-1]

    try:
        wait_until(lambda: service.workers and all(w.consumer_id for w in service.workers) or outcome,
                   30, message="workers registered")
        assert "rc" not in outcome, f"service ended early: {outcome}"
        yield service, reload
    finally:
        stop.set()
        thread.join(30)
    assert outcome.get("rc") == 0, outcome


LIMITED = {"handler": "json:dumps", "limit_per_key": 2, "limit": 5, "rate": "100/1s"}


@pytest.fixture(autouse=True)
def _notifyq_records_reach_caplog(caplog, monkeypatch):
    """notifyq's records reach caplog once, whatever an earlier test of this process left of
    notifyq's logging (its setup stops them at the notifyq logger, propagate False; a level may
    be left raised): caplog's handler sits on that logger, which does not propagate meanwhile."""
    logger = logging.getLogger("notifyq")
    level = logger.level
    monkeypatch.setattr(logger, "propagate", False)
    logger.setLevel(logging.INFO)  # (setLevel, not the attribute: it clears the loggers' caches)
    logger.addHandler(caplog.handler)
    yield
    logger.removeHandler(caplog.handler)
    logger.setLevel(level)


def refused(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.ERROR and r.getMessage().startswith("reload failed")]


def test_a_reload_that_drops_a_served_queues_section_is_refused_and_the_old_config_runs_on(db, caplog):
    """Regression: the reload kept the old handler but ran the queue on the defaults, its
    limits gone in silence (more jobs of a key at once than configured)."""
    # Given a consumer of a queue whose section sets its handler, limits and rate
    cfg = db.config(queue={"api": LIMITED})
    with supervised(cfg, ConsumeOptions(queues=("api",))) as (service, reload):
        worker, handler = service.workers[0], service.workers[0].handler
        # When SIGHUP reloads a config whose [queue.api] is gone (a typo in its name)
        status = reload(db.config(queue={"apl": LIMITED}))
        # Then the reload is refused, in one error line that names the section
        lines = refused(caplog)
        assert len(lines) == 1 and "[queue.api]" in lines[0], lines
        assert not any("reloaded config" in r.getMessage() for r in caplog.records)
        # And everything runs as before: the config, the worker's limits, its handler
        assert service.config is cfg
        assert worker.qc.flow_settings == cfg.queue("api").flow_settings
        assert worker.qc.limit_per_key == 2 and worker.handler is handler
        assert json.loads(service.presence.flow_applied)["api"]["limit_per_key"] == 2
        # And systemd's status says the reload failed
        assert "reload=failed" in status
        # When the section is back, with another limit, and SIGHUP comes again
        status = reload(db.config(queue={"api": {**LIMITED, "limit_per_key": 3}}))
        # Then that reload applies
        assert worker.qc.limit_per_key == 3 and "reload=failed" not in status


def test_a_reload_that_removes_a_queues_handler_line_is_refused_as_a_whole(db, caplog):
    # Given a consumer whose handler is its queue's section's
    cfg = db.config(queue={"api": LIMITED})
    with supervised(cfg, ConsumeOptions(queues=("api",))) as (service, reload):
        worker, handler = service.workers[0], service.workers[0].handler
        # When the handler line is removed, and the same edit lowers the batch size
        edited = {k: v for k, v in LIMITED.items() if k != "handler"}
        status = reload(db.config(queue={"api": {**edited, "batch_size": 7}}))
        # Then nothing of it applies: not the handler's absence, not the batch size
        lines = refused(caplog)
        assert len(lines) == 1 and "api" in lines[0] and "no handler" in lines[0], lines
        assert worker.handler is handler and worker.batch_size == cfg.queue("api").batch_size
        assert service.config is cfg and "reload=failed" in status


def test_a_queue_without_a_section_reloads_as_before(db, caplog):
    # Given a consumer of a queue on the defaults, its handler given in code
    cfg = db.config()
    with supervised(cfg, ConsumeOptions(queues=("plain",), function=lambda job: None)) as (service, reload):
        # When a reload changes the defaults (still no section for the queue)
        status = reload(db.config(defaults={"batch_size": 7}))
        # Then it applies
        assert not refused(caplog) and "reload=failed" not in status
        assert service.workers[0].batch_size == 7
