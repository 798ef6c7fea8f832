"""ConsumerService: the process around the workers (threads), its health, reload and shutdown.

The service owns the process's presence on its database (presence.py: one watcher session per
queue, the first of which holds the liveness lock of the process's one registration); each
worker adds its own work session. It knows one server: notifyq.ConsumerService
(notifyq/sharding/service.py) composes one or several of these under one supervision loop,
through the public methods below (start_workers, probe, lost, restart_worker, is_down, ...).

The main thread never touches jobs. It starts the workers, pings the systemd watchdog only
while every worker's loop is turning (or its handler is inside its lease), reports STATUS=,
and on stop runs the drain order: stop claiming -> interrupt idle waits, and give back what
waits behind a running job -> let running handlers finish within the grace period -> give back
what never started, and what still runs as interrupted (no attempt charged: a deploy is not
the job's failure) -> exit.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Callable

from notifyq import errors
from notifyq.config import Config, validate_queue_name
from notifyq.consume import handlers, periodic, reporting
from notifyq.consume.handler import Handler
from notifyq.consume.presence import Presence
from notifyq.consume.stall import STOPPING_STALL_S, StallWatch
from notifyq.consume.stats import Budget, Stats
from notifyq.consume.summary import Summary
from notifyq.consume.supervisor import Supervisor
from notifyq.consume.worker import Worker
from notifyq.figures import COUNTER_NAMES, ServiceFigures, WatcherFigures, WorkerFigures
from notifyq.store import schema
from notifyq.store.db import Session, address
from notifyq.store.reach import Reach

log = logging.getLogger("notifyq.service")

# After the grace, settling what still ran and unregistering get this long at most: a server that
# does not answer must not hold a stop past systemd's TimeoutStopSec (docs/deploys.md).
SETTLE_AT_EXIT_S = 12.0
# The same when no worker holds a batch (only the unregistering is left) and the server is known
# unreachable: a frozen one holds its connect 10 s for a row the reaper removes anyway.
UNREGISTER_UNREACHABLE_S = 2.0
# The shutdown session's retry budget, from the outage's start, once the process has given up on
# its server (ConsumerService.gone): it exits 5 within connect_retry_s, and the reaper takes back
# what it held (else the session waits for the server until SETTLE_AT_EXIT_S has passed).
SETTLE_RETRY_GONE_S = 5.0

@dataclasses.dataclass(frozen=True)
class ConsumeOptions:
    """How a ConsumerService runs its queues: what `notifyq consume`'s flags say. A field left
    None takes the queue's setting from the config (`[queue.NAME]`, then `[defaults]`).

    Give exactly one handler: `function` (a Python callable, the usual one in library use),
    `handler` (`"package.module:function"`), `command` (a program that gets the payload on
    stdin) or `tasks` (modules of `@notifyq.task` functions).

    Attributes:
        queues: the queues to consume, at least one.
        function: the handler, a callable that takes a `notifyq.Job` (or a list, per batch).
        handler: the handler as `"package.module:function"`, imported at start.
        command: a program run per job (or per batch), split as a shell would, run without one.
        per_batch: the handler gets the claimed batch as a list.
        workers: worker threads per queue.
        batch_size: jobs claimed at once by a worker.
        exit_when_empty: stop once no queue has a ready job.
        max_jobs: stop after this many jobs.
        tasks: modules whose `@notifyq.task` functions run the queues' jobs.
        concurrency: jobs of an `async def` handler run at once per worker.
        on_failure: called with (job, exception) for every failed job, e.g. an error reporter.
        around_job: a context manager factory every Python handler call runs inside.
    """

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
    """A worker and the thread it runs on."""
    worker: Worker
    thread: threading.Thread


class ConsumerService(Supervisor):
    """The consumer of one server: its presence there, its workers, its periodic scheduler.

    stop and budget: shared with other services when a composer runs several (sharding);
    alone, its own. name: what its figures and lines call its server ("" alone)."""

    def __init__(self, config: Config, options: ConsumeOptions, notifier=None, *,
                 stop: threading.Event | None = None, budget: Budget | None = None, name: str = ""):
        if not options.queues:
            raise errors.ConfigError("no queue: pass -q QUEUE (or --profile NAME)")
        for q in options.queues:
            validate_queue_name(q)
        if config.shards:
            raise errors.ConfigError("this config has [shards]: use notifyq.ConsumerService, which runs "
                                     "one consumer per shard")
        self.config = config
        self.options = options
        self.notifier = notifier
        self.name = name
        self.stop = stop if stop is not None else threading.Event()
        self.budget = budget if budget is not None else Budget(options.max_jobs)
        self.running: list[Running] = []  # one per worker slot; a restarted worker takes its slot
        self.retired: list[Running] = []  # replaced after an outage: their counts stay in the totals
        self.presence = Presence(config, list(options.queues), self.stop)
        self.scheduler: periodic.Scheduler | None = None  # cron ticks and retention
        self.summary = Summary(config.log.summary_s)  # the periodic INFO line
        self.down_at_start = False  # the start-up probe could not reach the server
        self.stall_watch = StallWatch(config.dsn)  # no stall silent, no reply waited for that is not coming
        # Every handler made for the workers, a reload's too (a batch keeps the one it was
        # claimed with): what end_handlers stops as the process exits
        self.made_handlers: list[Handler] = []
        # Armed by begin_shutdown: at the grace's end it ends the handlers' commands (_stopped:
        # which workers' handlers stopped what they ran).
        self._grace_end: threading.Timer | None = None
        self._stopped: dict[int, bool] = {}
        # Set at the grace's end: a worker with a batch running stops retrying a gone server
        # then, not at the stop (worker.RetryStop: a server restarting during the grace is
        # waited for, as running handlers are)
        self.grace_over = threading.Event()

    def _handler_for(self, queue: str) -> Handler:
        handler = self._made_for(queue)
        self.made_handlers.append(handler)
        return handler

    def _made_for(self, queue: str, config: Config | None = None) -> Handler:
        """The handler of `queue` by `config` (the service's: None)."""
        config = config or self.config
        handler = self._plain_handler_for(queue, config)
        if isinstance(handler, handlers.PythonHandler):
            handler.concurrency = self.options.concurrency or config.queue(queue).concurrency
        hook = self.options.on_failure
        if hook is None and config.consumer.on_failure:
            try:
                hook = handlers.load_callable(config.consumer.on_failure)
            except errors.HandlerError as e:
                raise errors.HandlerError(f"consumer.on_failure: {e}") from None
        return reporting.Reporting(handler, hook) if hook is not None else handler

    def _plain_handler_for(self, queue: str, config: Config) -> Handler:
        qc = config.queue(queue)
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
    def workers(self) -> list[Worker]:
        return [r.worker for r in self.running]

    def threads(self) -> list[threading.Thread]:
        return [r.thread for r in self.running]

    def every_stats(self) -> list[Stats]:
        """The counts of every worker this service ran: the running ones and the replaced ones."""
        return [r.worker.stats for r in (*self.running, *self.retired)]

    # -------------------------------------------------------- start

    def start(self, stop_requested: threading.Event | None = None) -> None:
        """Check everything that can fail early (schema, handlers), then start the workers.
        A stop requested while the server is unreachable ends the connect retries at once."""
        if not self.probe(stop_requested):
            return  # stopped before the server answered: nothing started, a clean exit
        n = self.start_workers()
        log.info("consumer started pid=%d queues=%s workers=%d database=%s", os.getpid(),
                 ",".join(self.options.queues), n - 1, self.config.dsn.masked())

    def probe(self, stop_requested: threading.Event | None) -> bool:
        """The server's schema checked; False when stopped before the server answered."""
        session = Session(self.config.dsn, name="startup",
                          retry_s=self.config.connect_retry(oneshot=False), retry_setting="connect_retry_s",
                          stop=stop_requested)
        try:
            session.conn
            schema.require_current(session)
        except errors.TransientDBError:
            if stop_requested is not None and stop_requested.is_set():
                return False
            raise
        finally:
            session.close()
        return True

    def start_workers(self, first: int = 1, unchecked: str | None = None) -> int:
        """The scheduler and the workers (named w{first}, ...); returns the next worker number.
        unchecked: the start-up probe could not reach the server; its schema is checked at the
        first registration there, before any claim, and a mismatch is told as "{unchecked}: ..."."""
        if unchecked is not None:
            self.down_at_start = True
            self.presence.unchecked = unchecked
        self.scheduler = periodic.Scheduler(self.config, tuple(self.options.queues))  # checks the entries
        n = first
        for queue in self.options.queues:
            handler = self._handler_for(queue)
            for _ in range(self.options.workers or self.config.queue(queue).workers):
                self._spawn(queue, handler, f"w{n}")
                n += 1
        return n

    def _spawn(self, queue: str, handler: Handler, name: str, index: int | None = None) -> None:
        worker = Worker(self.config, queue, handler, stop=self.stop, grace_over=self.grace_over,
                        budget=self.budget, batch_size=self.options.batch_size,
                        exit_when_empty=self.options.exit_when_empty, name=name, presence=self.presence)
        running = Running(worker, threading.Thread(target=_run_worker, args=(worker,), name=f"notifyq-{name}",
                                                   daemon=True))
        if index is None:
            self.running.append(running)
        else:  # a failed worker replaced in its place
            self.retired.append(self.running[index])
            self.running[index] = running
        running.thread.start()

    # -------------------------------------------------------- supervision

    def failed(self) -> bool:
        return any(w.error for w in self.workers) or self.gone() is not None

    def gone(self) -> errors.DatabaseError | None:
        """The server given up on: a session of this process retried it for connect_retry_s and
        gave up (not a shorter budget's give-up: a periodic put's, a stall look's), and nothing
        answered since (Reach.given_up). A worker gives up by itself only
        on a call of its own: one in a Python handler that says nothing to the server finds out
        when the handler returns, however long after (it cannot be interrupted). The process
        exits 5 then all the same, and the handler's thread ends with it."""
        retry_s = self.config.connect_retry(oneshot=False)
        if not Reach.of(self.config.dsn).given_up(retry_s):
            return None
        return errors.DatabaseError(f"cannot reach the database server at {address(self.config.dsn)} "
                                    f"(retried for {retry_s:g} s: connect_retry_s)")

    def finished(self) -> bool:
        return all(not r.thread.is_alive() for r in self.running)

    def turn(self) -> None:
        if self.scheduler is not None:
            self.scheduler.tick()  # usually no query: only when a tick or retention is due
        self.stall_watch.check(self.sessions())  # no query unless a call is overdue
        self.stall_watch.check_loops(((r.worker.name, r.worker.last_turn, self._excused(r.worker))
                                      for r in self.running if r.thread.is_alive()), self.loop_limit_s())

    def loop_limit_s(self) -> float:
        """The longest an idle worker's loop may go without a turn (a wait for the watch lock)."""
        return max(self.config.wakeup.idle_wait_s, self.config.wakeup.poll_max_s) + 15

    def _excused(self, worker: Worker) -> bool:
        """In a handler, in a database call (the stall watch's check says those), or reconnecting."""
        seat = worker.watch_seat
        return (worker.in_handler_since is not None or worker.work.waiting is not None
                or (seat.holds(worker) and seat.session.waiting is not None) or self.reconnecting(worker))

    def sessions(self) -> list[tuple[str, Session]]:
        """The sessions the workers wait on (their work sessions, the watcher sessions), named;
        and a handler's own connection while job.complete_in() runs its statements there."""
        where = f"{self.name}/" if self.name else ""
        named = [(where + s.name, s) for s in (*(r.worker.work for r in self.running),
                                               *(seat.session for seat in self.presence.watch_seats.values()))]
        for r in self.running:
            run = r.worker.current_run
            completion = run.completion if run is not None else None
            if completion is not None:  # (a CallerCall: read as a session's call is)
                named.append((f"{where}{r.worker.name}-caller", completion.caller))  # type: ignore[arg-type]
        return named

    def lost(self, r: Running) -> bool:
        """The worker ended because its server is gone (past the connect retry); not for a
        missing grant, which a restart would not fix."""
        error = r.worker.error
        return (not r.thread.is_alive() and isinstance(error, errors.DatabaseError)
                and not isinstance(error, errors.GrantMissing))

    def restart_worker(self, index: int) -> None:
        """A new worker in slot `index`, on its queue, with its handler and name; the old one's
        counts stay in the totals (every_stats). It shares the Presence as the old one did: a
        Presence outlives its sessions' reconnects by design (every seat is left in a
        `finally`), and the first claim after an outage takes the old liveness lock back or
        re-registers (presence.py)."""
        old = self.running[index].worker
        self._spawn(old.queue, old.handler, old.name, index=index)

    @staticmethod
    def reconnecting(worker: Worker) -> bool:
        """The worker's work session, or the home session (the liveness lock's), is between
        connections: the state both health views read (no statement)."""
        return not (worker.work.connected and worker.presence.session.connected)

    def is_down(self) -> bool:
        """Every worker reconnecting or ended by an error: the server is gone."""
        down = True
        for r in self.running:
            worker, thread = r.worker, r.thread
            lost = not thread.is_alive() and worker.error is not None
            # Reconnecting; or not connected yet, on a server the start-up probe found down.
            never = worker.work.generation == 0 and worker.presence.session.generation == 0 and not self.down_at_start
            lost = lost or (thread.is_alive() and not never and self.reconnecting(worker))
            down = down and lost
        return down and bool(self.running)

    def healthy(self, outage_is_healthy: bool = False) -> bool:
        """Every worker alive and its loop turning (a running handler counts: it has a lease).
        outage_is_healthy: a worker whose server is gone (reconnecting, or ended by it) counts as
        healthy, for a composer that restarts such workers (one server down of several must not
        make the watchdog kill the process)."""
        limit = self.loop_limit_s()
        now = time.monotonic()
        for r in self.running:
            worker, thread = r.worker, r.thread
            if outage_is_healthy and (self.lost(r) or (thread.is_alive() and self.reconnecting(worker))):
                continue
            if not thread.is_alive():
                return False
            if worker.in_handler_since is None and now - worker.last_turn > limit:
                return False
        return True

    def status_line(self) -> str:
        return self._status()

    def figures(self) -> ServiceFigures:
        """This service's figures now, for the metrics endpoint (read from its thread)."""
        workers = [WorkerFigures(queue=r.worker.queue, shard=self.name, running=running,
                                 counters={name: getattr(r.worker.stats, name) for name in COUNTER_NAMES},
                                 handler_seconds=r.worker.stats.handler_seconds.copy(),
                                 batch_sizes=r.worker.stats.batch_sizes.copy(),
                                 by_task=r.worker.stats.by_task.snapshot(),
                                 use_locks=r.worker.use_locks, busy=r.worker.in_handler_since is not None)
                   for group, running in ((self.running, True), (self.retired, False)) for r in list(group)]
        watchers = [WatcherFigures(queue, self.name, dict(w.waiter.wakeups), w.waiter.watching)
                    for queue, w in self.presence.watch_seats.items()]
        periodic_figures = {q: {k: int(v) for k, v in f.items()}
                            for q, f in (self.scheduler.figures() if self.scheduler else {}).items()}
        conflicts = (sum(r.worker.work.conflicts.count for r in self.running)
                     + sum(w.session.conflicts.count for w in self.presence.watch_seats.values()))
        return ServiceFigures(
            queues=tuple(dict.fromkeys(self.options.queues)),
            healthy=bool(self.running) and self.healthy(), workers=workers, watchers=watchers,
            periodic=periodic_figures, reclaimed=sum(s.reclaimed for s in self.every_stats()),
            conflicts=conflicts, shards_of={q: (self.name,) for q in self.options.queues},
            reloads=self.reload_counts())

    def reload(self, new: Config, made: list[Handler | None] | None = None) -> None:
        """Apply `new` whole. The workers' handlers are made first (`made`: made already, by
        reload_handlers), so one that cannot be (its line removed, its module broken) raises
        before anything changed: the reload is refused, the old handler and settings run on."""
        made = self.reload_handlers(new) if made is None else made
        self.config = new
        self.presence.reload(new)
        for r, handler in zip(self.running, made):
            r.worker.reload(new, self.options.batch_size)
            if handler is not None:
                self.made_handlers.append(handler)
                r.worker.handler = handler
        if self.scheduler is not None:
            self.scheduler.reload(new)

    def reload_handlers(self, new: Config) -> list[Handler | None]:
        """Each running worker's handler by `new` (None: the one given in code or on the command
        line stays); HandlerError naming the queue when one cannot be made."""
        if self.options.handler or self.options.command or self.options.function or self.options.tasks:
            return [None] * len(self.running)
        made: list[Handler | None] = []
        for r in self.running:
            try:
                made.append(self._made_for(r.worker.queue, new))
            except errors.NotifyqError as e:
                raise errors.HandlerError(f"queue {r.worker.queue}: {e}") from None
        return made

    # -------------------------------------------------------- shutdown
    # The drain order: stop claiming -> interrupt idle waits, and give back at once what waits
    # behind a running job -> let running handlers finish within the grace period -> give back
    # what never started, and what still runs as interrupted (uncharged, its attempt recorded
    # 'interrupted') -> exit. A composer runs each step on every service in turn.

    def shutdown(self, grace_s: float | None = None) -> None:
        grace = self.config.consumer.shutdown_grace_s if grace_s is None else grace_s
        deadline = time.monotonic() + grace  # from the stop: begin_shutdown may wait for the server
        if self.notifier:
            self.notifier.stopping(f"stopping: waiting up to {grace:g}s for running handlers")
        self.begin_shutdown(deadline)
        self.finish_shutdown(deadline)
        self.log_stopped()

    def log_stopped(self) -> None:
        t = self.totals()
        log.info("consumer stopped claimed=%d done=%d failed=%d dead=%d given_back=%d lost_acks=%d cancelled=%d",
                 t.claimed, t.succeeded, t.failed, t.dead, t.given_back, t.lost_acks, t.cancelled)

    def begin_shutdown(self, deadline: float | None = None) -> None:
        """Stop claiming, wake the idle waits, hand the periodic ticks to a peer. At `deadline`
        (the grace's end), what the handlers still run outside the process (commands) is ended."""
        self.stop.set()
        # On a thread of its own, armed first: waking the idle waits, and the grace's loop
        # (finish_shutdown), may wait a few seconds each for a server that does not answer (a
        # connect, a stall look), and ending a command needs no server (only recording its
        # jobs' outcome does).
        if deadline is not None:
            self._grace_end = threading.Timer(max(0.0, deadline - time.monotonic()), self._end_grace)
            self._grace_end.daemon = True
            self._grace_end.start()
        # On a thread of its own too: against a frozen server its connect waits a few seconds,
        # and the main thread, which runs the signal handlers, must be free for a second SIGTERM
        # to exit at once (it waited for that connect: 2.5-2.9 s)
        threading.Thread(target=self._interrupt_idle_waits, name="notifyq-stopper", daemon=True).start()
        if self.scheduler is not None:
            self.scheduler.close()  # frees the leader locks: a peer takes over the ticks

    def finish_shutdown(self, deadline: float) -> None:
        """Running handlers get until `deadline`; then what still runs is settled, and the
        presence goes (its row, then its locks)."""
        for r in self.running:
            # In slices: a worker stuck in a read whose reply is not coming is ended meanwhile
            # (StallWatch), rather than holding the exit until its read timeout.
            while r.thread.is_alive() and time.monotonic() < deadline:
                r.thread.join(min(STOPPING_STALL_S / 2, max(0.0, deadline - time.monotonic())))
                self.stall_watch.check(self.sessions(), STOPPING_STALL_S)
        self.grace_over.set()
        stuck = [r.worker for r in self.running if r.thread.is_alive()]
        in_handler = sum(w.in_handler_since is not None for w in stuck)
        if in_handler:
            log.warning("grace period over, %d handler(s) still running: exiting; their jobs "
                        "are given back interrupted (no attempt charged), the unstarted ones given back",
                        in_handler)
        if len(stuck) > in_handler:  # (their handlers returned: an ack or a give-back waits on the server)
            log.warning("grace period over, %d worker(s) still settling a batch with the server: what "
                        "they could not send is sent on the stop's session", len(stuck) - in_handler)
        if self._grace_end is not None:  # not needed (every worker ended in time), or it ran or runs now
            self._grace_end.cancel()
            self._grace_end.join()
        stopped = self._stopped
        if stuck and not stopped:  # (no timer armed, or the loop saw the deadline before it fired)
            stopped = self._stop_handlers()
        # And the workers whose run ended without settling its batch: their ack or give-back met
        # the server away (as the grace ended, which ended their retries). Not once the process
        # has given up on its server: it exits 5 within connect_retry_s (the reaper's to take back).
        left = [] if self.gone() is not None else [
            r.worker for r in self.running if r.worker not in stuck and r.worker.holds_unsettled()]
        # Settling and unregistering need the server: bounded, so a server that does not answer
        # (frozen, a black-holed path) holds the exit SETTLE_AT_EXIT_S at most, not each read's
        # and connect's timeouts in turn (over a minute). Left unfinished, the daemon thread dies
        # with the process, whose connections close: the reaper takes back what it held.
        settling = threading.Thread(target=self._settle, args=(stuck + left, stopped), name="notifyq-settle",
                                    daemon=True)
        settling.start()
        # Nothing to give back (idle workers, reconnecting or in a wait the stall watch ends) and
        # the server known unreachable: only the unregistering is left, which the reaper does too.
        holding = any(w.holds_unsettled() for w in stuck + left)
        bound_s = (UNREGISTER_UNREACHABLE_S if not holding and self.presence.session.reach.down()
                   else SETTLE_AT_EXIT_S)
        settling.join(bound_s)
        if settling.is_alive() and holding:
            log.warning("the server did not answer within %g s: exiting without settling the running "
                        "batches or unregistering; the reaper takes back what this consumer held", bound_s)
        elif settling.is_alive():
            log.warning("the server did not answer within %g s: exiting without unregistering; this "
                        "consumer held no job, and the reaper removes its registration", bound_s)

    def _settle(self, holders: list[Worker], stopped: dict[int, bool]) -> None:
        if holders:
            self._abandon(holders, stopped)
        # A holder still in a call to the server (not in a handler: a claim or an ack the server
        # held past the grace) ends by itself once the server answers: a stopping worker starts
        # nothing, and gives back what a claim sent before the stop brought it. Waited for here
        # (within the exit's bound: finish_shutdown's join of this thread), so that nothing is
        # claimed in our name after we unregister, and the summary counts what it gave back.
        until = time.monotonic() + SETTLE_AT_EXIT_S
        for r in self.running:
            if r.worker in holders and r.thread.is_alive() and r.worker.in_handler_since is None:
                r.thread.join(max(0.0, until - time.monotonic()))
        self.presence.close()  # after the workers

    def end_handlers(self) -> None:
        """The process exits, however it does (Supervisor.run): what a handler of ours still runs
        outside the process is ended first (a command's process group: SIGTERM, then SIGKILL,
        CommandHandler.stop_running). After a drain nothing is left; after an error of the
        loop, or a drain that could not settle a stuck batch, a command would outlive us."""
        for handler in self.made_handlers:
            handler.stop_running()

    def _interrupt_idle_waits(self) -> None:
        """Idle workers wait for the watcher seat, or in GET_LOCK/SLEEP on the watcher session:
        they would notice the stop only at their timeout. Once every worker has ended (a run
        that ended by itself), nothing waits: no session is opened to interrupt it. Then what
        waits behind running jobs is given back (_give_back_waiting), unless the server was
        found unreachable: the batches give it back as they end, or the exit does."""
        if not any(r.thread.is_alive() for r in self.running):
            return
        session = Session(self.config.dsn, autocommit=True, retry_s=2, name="stopper")
        try:
            # What it holds is interrupted from now on, should it die before settling it
            self.presence.mark_stopping(session)
        except errors.NotifyqError as e:
            log.warning("could not mark the consumer stopping error=%s", e)
            if not session.connected and session.reach.down():
                # Its connect found no server: another would wait as long again (a frozen server's
                # 3 s) for waits that end anyway (their timeouts, the stall watch)
                session.close()
                return
        try:
            self.presence.interrupt_waits(session)
        except errors.NotifyqError as e:
            log.debug("could not interrupt idle waits error=%s", e)
        finally:
            session.close()
        self._give_back_waiting()

    def _give_back_waiting(self) -> None:
        """At the stop, after the idle waits: what waits in a batch behind a running job goes
        back to the queue now, for another consumer to run during the grace
        (Worker.give_back_waiting). On a session of its own: a transaction, which the stopper's
        autocommit one is not; it connects only when a batch has something to give back."""
        session = Session(self.config.dsn, retry_s=2, name="stop-give-back",
                          idle_in_transaction_s=math.ceil(self.config.consumer.session_idle_s))
        try:
            for r in self.running:
                r.worker.give_back_waiting(session)
        finally:
            session.close()

    def _end_grace(self) -> None:
        """The grace's timer: the workers' retries end, and their commands (_stop_handlers)."""
        self.grace_over.set()
        self._stopped.update(self._stop_handlers())

    def _stop_handlers(self) -> dict[int, bool]:
        """The grace's end: what the still-running handlers run outside the process (commands)
        is ended (Worker.stop_handler). {id(worker): whether its handler stopped what it ran}."""
        return {id(r.worker): r.worker.stop_handler() for r in self.running if r.thread.is_alive()}

    def _abandon(self, holders: list[Worker], stopped: dict[int, bool]) -> None:
        """Nothing stays claimed by a process that exits: see Worker.abandon."""
        session = Session(self.config.dsn, retry_s=self._settle_retry_s(), name="shutdown")
        try:
            for worker in holders:
                worker.abandon(session, stopped.get(id(worker), False))
        except Exception as e:  # what we could not settle, the reaper returns
            log.warning("could not settle the running batches error=%s", e)
        finally:
            session.close()

    def _settle_retry_s(self) -> float:
        """The shutdown session's retry budget, which its connects count from the outage's start
        (Reach): a server that went away during the grace (one restarting as it ended) is waited
        for until SETTLE_AT_EXIT_S from now, the exit's bound (its join keeps it)."""
        if self.gone() is not None:
            return SETTLE_RETRY_GONE_S
        now = time.monotonic()
        return SETTLE_AT_EXIT_S + (now - Reach.of(self.config.dsn).since(now))


def _run_worker(worker: Worker) -> None:
    """A worker's thread. Whatever ends it by raising is the worker's error: its thread gone, the
    consumer stops and exits non-zero (1, internal error), never 0 as if it had finished its work
    (under systemd, Restart=on-failure then starts it again)."""
    try:
        worker.run()
    except BaseException as e:
        if worker.error is None:
            worker.error = e
        log.critical("worker thread ended on an error queue=%s worker=%s error=%s: %s", worker.queue,
                     worker.name, type(e).__name__, e, exc_info=True)
