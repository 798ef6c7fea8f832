"""Supervisor: the consumer process's main-thread loop, for one server's service
(consume/service.py) and for sharding's (sharding/service.py). It never touches jobs."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from notifyq import errors
from notifyq.config import Config, check_sections_kept
from notifyq.consume.stats import Stats
from notifyq.consume.summary import Summary
from notifyq.consume.worker import Worker

log = logging.getLogger("notifyq.service")

# The main loop's turn when every worker may finish on its own (--exit-when-empty, --max-jobs):
# it notices that they did within this, not half a second later. Not much shorter: each turn
# takes its CPU from the workers' drain.
FINITE_TICK_S = 0.05


class RunOptions(Protocol):
    """What the loop reads of its service's options (service.py's ConsumeOptions): declared
    here, so the services import the loop and the loop imports neither of them."""

    @property
    def queues(self) -> tuple[str, ...]: ...

    @property
    def exit_when_empty(self) -> bool: ...

    @property
    def max_jobs(self) -> int | None: ...


class Supervisor:
    """The main thread's loop, for one server's service and for sharding's: it never touches
    jobs. It pings the systemd watchdog only while healthy() (every worker's loop turning, or
    its handler inside its lease), reports STATUS=, applies SIGHUP, and on stop shuts down."""

    config: Config
    options: RunOptions
    notifier: Any
    summary: Summary
    # What ended the run with a non-zero exit (the first worker's error, or the server given up
    # on), for the command line's one `notifyq: error:` line; None after a clean stop.
    failure: BaseException | None = None
    # The last SIGHUP's config was refused: the old one runs on, and STATUS= says so until a
    # reload applies
    reload_failed: bool = False
    # SIGHUPs whose config applied, and those refused (figures(): notifyq_reloads_total)
    reloads_applied: int = 0
    reloads_refused: int = 0
    # Called with (old, new) once a reload applied: the command line's warnings and log level
    on_reloaded: Callable[[Config, Config], None] | None = None

    def start(self, stop_requested: threading.Event | None = None) -> None:
        raise NotImplementedError

    def every_stats(self) -> list[Stats]:
        raise NotImplementedError

    @property
    def workers(self) -> list[Worker]:
        raise NotImplementedError

    def threads(self) -> list[threading.Thread]:
        """The running workers' threads."""
        raise NotImplementedError

    def failed(self) -> bool:
        """A worker's error that ends the process."""
        raise NotImplementedError

    def finished(self) -> bool:
        """Every worker ended by itself (--exit-when-empty, --max-jobs), none to restart."""
        raise NotImplementedError

    def turn(self) -> None:
        """Once per loop turn: what is due (periodic ticks, restarting a worker)."""
        raise NotImplementedError

    def healthy(self) -> bool:
        raise NotImplementedError

    def status_line(self) -> str:
        raise NotImplementedError

    def reload(self, new: Config) -> None:
        """Apply `new` whole, or raise NotifyqError before any of it applies."""
        raise NotImplementedError

    def gone(self) -> errors.DatabaseError | None:
        """The server given up on while no worker failed (a Python handler runs on, silent)."""
        return None

    def shutdown(self, grace_s: float | None = None) -> None:
        """grace_s: the running handlers' (None: consumer.shutdown_grace_s)."""
        raise NotImplementedError

    def end_handlers(self) -> None:
        """As the process exits: nothing a handler started outside it (a command) runs on."""
        raise NotImplementedError

    def run(self, stop_requested: threading.Event, reload_requested: threading.Event | None = None,
            on_reload: Callable[[], Config] | None = None) -> int:
        """Supervise until asked to stop, or every worker finished (--exit-when-empty, --max-jobs).
        However it ends (a drain, an error here or in the shutdown), the handlers' commands end
        before it returns: a command never outlives its consumer."""
        try:
            return self._supervise(stop_requested, reload_requested, on_reload)
        finally:
            self.end_handlers()

    def _supervise(self, stop_requested: threading.Event, reload_requested: threading.Event | None,
                   on_reload: Callable[[], Config] | None) -> int:
        self.start(stop_requested)
        if self.notifier:
            self.notifier.ready(self.status_line())
        tick = 0.5
        if self.options.exit_when_empty or self.options.max_jobs:
            tick = FINITE_TICK_S  # a run that ends by itself exits when its workers do
        if self.notifier and self.notifier.watchdog_interval_s:
            tick = min(tick, self.notifier.watchdog_interval_s / 2)
        gone = None
        while not self._wait_one_tick(stop_requested, tick):
            if self.failed() or self.finished():
                gone = self.gone()
                break
            if reload_requested is not None and reload_requested.is_set():
                reload_requested.clear()
                self._reload(on_reload)
            self.turn()
            self.summary.maybe_log(self.every_stats(),
                                   sum(1 for w in self.workers if w.in_handler_since is not None),
                                   len(self.workers))
            if self.notifier:
                if self.healthy():
                    self.notifier.watchdog()
                self.notifier.status(self.status_line())
        # The server given up on: its handlers get no grace (no ack of theirs could land), and a
        # Python handler still running is left to end with the process (it cannot be stopped)
        if gone is not None and not any(w.error for w in self.workers):
            log.error("the database server is gone, exiting; a handler still running ends with the "
                      "process, and the reaper takes back what it held error=%s", gone)
        self.shutdown(grace_s=0.0 if gone is not None else None)
        failures = [w.error for w in self.workers if w.error is not None] or ([gone] if gone else [])
        if failures:
            first = self.failure = failures[0]
            return first.exit_code if isinstance(first, errors.NotifyqError) else errors.EXIT_INTERNAL
        return errors.EXIT_OK

    def _wait_one_tick(self, stop_requested: threading.Event, tick: float) -> bool:
        """True when asked to stop. A run that ends by itself (--exit-when-empty, --max-jobs)
        waits on a worker's thread instead, so it exits the moment its last worker ends, not
        up to a tick later; a stop is still seen within the tick."""
        if self.options.exit_when_empty or self.options.max_jobs:
            alive = [t for t in self.threads() if t.is_alive()]
            if alive and not stop_requested.is_set():
                alive[0].join(tick)
                return stop_requested.is_set()
        return stop_requested.wait(tick)

    def totals(self) -> Stats:
        total = Stats()
        for s in self.every_stats():
            for f in ("claimed", "succeeded", "failed", "retried", "dead", "lost_acks",
                      "given_back", "snoozed", "cancelled", "reclaimed", "batches"):
                setattr(total, f, getattr(total, f) + getattr(s, f))
        return total

    def _status(self, extra: str = "") -> str:
        t = self.totals()
        busy = sum(1 for w in self.workers if w.in_handler_since is not None)
        return (f"queues={','.join(self.options.queues)} workers={len(self.workers)} busy={busy} "
                f"claimed={t.claimed} done={t.succeeded} failed={t.failed} dead={t.dead}" + extra
                + (" reload=failed" if self.reload_failed else ""))

    def reload_counts(self) -> dict[str, int]:
        """The SIGHUPs this loop took, by result (ServiceFigures.reloads)."""
        return {"applied": self.reloads_applied, "refused": self.reloads_refused}

    def _reload(self, on_reload: Callable[[], Config] | None) -> None:
        """SIGHUP: a new config is applied as a whole or refused as a whole (nginx's way): one
        that fails to load, drops the section of a queue served, or cannot make a queue's
        handler leaves the old one running, with one error line and reload=failed in STATUS=.
        Of one that applies, what can change live does; the rest say they need a restart."""
        if on_reload is None:
            return
        if self.notifier:
            self.notifier.reloading()
        old = self.config
        try:
            new = on_reload()
            check_sections_kept(old, new, self.options.queues)
            new, restart = self._kept_for_restart(new)
            self.reload(new)  # raises before it changes anything
        except errors.NotifyqError as e:
            self.reload_failed = True
            self.reloads_refused += 1
            log.error("reload failed, keeping the old config error=%s", e)
        else:
            self.reload_failed = False
            self.reloads_applied += 1
            for line in restart:
                log.warning(line)
            self.summary.every_s = new.log.summary_s
            if self.on_reloaded is not None:
                self.on_reloaded(old, new)
            log.info("reloaded config sources=%s", ",".join(new.sources))
        if self.notifier:
            self.notifier.ready(self.status_line())

    def _kept_for_restart(self, new: Config) -> tuple[Config, list[str]]:
        """`new` with what only a restart can change kept as it runs, and the lines that say so."""
        lines = []
        if new.dsn != self.config.dsn or new.shards != self.config.shards:
            lines.append("reload: dsn or [shards] changed; restart the service to use it")
            new = dataclasses.replace(new, dsn=self.config.dsn, shards=self.config.shards)
        if new.connect_retry(oneshot=False) != self.config.connect_retry(oneshot=False):
            # Sessions take it as they open: applied, the process's sessions would give up on an
            # outage at different times (some opened before the reload, some after)
            lines.append("reload: connect_retry_s changed; restart the service to apply it")
        new = dataclasses.replace(new, connect_retry_s=self.config.connect_retry_s)
        use_locks = self.config.wakeup.use_locks
        if new.wakeup.use_locks != use_locks:
            # The liveness and watch locks are taken at the start; the wakes (which read the
            # config a reload gives them) must not stop or start looking for a watcher meanwhile
            lines.append("reload: wakeup.use_locks changed; restart the service to apply it")
            new = dataclasses.replace(new, wakeup=dataclasses.replace(new.wakeup, use_locks=use_locks))
        idle_s = self.config.consumer.session_idle_s
        if new.consumer.session_idle_s != idle_s:
            # The liveness sessions' server idle timeout is set when they connect; a keeper
            # pinging at a raised value's pace let the server end a busy consumer's session,
            # and a peer took its running job back.
            lines.append(f"reload: consumer.session_idle_s needs a restart; keeping {idle_s:g}")
            new = dataclasses.replace(new, consumer=dataclasses.replace(new.consumer, session_idle_s=idle_s))
        return new, lines
