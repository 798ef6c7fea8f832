"""ConsumerService: the process around the workers (threads), its health, reload and shutdown.

The service owns the process's presence on its database (presence.py: one watcher session per
queue, the first of which holds the liveness lock of the process's one registration); each
worker adds its own work session. With [shards] every shard is a database of its own: one
Presence per shard (its queues there, its registration and liveness lock there), shared by the
workers that claim on that shard, so a shard holds at most workers + queues + 1 of our sessions.

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

from notifyq import errors, shards
from notifyq.config import Config, validate_queue_name
from notifyq.consume import handlers, periodic
from notifyq.consume.presence import Presence
from notifyq.consume.stats import Budget, Stats
from notifyq.consume.summary import Summary
from notifyq.consume.worker import Worker
from notifyq.store import schema
from notifyq.store.db import Session

log = logging.getLogger("notifyq.service")
PROBE_GRACE_S = 3.0  # at start, how long the other shards may take once one has answered
RESPAWN_S = 5.0  # a shard's failed worker (its server gone past the connect retry) starts again after this

# The main loop's turn when every worker may finish on its own (--exit-when-empty, --max-jobs):
# it notices that they did within this, not half a second later. Not much shorter: each turn
# costs tens of microseconds of the CPU the workers drain with.
FINITE_TICK_S = 0.05


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
    tasks: tuple[str, ...] = ()  # modules whose @notifyq.task functions run the queues' jobs
    concurrency: int | None = None  # a coroutine handler's jobs at once per worker
    # Called with (job, exception) for every failed job (an error reporter); None: the
    # config's consumer.on_failure ("pkg.module:function"), if set.
    on_failure: Callable | None = None
    # A context manager factory every Python handler call runs inside (contrib.django's
    # connection hygiene).
    around_job: Callable | None = None


@dataclasses.dataclass
class Running:
    """A worker, the thread it runs on, and its shard ("" for one server; it runs on
    config.on_shard(shard), whose dsn is the shard's)."""
    worker: Worker
    thread: threading.Thread
    shard: str


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
        self.running: list[Running] = []  # one per worker slot; a restarted worker takes its slot
        # Slots' workers replaced after a shard outage: their counts stay in the totals and metrics.
        self.retired: list[Running] = []
        self.placement = shards.Placement(config)
        # Per shard ("" for one server): the process's presence there, for the queues it holds.
        self.presences: dict[str, Presence] = {}
        for shard in config.shard_names():
            mine = [q for q in options.queues if shard in self.placement.shards_of(q)]
            if mine:
                self.presences[shard] = Presence(self._shard_config(config, shard), mine, self.stop)
        self._respawn_at: dict[int, float] = {}  # index of a shard's failed worker -> when to restart it
        self._down_at_start: set[str] = set()  # shards the start-up probe could not reach
        self.schedulers: dict[str, periodic.Scheduler] = {}  # per shard: cron ticks and retention
        self.summary = Summary(config.log.summary_s)  # the periodic INFO line

    def _handler_for(self, queue: str):
        handler = self._plain_handler_for(queue)
        if isinstance(handler, handlers.PythonHandler):
            handler.concurrency = self.options.concurrency or self.config.queue(queue).concurrency
        hook = self.options.on_failure
        if hook is None and self.config.consumer.on_failure:
            try:
                hook = handlers.load_callable(self.config.consumer.on_failure)
            except errors.HandlerError as e:
                raise errors.HandlerError(f"consumer.on_failure: {e}") from None
        return handlers.Reporting(handler, hook) if hook is not None else handler

    def _plain_handler_for(self, queue: str):
        qc = self.config.queue(queue)
        given = self.options.handler or self.options.command or self.options.function
        modules = self.options.tasks or (() if given else tuple(qc.tasks.replace(",", " ").split()))
        if modules:
            from notifyq.consume import tasks

            if given:
                raise errors.HandlerError("give --tasks or a handler, not both")
            return tasks.TaskHandler(tasks.tasks_in(modules), queue, around=self.options.around_job)
        handler = self.options.handler if self.options.handler is not None else qc.handler
        command = self.options.command if self.options.command is not None else qc.command
        if self.options.handler or self.options.command or self.options.function:  # replaces the config's pair
            handler, command = self.options.handler or "", self.options.command or ""
        per_batch = self.options.per_batch if self.options.per_batch is not None else qc.per_batch
        if self.options.function is not None:
            return handlers.PythonHandler(self.options.function, per_batch, around=self.options.around_job)
        loaded = handlers.load(handler, command, per_batch, qc.command_timeout_s)
        if isinstance(loaded, handlers.PythonHandler):
            loaded.around = self.options.around_job
        return loaded

    @property
    def sharded(self) -> bool:
        return bool(self.config.shards)

    @property
    def workers(self) -> list[Worker]:
        return [r.worker for r in self.running]

    def every_stats(self) -> list[Stats]:
        """The counts of every worker this process ran: the running ones and the replaced ones."""
        return [r.worker.stats for r in (*self.running, *self.retired)]

    @property
    def presence(self) -> Presence:
        """One server's presence (with [shards]: see self.presences)."""
        return self.presences[""]

    @property
    def scheduler(self) -> periodic.Scheduler | None:
        """One server's scheduler (with [shards]: see self.schedulers)."""
        return self.schedulers.get("")

    def _shard_config(self, config: Config, shard: str) -> Config:
        """What a shard's presence, workers and scheduler run with: its dsn, and only the periodic
        entries of the queues whose home it is (a spread queue's ticks are enqueued once, on its home)."""
        if not shard:
            return config
        homed = {q: e for q, e in config.periodic.items() if self.placement.home(q) == shard}
        return dataclasses.replace(config.on_shard(shard), periodic=homed)

    def start(self, stop_requested: threading.Event | None = None) -> None:
        """Check everything that can fail early (schema, handlers), then start the workers.
        A stop requested while the server is unreachable ends the connect retries at once."""
        up = self._probe(stop_requested)
        if up is None:
            return  # stopped before the server answered: nothing started, a clean exit
        names = self.config.shard_names()
        for shard in names:
            mine = tuple(q for q in self.options.queues if shard in self.placement.shards_of(q))
            if mine:  # checks the entries
                self.schedulers[shard] = periodic.Scheduler(self._shard_config(self.config, shard), mine)
        n = 0
        for queue in self.options.queues:
            handler = self._handler_for(queue)
            count = self.options.workers or self.config.queue(queue).workers
            for shard in self.placement.shards_of(queue):
                for _ in range(count):
                    n += 1
                    self._spawn(queue, handler, f"w{n}", shard)
        # The process's one start line (each worker's is DEBUG).
        where = (",".join(f"{s}={self.config.shards[s].masked()}" for s in names) if self.sharded
                 else self.config.dsn.masked())
        log.info("consumer started pid=%d queues=%s workers=%d %s=%s", os.getpid(),
                 ",".join(self.options.queues), n, "shards" if self.sharded else "database", where)

    def _probe(self, stop_requested: threading.Event | None) -> list[str] | None:
        """Every shard's schema checked at once; the shards that answer, or None when stopped.
        A shard down at start is logged and its workers retry; all of them down is an error."""
        outcome: dict[str, BaseException | None] = {}

        def probe(shard: str) -> None:
            session = Session(self.config.on_shard(shard).dsn, name="startup",
                              retry_s=self.config.connect_retry(oneshot=False), stop=stop_requested)
            try:
                session.conn
                schema.require_current(session)
                outcome[shard] = None
            except Exception as e:
                outcome[shard] = e
            finally:
                session.close()

        names = [s for s in self.config.shard_names() if any(s in self.placement.shards_of(q)
                                                             for q in self.options.queues)]
        threads = [threading.Thread(target=probe, args=(s,), name=f"notifyq-probe-{s}", daemon=True)
                   for s in names]
        for thread in threads:
            thread.start()
        # Once one shard answered, the others get PROBE_GRACE_S more: a shard that is down must
        # not hold back the start on the others for the whole connect retry.
        grace_until = None
        while any(t.is_alive() for t in threads):
            for thread in threads:
                thread.join(0.05)
            if grace_until is None and any(outcome.get(s, 1) is None for s in names):
                grace_until = time.monotonic() + PROBE_GRACE_S
            if grace_until is not None and time.monotonic() > grace_until:
                break
        if stop_requested is not None and stop_requested.is_set():
            if any(isinstance(e, errors.TransientDBError) for e in outcome.values()):
                return None
        failed = {s: outcome.get(s) or errors.TransientDBError("no answer yet") for s in names
                  if outcome.get(s, True) is not None}
        for e in failed.values():
            if not isinstance(e, errors.DatabaseError) or len(failed) == len(names):
                raise e
        for shard, e in failed.items():
            log.warning("shard down at start, its workers retry shard=%s error=%s", shard, e)
        self._down_at_start = set(failed)
        for shard in failed:  # its schema is checked when it answers, before its first claim
            self.presences[shard].unchecked_shard = shard
        return [s for s in names if s not in failed]

    def _spawn(self, queue: str, handler, name: str, shard: str = "", index: int | None = None) -> None:
        worker = Worker(self._shard_config(self.config, shard), queue, handler, stop=self.stop,
                        budget=self.budget, batch_size=self.options.batch_size,
                        exit_when_empty=self.options.exit_when_empty, name=name,
                        presence=self.presences[shard])
        running = Running(worker, threading.Thread(target=worker.run, name=f"notifyq-{name}", daemon=True), shard)
        if index is None:
            self.running.append(running)
        else:  # a shard's failed worker replaced in its place
            self.retired.append(self.running[index])
            self.running[index] = running
        running.thread.start()

    def _respawn_shard_workers(self) -> None:
        """A shard's worker that ended because its server is gone (past the connect retry) is
        started again after RESPAWN_S: the other shards' workers go on meanwhile. (One server:
        such an error ends the process, and systemd restarts it, as before.)

        The new worker shares the shard's Presence as the old one did: a Presence outlives its
        sessions' reconnects by design (every seat is left in a `finally`), and the first claim
        after the outage takes the old liveness lock back or re-registers (presence.py)."""
        now = time.monotonic()
        for i, r in enumerate(self.running):
            if r.thread.is_alive() or not isinstance(r.worker.error, errors.DatabaseError):
                continue
            due = self._respawn_at.setdefault(i, now + RESPAWN_S)
            if now >= due:
                del self._respawn_at[i]
                log.warning("shard down, restarting its worker shard=%s queue=%s worker=%s",
                            r.shard, r.worker.queue, r.worker.name)
                self._spawn(r.worker.queue, r.worker.handler, r.worker.name, r.shard, index=i)

    def _failed(self) -> bool:
        """A worker's error ends the process, except a shard's server gone (retried here)."""
        if not self.sharded or self.options.exit_when_empty:
            return any(w.error for w in self.workers)
        return any(w.error is not None and not isinstance(w.error, errors.DatabaseError) for w in self.workers)

    @staticmethod
    def _reconnecting(worker: Worker) -> bool:
        """The worker's work session, or its shard's home session (the liveness lock's), is
        between connections: the state both health views read (no statement)."""
        return not (worker.work.connected and worker.presence.session.connected)

    def shards_down(self) -> list[str]:
        """Shards whose workers are all reconnecting or waiting to restart (one server: [])."""
        if not self.sharded:
            return []
        down: dict[str, bool] = {}
        for r in self.running:
            shard, worker, thread = r.shard, r.worker, r.thread
            lost = not thread.is_alive() and worker.error is not None
            # Reconnecting; or not connected yet, on a shard the start-up probe found down.
            never = (worker.work.generation == 0 and worker.presence.session.generation == 0
                     and shard not in self._down_at_start)
            lost = lost or (thread.is_alive() and not never and self._reconnecting(worker))
            down[shard] = down.get(shard, True) and lost
        return sorted(s for s, d in down.items() if d)

    # -------------------------------------------------------- the main loop

    def run(self, stop_requested: threading.Event, reload_requested: threading.Event | None = None,
            on_reload: Callable[[], Config] | None = None) -> int:
        """Supervise until asked to stop, or every worker finished (--exit-when-empty, --max-jobs)."""
        self.start(stop_requested)
        if self.notifier:
            self.notifier.ready(self.status_line())
        tick = 0.5
        if self.options.exit_when_empty or self.options.max_jobs:
            tick = FINITE_TICK_S  # a run that ends by itself exits when its workers do
        if self.notifier and self.notifier.watchdog_interval_s:
            tick = min(tick, self.notifier.watchdog_interval_s / 2)
        while not self._wait_one_tick(stop_requested, tick):
            if self._failed():
                break
            if self.sharded and not self.options.exit_when_empty:
                self._respawn_shard_workers()
            if all(not r.thread.is_alive() for r in self.running) and not self._respawn_at:
                break
            if reload_requested is not None and reload_requested.is_set():
                reload_requested.clear()
                self._reload(on_reload)
            for scheduler in self.schedulers.values():
                self._tick(scheduler)  # usually no query: only when a tick or retention is due
            self.summary.maybe_log(self.every_stats(),
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

    def _wait_one_tick(self, stop_requested: threading.Event, tick: float) -> bool:
        """True when asked to stop. A run that ends by itself (--exit-when-empty, --max-jobs)
        waits on a worker's thread instead, so it exits the moment its last worker ends, not
        up to a tick later; a stop is still seen within the tick."""
        if self.options.exit_when_empty or self.options.max_jobs:
            alive = [r.thread for r in self.running if r.thread.is_alive()]
            if alive and not stop_requested.is_set():
                alive[0].join(tick)
                return stop_requested.is_set()
        return stop_requested.wait(tick)

    def _tick(self, scheduler: periodic.Scheduler) -> None:
        if not self.sharded:
            scheduler.tick()
            return
        try:  # one shard's server gone must not stop the others' ticks, nor the process
            scheduler.tick()
        except errors.DatabaseError as e:
            log.warning("periodic: shard unreachable error=%s", e)

    def healthy(self) -> bool:
        """Every worker alive and its loop turning (a running handler counts: it has a lease).
        With [shards], a worker whose server is gone (reconnecting, or waiting to restart)
        counts as healthy: one shard down must not make the watchdog kill the process."""
        limit = max(self.config.wakeup.idle_wait_s, self.config.wakeup.poll_max_s) + 15
        now = time.monotonic()
        for r in self.running:
            worker, thread = r.worker, r.thread
            if self.sharded and ((not thread.is_alive() and isinstance(worker.error, errors.DatabaseError))
                                 or (thread.is_alive() and self._reconnecting(worker))):
                continue
            if not thread.is_alive():
                return False
            if worker.in_handler_since is None and now - worker.last_turn > limit:
                return False
        return True

    def totals(self) -> Stats:
        total = Stats()
        for s in self.every_stats():
            for f in ("claimed", "succeeded", "failed", "retried", "dead", "lost_acks",
                      "given_back", "reclaimed", "batches"):
                setattr(total, f, getattr(total, f) + getattr(s, f))
        return total

    def status_line(self) -> str:
        t = self.totals()
        busy = sum(1 for w in self.workers if w.in_handler_since is not None)
        down = self.shards_down()
        return (f"queues={','.join(self.options.queues)} workers={len(self.workers)} busy={busy} "
                f"claimed={t.claimed} done={t.succeeded} failed={t.failed} dead={t.dead}"
                + (f" shards_down={','.join(down)}" if down else ""))

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
            if new.dsn != self.config.dsn or new.shards != self.config.shards:
                log.warning("reload: dsn or [shards] changed; restart the service to use it")
                new = dataclasses.replace(new, dsn=self.config.dsn, shards=self.config.shards)
            idle_s = self.config.consumer.session_idle_s
            if new.consumer.session_idle_s != idle_s:
                # The liveness sessions' server idle timeout is set when they connect; a keeper
                # pinging at a raised value's pace let the server end a busy consumer's session,
                # and a peer took its running job back.
                log.warning("reload: consumer.session_idle_s needs a restart; keeping %g", idle_s)
                new = dataclasses.replace(new, consumer=dataclasses.replace(new.consumer, session_idle_s=idle_s))
            self.config = new
            self.placement = shards.Placement(new)  # the same shards: queue shard = ... needs a restart
            self.summary.every_s = new.log.summary_s
            for shard, presence in self.presences.items():
                presence.reload(self._shard_config(new, shard))
            for r in self.running:
                worker = r.worker
                worker.config = self._shard_config(new, r.shard)
                worker.qc = new.queue(worker.queue)
                worker.batch_size = self.options.batch_size or worker.qc.batch_size
                if not (self.options.handler or self.options.command or self.options.function or self.options.tasks):
                    try:
                        worker.handler = self._handler_for(worker.queue)
                    except errors.NotifyqError as e:
                        log.error("reload: keeping the old handler queue=%s error=%s", worker.queue, e)
            for shard, scheduler in self.schedulers.items():
                scheduler.reload(self._shard_config(new, shard))
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
        for scheduler in self.schedulers.values():
            scheduler.close()  # frees the leader locks: a peer takes over the ticks
        deadline = time.monotonic() + grace
        for r in self.running:
            r.thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [r for r in self.running if r.thread.is_alive()]
        if stuck:
            log.warning("grace period over, %d handler(s) still running: exiting; their jobs "
                        "are failed (retried by policy), the unstarted ones given back", len(stuck))
            self._abandon(stuck)
        for presence in self.presences.values():
            presence.close()  # after the workers: its row goes, then its locks
        t = self.totals()
        log.info("consumer stopped claimed=%d done=%d failed=%d dead=%d given_back=%d lost_acks=%d",
                 t.claimed, t.succeeded, t.failed, t.dead, t.given_back, t.lost_acks)

    def _interrupt_idle_waits(self) -> None:
        """Idle workers wait for the watcher seat, or in GET_LOCK/SLEEP on the watcher session:
        they would notice the stop only at their timeout. Once every worker has ended (a run
        that ended by itself), nothing waits: no session is opened to interrupt it."""
        if not any(r.thread.is_alive() for r in self.running):
            return
        for shard, presence in self.presences.items():
            self._interrupt_on(shard, presence)

    def _interrupt_on(self, shard: str, presence: Presence) -> None:
        session = Session(self.config.on_shard(shard).dsn, autocommit=True, retry_s=2, name="stopper")
        try:
            presence.interrupt_waits(session)
        except errors.NotifyqError as e:
            log.debug("could not interrupt idle waits error=%s", e)
        finally:
            session.close()

    def _abandon(self, stuck: list[Running]) -> None:
        """Nothing stays claimed by a process that exits: see Worker.abandon."""
        for shard in self.config.shard_names():
            mine = [r.worker for r in stuck if r.shard == shard]
            if mine:
                self._abandon_on(shard, mine)

    def _abandon_on(self, shard: str, stuck: list[Worker]) -> None:
        session = Session(self.config.on_shard(shard).dsn, retry_s=5, name="shutdown")
        try:
            for worker in stuck:
                worker.abandon(session)
        except Exception as e:  # what we could not settle, the reaper returns
            log.warning("could not settle the running batches error=%s", e)
        finally:
            session.close()
