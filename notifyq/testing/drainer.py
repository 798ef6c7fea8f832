"""drain(): a queue's jobs run in the test's own process, on the test's real database, until
none is ready, with the consumer's own code: a Worker (consume/worker.py) claims with SKIP
LOCKED, runs the handler, records failures by the queue's retry policy and acks, as a `notifyq
consume --exit-when-empty` does, only here on the caller's thread and one claim at a time.
There is no second consumer and no fake: what a test sees is what production does.

Not in the worker: the end condition over several queues (a job may put a job on another queue,
so passes go on until one runs nothing), a deadline, `run_delayed`, and what the test gets back
(a summary, and the first handler exception re-raised with its job's id).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from notifyq import errors
from notifyq.config import values
from notifyq.config import Config, validate_queue_name
from notifyq.consume import handlers, reporting
from notifyq.consume import tasks as consume_tasks
from notifyq.consume.presence import Presence
from notifyq.consume.stats import Budget, Stats
from notifyq.consume.worker import Worker
from notifyq.jobs import Job, Status
from notifyq.store import testing as store
from notifyq.store.db import Session
from notifyq.testing.target import config_of, session_for
from notifyq.tasks import TaskRegistry, default_registry


class DrainTimeout(errors.NotifyqError):
    """drain() ran past its timeout_s with jobs still to run; `.result` is what it did."""

    def __init__(self, message: str, result: "Drained"):
        super().__init__(message)
        self.result = result


@dataclasses.dataclass
class Failure:
    """One failed attempt: the job as its handler saw it, what it raised (errors.JobFailed for
    job.fail() or a timeout), and what became of the job: "retry", "dead" or "cancelled"."""

    job: Job
    exception: BaseException
    outcome: str = "retry"


@dataclasses.dataclass
class Drained:
    """What a drain did, as the consumer counts it. Counts are attempts: a job failed twice, then
    done, counts in `failed` twice and in `done` once. A job whose cancel was requested while it
    ran and that stopped counts in `cancelled` only: failed, its Failure's outcome is "cancelled";
    returned after its handler saw the cancel, it is no failure."""

    done: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    cancelled: int = 0
    snoozed: int = 0
    failures: list[Failure] = dataclasses.field(default_factory=list)
    stopped_by: str = ""  # "", or why it stopped with jobs maybe left: "max_jobs", "failure"

    @property
    def ran(self) -> int:
        """Attempts run (done, failed, cancelled or snoozed)."""
        return self.done + self.failed + self.cancelled + self.snoozed


class _Budget(Budget):
    """The worker's --max-jobs budget, also spent by the deadline and by a first failure when
    they are to stop the drain: the worker checks it before every claim, so it stops between
    jobs, after the last one's outcome was recorded (a job is never left half settled)."""

    def __init__(self, limit: int | None, deadline: float):
        super().__init__(limit)
        self.deadline = deadline
        self.halted = ""

    def halt(self, why: str) -> None:
        self.halted = self.halted or why

    def _over(self) -> bool:
        if not self.halted and time.monotonic() >= self.deadline:
            self.halted = "timeout"
        return bool(self.halted)

    def take(self, n: int) -> int:
        if n > 0 and self._over():
            return 0
        return super().take(n)

    @property
    def exhausted(self) -> bool:
        return self._over() or super().exhausted


HandlerArg = Callable[..., Any] | TaskRegistry | consume_tasks.Task | Iterable[consume_tasks.Task] | None


def drain(config: Config | str | None, queues: str | Iterable[str], handler: HandlerArg = None, *,
          max_jobs: int | None = None, timeout_s: float = 60.0, raise_on_failure: bool = True,
          run_delayed: bool = False, batch_size: int = 1) -> Drained:
    """Run the due jobs of `queues` here, one claim after another, until none is ready.

    config: a Config, a DSN URL ("mysql://user@host/db"), or None: the database the app's tasks
    enqueue on (Django's under notifyq.contrib.django, else `notifyq.load_config()`'s).
    handler: a function taking the job (as `--handler`); a TaskRegistry, a task or a list of
    tasks (`--tasks`: each job runs the task it names); None: the queue's own from the config
    (`handler`, `command` or `tasks`), else the `@notifyq.task` functions on the queue.
    Jobs the handlers put are run too, on any of `queues`; jobs put with a delay, and the
    retries of failed jobs, wait for their time unless `run_delayed` makes them due at once
    (then a job that keeps failing runs until it is dead: `max_attempts` runs).
    raise_on_failure: the first job that fails stops the drain once its failure is recorded
    (retried by the queue's policy, or dead), and what its handler raised is raised here, with
    a note naming the job; False: every failure is in the result's `failures`.
    max_jobs: stop after this many claims (jobs may be left). timeout_s: raise DrainTimeout if
    the queues are not empty by then (checked between jobs: a handler's own time is bounded by
    the queue's `timeout_s`, as in a consumer).
    """
    config = config_of(config)
    names = _queues(queues)
    if max_jobs is not None:
        max_jobs = values.number("max_jobs", max_jobs, lo=1, integer=True)
    timeout_s = values.seconds("timeout_s", timeout_s)
    batch_size = values.number("batch_size", batch_size, lo=1, hi=1000, integer=True)
    result = Drained()
    budget = _Budget(max_jobs, time.monotonic() + timeout_s)

    def failed(job: Job, exc: BaseException) -> None:
        result.failures.append(Failure(job, exc))
        if raise_on_failure:
            budget.halt("failure")

    run_by = {q: reporting.Reporting(_handler_for(config, q, handler), failed) for q in names}
    stop = threading.Event()  # never set: a drain ends by its budget or an empty queue
    presence = Presence(config, names, stop)
    session = session_for(config, "testing-drain")
    stats: list[Stats] = []
    try:
        while True:  # passes: until one runs nothing (a job may put one on a queue drained before)
            claimed = 0
            for queue in names:
                if budget.exhausted:
                    break
                if run_delayed:
                    store.run_delayed(session, queue)
                worker = Worker(config, queue, run_by[queue], stop=stop, budget=budget, batch_size=batch_size,
                                exit_when_empty=True, name=f"drain-{queue}", presence=presence)
                worker.run()  # on this thread: the handler runs where the test does
                stats.append(worker.stats)
                if worker.error is not None:
                    raise worker.error
                claimed += worker.stats.claimed
            if not claimed or budget.exhausted:
                break
        _settle(session, result, stats)
    finally:
        presence.close()
        session.close()
    if budget.halted == "failure":
        result.stopped_by = "failure"
    elif not budget.halted and budget.left is not None and budget.left <= 0:
        result.stopped_by = "max_jobs"
    if budget.halted == "failure" and result.failures:
        raise _noted(result.failures[0])
    if budget.halted == "timeout":
        raise DrainTimeout(f"drain: {', '.join(names)} not drained within timeout_s={timeout_s:g} "
                           f"(done={result.done} failed={result.failed})", result)
    return result


def _queues(queues: str | Iterable[str]) -> list[str]:
    if isinstance(queues, str):
        queues = [queues]
    try:
        names = list(dict.fromkeys(queues))
    except TypeError:
        raise errors.InputError(f"drain: queues must be a queue name or a list of them, "
                                f"got {values.shown(queues)}") from None
    if not names:
        raise errors.InputError("drain: no queue given")
    return [validate_queue_name(q) for q in names]


def _handler_for(config: Config, queue: str, handler: HandlerArg) -> Any:
    """The consumer's own handler objects, as `--handler`/`--tasks`/the config would make them."""
    if isinstance(handler, TaskRegistry):
        return _task_handler(handler.tasks, queue, "the registry has")
    if isinstance(handler, consume_tasks.Task):
        return _task_handler({handler.name: handler}, queue, "the task is")
    if handler is None:
        qc = config.queue(queue)
        modules = tuple(qc.tasks.replace(",", " ").split())
        if modules:
            return consume_tasks.TaskHandler(consume_tasks.tasks_in(modules), queue)
        if qc.handler or qc.command:
            return handlers.load(qc.handler, qc.command, qc.per_batch, qc.command_timeout_s)
        if any(t.queue == queue for t in default_registry.tasks.values()):
            return consume_tasks.TaskHandler(default_registry.tasks, queue)
        raise errors.InputError(f"drain: no handler for queue {queue}: pass handler= (a function, a task "
                                f"or a TaskRegistry), or give the queue a handler, command or tasks in the "
                                f"config, or define an @notifyq.task on it")
    if callable(handler):
        return handlers.PythonHandler(handler, config.queue(queue).per_batch)
    if isinstance(handler, (list, tuple, set, frozenset)) and handler and all(
            isinstance(t, consume_tasks.Task) for t in handler):
        return _task_handler({t.name: t for t in handler}, queue, "the tasks are")
    raise errors.InputError(f"drain: handler must be a function, a task, a list of tasks or a TaskRegistry, "
                            f"got {values.shown(handler)}")


def _task_handler(tasks: dict[str, consume_tasks.Task], queue: str, whose: str) -> Any:
    if not any(t.queue == queue for t in tasks.values()):
        theirs = ", ".join(sorted({t.queue for t in tasks.values()})) or "none"
        raise errors.InputError(f"drain: no task for queue {queue}: {whose} on queue(s) {theirs}")
    return consume_tasks.TaskHandler(tasks, queue)


def _settle(session: Session, result: Drained, stats: list[Stats]) -> None:
    """The counts are the workers' own; each failure's outcome is read from its job's row (the
    server decided: a retry, a burial, or a cancel requested while it ran)."""
    for s in stats:
        result.done += s.succeeded
        result.failed += s.failed
        result.retried += s.retried
        result.dead += s.dead
        result.cancelled += s.cancelled
        result.snoozed += s.snoozed
    rows = store.statuses(session, sorted({f.job.id for f in result.failures}))
    for f in result.failures:
        status, attempts = rows.get(f.job.id, (None, None))
        if attempts != f.job.attempts:
            continue  # it ran again since (or is gone, done): this attempt was retried
        if status == Status.DEAD:
            f.outcome = "dead"
        elif status == Status.CANCELLED:
            f.outcome = "cancelled"


def _noted(failure: Failure) -> BaseException:
    """What the handler raised, as it was, with a note saying which job (PEP 678)."""
    exc, job = failure.exception, failure.job
    exc.add_note(f"notifyq.testing.drain: raised by job {job.id} of queue {job.queue} "
                 f"(attempt {job.attempts}/{job.max_attempts}; the job now: {failure.outcome})")
    return exc
