"""ConsumerService: the process around the workers (threads), its health, reload and shutdown.

The main thread never touches jobs. It starts the workers, pings the systemd watchdog only
while every worker's loop is turning (or its handler is inside its lease), reports STATUS=,
and on stop runs the drain order: stop claiming -> interrupt idle waits -> let running
handlers finish within the grace period -> give back what never started, fail (charged,
retried by policy) what still runs -> exit.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable

from notifyq import errors
from notifyq.config import Config, validate_queue_name
from notifyq.consume import handlers, periodic
from notifyq.consume.stats import Budget, Stats
from notifyq.consume.summary import Summary
from notifyq.consume.worker import Worker
from notifyq.store import queries, schema
from notifyq.store.db import Session

log = logging.getLogger("notifyq.service")


@dataclasses.dataclass(frozen=True)
class ConsumeOptions:
    """What the command line says; None means: take it from the queue's config."""

    queues: tuple[str, ...]
    function: Callable | None = None  # library use: a Python callable instead of a handler spec
    handler: str | None = None
    command: str | None = None
    per_batch: bool | None = None
    workers: int | None = None
    batch_size: int | None = None
    exit_when_empty: bool = False
    max_jobs: int | None = None


class ConsumerService:
    def __init__(self, config: Config, options: ConsumeOptions, notifier=None):
        if not options.queues:
            raise errors.ConfigError("no queue: pass -q QUEUE (or --profile NAME)")
        for q in options.queues:
            validate_queue_name(q)
        self.config = config
        self.options = options
        self.notifier = notifier
        self.stop = threading.Event()
        self.budget = Budget(options.max_jobs)
        self.workers: list[Worker] = []
        self.threads: list[threading.Thread] = []
        self.retired: list[Stats] = []
        self.scheduler: periodic.Scheduler | None = None  # cron ticks and retention (periodic.py)
        self.summary = Summary(config.log.summary_s)  # the periodic INFO line

    def _handler_for(self, queue: str):
        qc = self.config.queue(queue)
        handler = self.options.handler if self.options.handler is not None else qc.handler
        command = self.options.command if self.options.command is not None else qc.command
        if self.options.handler or self.options.command or self.options.function:  # replaces the config's pair
            handler, command = self.options.handler or "", self.options.command or ""
        per_batch = self.options.per_batch if self.options.per_batch is not None else qc.per_batch
        if self.options.function is not None:
            return handlers.PythonHandler(self.options.function, per_batch)
        return handlers.load(handler, command, per_batch, qc.command_timeout_s)

    def start(self, stop_requested: threading.Event | None = None) -> None:
        """Check everything that can fail early (schema, handlers), then start the workers.
        A stop requested while the server is unreachable ends the connect retries at once."""
        probe = Session(self.config.dsn, name="startup", retry_s=self.config.connect_retry(oneshot=False),
                        stop=stop_requested)
        try:
            probe.conn
            schema.require_current(probe)
        except errors.TransientDBError:
            if stop_requested is not None and stop_requested.is_set():
                return  # stopped before the server answered: nothing started, a clean exit
            raise
        finally:
            probe.close()
        self.scheduler = periodic.Scheduler(self.config, self.options.queues)  # checks the entries
        n = 0
        for queue in self.options.queues:
            handler = self._handler_for(queue)
            count = self.options.workers or self.config.queue(queue).workers
            for _ in range(count):
                n += 1
                self._spawn(queue, handler, f"w{n}")
        # The process's one start line (each worker's is DEBUG).
        log.info("consumer started pid=%d queues=%s workers=%d database=%s",
                 os.getpid(), ",".join(self.options.queues), n, self.config.dsn.masked())

    def _spawn(self, queue: str, handler, name: str) -> None:
        worker = Worker(self.config, queue, handler, stop=self.stop, budget=self.budget,
                        batch_size=self.options.batch_size, exit_when_empty=self.options.exit_when_empty,
                        name=name)
        thread = threading.Thread(target=worker.run, name=f"notifyq-{name}", daemon=True)
        self.workers.append(worker)
        self.threads.append(thread)
        thread.start()

    # -------------------------------------------------------- the main loop

    def run(self, stop_requested: threading.Event, reload_requested: threading.Event | None = None,
            on_reload: Callable[[], Config] | None = None) -> int:
        """Supervise until asked to stop, or every worker finished (--exit-when-empty, --max-jobs)."""
        self.start(stop_requested)
        if self.notifier:
            self.notifier.ready(self.status_line())
        tick = 0.5
        if self.notifier and self.notifier.watchdog_interval_s:
            tick = min(tick, self.notifier.watchdog_interval_s / 2)
        while not stop_requested.wait(tick):
            if all(not t.is_alive() for t in self.threads) or any(w.error for w in self.workers):
                break
            if reload_requested is not None and reload_requested.is_set():
                reload_requested.clear()
                self._reload(on_reload)
            if self.scheduler is not None:
                self.scheduler.tick()  # usually no query: only when a tick or retention is due
            self.summary.maybe_log([w.stats for w in self.workers] + self.retired,
                                   sum(1 for w in self.workers if w.in_handler_since is not None),
                                   len(self.workers))
            if self.notifier:
                if self.healthy():
                    self.notifier.watchdog()
                self.notifier.status(self.status_line())
        self.shutdown()
        failures = [w.error for w in self.workers if w.error is not None]
        if failures:
            first = failures[0]
            return first.exit_code if isinstance(first, errors.NotifyqError) else errors.EXIT_INTERNAL
        return errors.EXIT_OK

    def healthy(self) -> bool:
        """Every worker alive and its loop turning (a running handler counts: it has a lease)."""
        limit = max(self.config.wakeup.idle_wait_s, self.config.wakeup.poll_max_s) + 15
        now = time.monotonic()
        for worker, thread in zip(self.workers, self.threads):
            if not thread.is_alive():
                return False
            if worker.in_handler_since is None and now - worker.last_turn > limit:
                return False
        return True

    def totals(self) -> Stats:
        total = Stats()
        for s in [w.stats for w in self.workers] + self.retired:
            for f in ("claimed", "succeeded", "failed", "retried", "dead", "lost_acks",
                      "given_back", "reclaimed", "batches"):
                setattr(total, f, getattr(total, f) + getattr(s, f))
        return total

    def status_line(self) -> str:
        t = self.totals()
        busy = sum(1 for w in self.workers if w.in_handler_since is not None)
        return (f"queues={','.join(self.options.queues)} workers={len(self.workers)} busy={busy} "
                f"claimed={t.claimed} done={t.succeeded} failed={t.failed} dead={t.dead}")

    def _reload(self, on_reload: Callable[[], Config] | None) -> None:
        """SIGHUP: settings that can change live do; the rest say they need a restart."""
        if on_reload is None:
            return
        if self.notifier:
            self.notifier.reloading()
        try:
            new = on_reload()
        except errors.NotifyqError as e:
            log.error("reload failed, keeping the old config error=%s", e)
        else:
            if new.dsn != self.config.dsn:
                log.warning("reload: dsn changed; restart the service to use it")
                new = dataclasses.replace(new, dsn=self.config.dsn)
            self.config = new
            self.summary.every_s = new.log.summary_s
            for worker in self.workers:
                worker.config = new
                worker.qc = new.queue(worker.queue)
                worker.batch_size = self.options.batch_size or worker.qc.batch_size
                worker.waiter.cfg = new.wakeup
                if not (self.options.handler or self.options.command or self.options.function):
                    try:
                        worker.handler = self._handler_for(worker.queue)
                    except errors.NotifyqError as e:
                        log.error("reload: keeping the old handler queue=%s error=%s", worker.queue, e)
            if self.scheduler is not None:
                self.scheduler.reload(new)
            log.info("reloaded config sources=%s", ",".join(new.sources))
        if self.notifier:
            self.notifier.ready(self.status_line())

    # -------------------------------------------------------- shutdown

    def shutdown(self) -> None:
        grace = self.config.consumer.shutdown_grace_s
        if self.notifier:
            self.notifier.stopping(f"stopping: waiting up to {grace:g}s for running handlers")
        self.stop.set()
        self._interrupt_idle_waits()
        if self.scheduler is not None:
            self.scheduler.close()  # frees the leader locks: a peer takes over the ticks
        deadline = time.monotonic() + grace
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [w for w, t in zip(self.workers, self.threads) if t.is_alive()]
        if stuck:
            log.warning("grace period over, %d handler(s) still running: exiting; their jobs "
                        "are failed (retried by policy), the unstarted ones given back", len(stuck))
            self._abandon(stuck)
        t = self.totals()
        log.info("consumer stopped claimed=%d done=%d failed=%d dead=%d given_back=%d lost_acks=%d",
                 t.claimed, t.succeeded, t.failed, t.dead, t.given_back, t.lost_acks)

    def _interrupt_idle_waits(self) -> None:
        """Workers idle in GET_LOCK/SLEEP would notice the stop only at their timeout."""
        waiting = [w for w in self.workers if w.in_handler_since is None and w.lock.connection_id]
        if not waiting:
            return
        session = Session(self.config.dsn, autocommit=True, retry_s=2, name="stopper")
        try:
            for worker in waiting:
                try:
                    queries.kill_query(session, worker.lock.connection_id)
                except Exception as e:  # best effort: the wait ends by its own timeout anyway
                    log.debug("could not interrupt worker=%s error=%s", worker.name, e)
        except errors.NotifyqError as e:
            log.debug("could not interrupt idle waits error=%s", e)
        finally:
            session.close()

    def _abandon(self, stuck: list[Worker]) -> None:
        """Nothing stays claimed by a process that exits: see Worker.abandon."""
        session = Session(self.config.dsn, retry_s=5, name="shutdown")
        try:
            for worker in stuck:
                worker.abandon(session)
        except Exception as e:  # what we could not settle, the reaper returns
            log.warning("could not settle the running batches error=%s", e)
        finally:
            session.close()
