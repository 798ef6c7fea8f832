"""A SIGHUP's reload on a running ConsumerService against a real server, through its main loop
(Supervisor._reload): a config that would take from a queue the process serves what it runs
with (its section, the [defaults] section, its handler) is refused as a whole, the old config
running on; the next good one applies. The metrics count both kinds."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading

import pytest
from conftest import wait_until
from test_wakeup_producers import as_user, other_user  # noqa: F401 (other_user: a fixture)

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


def test_a_reload_that_changes_use_locks_keeps_it_and_says_it_needs_a_restart(db, caplog):
    """Regression: the new value reached what reads the config at each wake (the hand-back's,
    a freed slot's, a released child's), though the process keeps its locks or its polling."""
    # Given a consumer started with advisory locks
    cfg = db.config()
    with supervised(cfg, ConsumeOptions(queues=("plain",), function=lambda job: None)) as (service, reload):
        # When a reload turns them off, beside a live change
        status = reload(db.config(wakeup={"use_locks": False}, defaults={"batch_size": 7}))
        # Then the reload applies, keeps use_locks as it runs, and one warning says so
        assert not refused(caplog) and "reload=failed" not in status and service.workers[0].batch_size == 7
        assert service.config.wakeup.use_locks is True and service.presence.lineup.config.wakeup.use_locks is True
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warned == ["reload: wakeup.use_locks changed; restart the service to apply it"], warned


# ------------------------------------------------------------------ wakeup.instant_wake


def _watch_held_by(cfg, user: str | None = None):
    """A session (the consumers' user, or `user`) holding the watch locks of queues "lim" and
    "other": a peer process's watcher, which every wake of this consumer looks for and interrupts."""
    from notifyq.store import advisory
    from notifyq.store.db import Session
    from notifyq.store.locks import QueueLocks

    watcher = Session((cfg if user is None else as_user(cfg, user)).dsn, autocommit=True, name="watcher")
    for queue in ("lim", "other"):
        assert advisory.get_lock(watcher, QueueLocks(cfg.dsn.database, queue).watch, 0) == 1
    return watcher


def _limited(db, mode="auto"):
    """A config whose queue "lim" has a limit, with instant_wake as `mode` ("auto": not set). Its
    workers queue for the watch lock held elsewhere: a short idle_wait_s has them claim the jobs
    that watcher (a test's session) never hands on soon."""
    wakeup = {"idle_wait_s": 0.2} | ({} if mode == "auto" else {"instant_wake": mode})
    return db.config(queue={"lim": {"limit": 1}}, wakeup=wakeup)


def _free_a_slot_and_release(service, cfg, done: list[int]) -> None:
    """Run a job on "lim" and wait until the slot it freed woke (or tried to); then have the
    worker's release wake wake "other", as the ack of a job whose child waits there does."""
    from notifyq.produce.producer import Producer

    worker = service.workers[0]
    wakes = worker.slot_wake.wakes
    quiet = dataclasses.replace(cfg, wakeup=dataclasses.replace(cfg.wakeup, instant_wake=False))  # wakes nobody
    with Producer("lim", quiet) as p:
        job = p.put({"n": len(done)})
    wait_until(lambda: job in done and worker.slot_wake.wakes > wakes, 20, message="the job's slot freed")
    worker.release_wake.wake(["other"])


def _instant_wakes(service):
    """The worker's instant wakes: its slot wake's ("lim"), its release wake's ("other")."""
    worker = service.workers[0]
    return worker.slot_wake.waker.instant, worker.release_wake.instants.get("other")


def _kills(service) -> list[int]:
    return [instant.kills if instant is not None else 0 for instant in _instant_wakes(service)]


def _await_refusals(instant, refusals: int, off: str | None) -> None:
    """Until the instant wake's refusals and stop are these (its wake runs on the worker's thread)."""
    wait_until(lambda: (instant.refusals, instant.off) == (refusals, off), 20,
               message=f"{refusals} refusals, stop {off}")


@pytest.mark.parametrize("modes", [("auto", False, "auto"), (False, True, False)])
def test_a_reloads_instant_wake_applies_to_the_wakes_of_a_freed_slot_and_a_released_child(db, caplog, modes):
    """Regression: a limited queue's slot wake and a workflow's release wake kept the config the
    worker started with: a reload to instant_wake = false went on interrupting the watcher's
    wait, one from false to "auto" or true never did."""
    # Given a consumer of a limited queue, with instant_wake as the first mode, and a watcher
    # of that queue and of another (the same database user) in another process
    done: list[int] = []
    cfg = _limited(db, modes[0])
    watcher = _watch_held_by(cfg)
    try:
        with supervised(cfg, ConsumeOptions(queues=("lim",), function=lambda job: done.append(job.id))) \
                as (service, reload):
            kills = 0
            for i, mode in enumerate(modes):
                if i:  # When a reload sets the next mode (nothing else changed)
                    status = reload(_limited(db, mode))
                    assert not refused(caplog) and "reload=failed" not in status
                # Then a job's ack interrupts the watcher's waits unless it is false: for the
                # slot it freed and for a child it released
                _free_a_slot_and_release(service, cfg, done)
                kills += mode is not False
                wait_until(lambda: _kills(service) == [kills, kills], 20, message=f"{kills} KILLs each under {mode}")
    finally:
        watcher.close()


def test_a_reloads_instant_wake_true_tries_again_after_a_refusal_and_auto_stops_at_the_next(db, other_user, caplog):
    """Regression: the consumer's instant wakes kept whether they insist (instant_wake = true)
    from the config they were made with: one stopped by a refusal under "auto" stayed stopped
    after a reload to true, and one made under true kept trying after a reload to "auto"."""
    from notifyq.store.db import Session

    # Given a consumer of a limited queue with the default instant_wake ("auto"), and a watcher
    # of that queue and of another logged in as another database user (the consumer may not
    # KILL its statements)
    done: list[int] = []
    cfg = _limited(db)
    watcher = _watch_held_by(cfg, other_user)
    lineup_session = Session(cfg.dsn, autocommit=True, name="lineup-test")
    try:
        with supervised(cfg, ConsumeOptions(queues=("lim",), function=lambda job: done.append(job.id))) \
                as (service, reload):
            lineup = service.presence.lineup

            def wake_all() -> None:
                """A job's ack (its freed slot, a child it released), then a hand-back's wake."""
                _free_a_slot_and_release(service, cfg, done)
                lineup.wake("lim", lineup_session)

            # When every wake of the consumer's interrupts the watcher's wait: each is refused, each stops
            wake_all()
            instants = [*_instant_wakes(service), lineup._wakers["lim"]]
            for instant in instants:
                _await_refusals(instant, 1, "refused")
            # When a reload sets instant_wake = true, and each wakes again
            reload(_limited(db, True))
            wake_all()
            # Then each tries again, and goes on trying after that refusal
            for instant in instants:
                _await_refusals(instant, 2, None)
            # When a reload goes back to "auto", and each wakes again
            reload(_limited(db))
            wake_all()
            # Then that refusal stops each again
            for instant in instants:
                _await_refusals(instant, 3, "refused")
    finally:
        lineup_session.close()
        watcher.close()
