"""Tasks: `@notifyq.task(queue="emails")` on a function gives `send_email.enqueue(...)`, and
`notifyq consume --tasks myapp.tasks` runs each job of the queue by the task it names.

A task's job payload is {"task": NAME, "args": [...], "kwargs": {...}}; NAME is the function's
`module.qualname` unless given. A consumer runs only the tasks of the modules it was given, found
there as Task objects (no import-time side effect decides what runs), and fails a job that names
another with a clear error: it never runs something else.

This module is the consumer's side (a Task, finding tasks in modules, running their jobs); the
app's side, the registry whose producers enqueue() puts through, is notifyq/tasks.py, above the
sharding layer, so that a task enqueues as notifyq.Producer does (with [shards] too).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from notifyq import errors
from notifyq.config import values
from notifyq.config import validate_queue_name
from notifyq.consume import handlers
from notifyq.jobs import Job
from notifyq.produce.producer import replaces


class Task:
    """A function that can also be enqueued: calling it runs it here, `.enqueue()` puts a job."""

    def __init__(self, fn: Callable[..., Any], registry: Any, *, queue: str, name: str,
                 max_attempts: int | None, priority: int, timeout_s: float | None = None,
                 key: str | Callable[..., str | None] | None = None, dedup: str = "keep",
                 min_version: int | None = None):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.registry = registry
        self.queue = validate_queue_name(queue)
        self.name = name
        self.max_attempts = max_attempts
        self.priority = values.number("priority", priority, lo=-32768, hi=32767, integer=True)
        # None: the queue's timeout_s; 0: none for this task, whatever the queue's
        self.timeout_s = None if timeout_s is None else values.seconds("timeout_s", timeout_s, positive=False)
        # Its jobs' flow-control key: one for them all (a str), or a function of each call's
        # arguments (the task's own), for a key per customer or tenant
        if key is not None and not callable(key):
            key = values.job_key(f"task {name}: key", key)
        self.key = key
        self.dedup = dedup  # what its enqueue(dedup_key=...) does to a pending job of the key
        if dedup != "keep":
            replaces(dedup, "")  # "replace", or InputError
        # None: any consumer runs its jobs; else only one of at least this code version
        self.min_version = None if min_version is None else int(
            values.number("min_version", min_version, lo=0, hi=values.MAX_VERSION, integer=True))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def enqueue(self, *args: Any, delay: float = 0, dedup_key: str | None = None, conn: Any = None,
                **kwargs: Any) -> int:
        """Put a job that runs this task with these arguments (JSON-serialisable); its id.
        `delay`, `dedup_key` and `conn` are Producer.put's (so a task cannot take arguments of
        those names); `conn` commits the job with the caller's transaction."""
        payload = {"task": self.name, "args": list(args), "kwargs": kwargs}
        return self.registry.producer(self.queue).put(payload, priority=self.priority, delay=delay,
                                                      max_attempts=self.max_attempts,
                                                      dedup_key=dedup_key, key=self.key_of(args, kwargs),
                                                      dedup=self.dedup if dedup_key is not None else "keep",
                                                      conn=conn, min_version=self.min_version)

    def key_of(self, args: tuple, kwargs: dict[str, Any]) -> str | None:
        """The flow-control key of a job of these arguments: the task's key, or what its key
        function returns for them (None: no key), checked as put(key=) checks a key."""
        if not callable(self.key):
            return self.key
        key = self.key(*args, **kwargs)
        return None if key is None else values.job_key(f"task {self.name}: its key function's result", key)

    def __repr__(self) -> str:
        return f"<notifyq task {self.name} queue={self.queue}>"


def tasks_in(module_names: tuple[str, ...]) -> dict[str, Task]:
    """The Task objects the modules define (imported as a handler's module is), by name."""
    found: dict[str, Task] = {}
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`, as handlers.load_callable does
    for module_name in module_names:
        try:
            module = importlib.import_module(module_name)
        except SystemExit as e:
            raise errors.HandlerError(f"--tasks {module_name}: importing it called sys.exit({e.code!r})") from None
        except Exception as e:
            raise errors.HandlerError(f"--tasks {module_name}: cannot import it: {e}") from None
        mine = {t.name: t for t in vars(module).values() if isinstance(t, Task)}
        if not mine:
            raise errors.HandlerError(f"--tasks {module_name}: it defines no @notifyq.task function")
        found.update(mine)
    return found


class TaskHandler(handlers.PythonHandler):
    """Runs each job by the task its payload names, among `tasks`; per job only."""

    def __init__(self, tasks: dict[str, Task], queue: str, around=None):
        self.tasks = {n: t for n, t in tasks.items() if t.queue == queue}
        if not self.tasks:
            raise errors.HandlerError(f"--tasks: no task of these modules is on queue {queue} "
                                      f"(theirs: {', '.join(sorted({t.queue for t in tasks.values()}))})")
        super().__init__(self._run, per_batch=False, around=around)

    def timeout_for(self, jobs: list[Job], queue_timeout_s: float) -> float:
        """Each job's task's timeout_s, else the queue's. Jobs started together (--concurrency)
        share one call: it is bounded by the longest of theirs, so no job is cut short of its
        own (and by none if one of them has none)."""
        limits = []
        for job in jobs:
            task = self._task_of(job)
            limits.append(queue_timeout_s if task is None or task.timeout_s is None else task.timeout_s)
        return 0.0 if not limits or 0 in limits else max(limits)

    def task_name(self, job: Job) -> str:
        task = self._task_of(job)
        return task.name if task is not None else ""

    def _task_of(self, job: Job) -> Task | None:
        name = job.payload.get("task") if isinstance(job.payload, dict) else None
        return self.tasks.get(name) if isinstance(name, str) else None

    def _run(self, job: Job) -> Any:
        payload = job.payload
        task = self._task_of(job)
        if task is None:
            name = payload.get("task") if isinstance(payload, dict) else None
            raise UnknownTask(_unknown(name, payload, sorted(self.tasks)))
        args, kwargs = payload.get("args", []), payload.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise UnknownTask(f"task {task.name}: the job's args must be a list and its kwargs an object")
        return task.fn(*args, **kwargs)


class UnknownTask(errors.NotifyqError):
    """A job that names no task this consumer runs."""


def _unknown(name: Any, payload: Any, known: list[str]) -> str:
    if name is None:
        what = "the job names no task (its payload has no \"task\" key)" if isinstance(payload, dict) \
            else "the job is not a task's (its payload is not an object)"
    else:
        what = f"unknown task {values.shown(name)}"
    return f"{what}; this consumer runs: {', '.join(known)}"
