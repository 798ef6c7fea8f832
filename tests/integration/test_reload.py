"""A SIGHUP's reload on a running ConsumerService against a real server, through its main loop
(Supervisor._reload): a config that would take from a queue the process serves what it runs
with (its section, the [defaults] section, its handler) is refused as a whole, the old config
running on; the next good one applies. The metrics count both kinds."""

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


def test_a_reload_that_drops_the_defaults_section_is_refused_and_the_old_config_runs_on(db, caplog):
    """Regression: deleting [defaults] in a reload applied the built-in defaults to every queue
    in silence (a queue on the defaults lost its batch size, a queue with a section the values
    it took from [defaults])."""
    # Given a consumer of a queue on the defaults, whose [defaults] sets its batch size
    cfg = db.config(defaults={"batch_size": 7})
    with supervised(cfg, ConsumeOptions(queues=("plain",), function=lambda job: None)) as (service, reload):
        worker = service.workers[0]
        # When SIGHUP reloads a config without [defaults] (the same edit raising a wakeup setting)
        status = reload(db.config(wakeup={"poll_max_s": 0.3}))
        # Then the reload is refused, in one error line that names the section
        lines = refused(caplog)
        assert len(lines) == 1 and "[defaults]" in lines[0] and "built-in defaults" in lines[0], lines
        assert not any("reloaded config" in r.getMessage() for r in caplog.records)
        # And everything runs as before, and systemd's status says the reload failed
        assert service.config is cfg and worker.batch_size == 7 and "reload=failed" in status
        # When [defaults] is back, even empty (the built-in defaults, on purpose), and SIGHUP comes
        status = reload(db.config(defaults={}))
        # Then that reload applies
        assert "reload=failed" not in status and worker.batch_size == 100


def test_a_reload_that_drops_the_defaults_and_a_queues_section_names_both(db, caplog):
    # Given a consumer of a queue with a section, beside [defaults]
    cfg = db.config(defaults={"max_attempts": 3}, queue={"api": LIMITED})
    with supervised(cfg, ConsumeOptions(queues=("api",))) as (service, reload):
        # When a reload's config has neither (the file emptied)
        status = reload(db.config())
        # Then one error line names both sections, and the old config runs on
        lines = refused(caplog)
        assert len(lines) == 1 and "[defaults], [queue.api]" in lines[0], lines
        assert service.config is cfg and "reload=failed" in status


def test_the_metrics_count_applied_and_refused_reloads(db, caplog):
    """Regression: a refused reload showed only in the log and STATUS=; nothing a scraper reads."""
    from test_features_metrics import samples, scrape

    from notifyq.ops import metrics
    from notifyq.sharding.servers import QueueDepths

    def reloads(port: int) -> dict[str, float]:
        code, text = scrape(port)
        assert code == 200, text
        return {dict(labels)["result"]: v for (name, labels), v in samples(text).items()
                if name == "notifyq_reloads_total"}

    # Given a consumer serving metrics, of a queue whose section sets its limits
    cfg = db.config(queue={"api": LIMITED})
    with supervised(cfg, ConsumeOptions(queues=("api",))) as (service, reload):
        server = metrics.serve(service, QueueDepths(cfg), 0, "127.0.0.1")
        try:
            assert reloads(server.server_port) == {"applied": 0, "refused": 0}
            # When one reload is refused (the section's name mistyped), then two apply
            reload(db.config(queue={"apl": LIMITED}))
            reload(db.config(queue={"api": LIMITED}))
            reload(db.config(queue={"api": {**LIMITED, "batch_size": 5}}))
            # Then notifyq_reloads_total counts each by result
            assert reloads(server.server_port) == {"applied": 2, "refused": 1}
        finally:
            server.close()


def test_a_reload_that_changes_connect_retry_s_keeps_it_and_says_it_needs_a_restart(db, caplog):
    """Regression: the new value went to the sessions opened after the reload only, in silence."""
    # Given a consumer started with connect_retry_s 30
    cfg = db.config(connect_retry_s=30)
    with supervised(cfg, ConsumeOptions(queues=("plain",), function=lambda job: None)) as (service, reload):
        # When a reload lowers it, beside a live change
        status = reload(db.config(connect_retry_s=5, defaults={"batch_size": 7}))
        # Then the reload applies, keeps connect_retry_s as it runs, and one warning says so
        assert not refused(caplog) and "reload=failed" not in status and service.workers[0].batch_size == 7
        assert service.config.connect_retry_s == 30
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warned == ["reload: connect_retry_s changed; restart the service to apply it"], warned
