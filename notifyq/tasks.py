"""The app's side of tasks: the registry of `@notifyq.task` functions and the producers their
`.enqueue()` puts through, one per queue (notifyq.Producer: with [shards], each job goes to its
queue's shard). The consumer's side, running a task's jobs, is notifyq/consume/tasks.py.

The registry is an object: `TaskRegistry()` gives an app (or a test) its own, with its own config
and producers; `notifyq.task` is the default registry's decorator, whose config is
`notifyq.load_config()` unless `configure()` set one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from notifyq import errors
from notifyq.config import values
from notifyq.config import Config, load
from notifyq.consume.tasks import Task
from notifyq.sharding.producer import Producer


class TaskRegistry:
    """Tasks by name, and the producers their enqueue() puts through (one per queue, shared by
    the threads of the process: Producer is thread-safe)."""

    def __init__(self, config: Config | Callable[[], Config] | None = None):
        self.tasks: dict[str, Task] = {}
        self._config = config
        self._producers: dict[str, Producer] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def task(self, fn: Callable[..., Any] | None = None, *, queue: str = "default", name: str | None = None,
             max_attempts: int | None = None, priority: int = 0, timeout_s: float | None = None,
             key: str | Callable[..., str | None] | None = None, dedup: str = "keep",
             min_version: int | None = None) -> Any:
        """Make a function a task: callable as before, and `.enqueue(*args, **kwargs)` puts a job
        that runs it in a consumer (`notifyq consume -q QUEUE --tasks MODULE`).

            @notifyq.task(queue="emails", max_attempts=3)
            def send_welcome(address: str) -> None: ...

            send_welcome.enqueue("a@example.com")   # returns the job's id

        `@notifyq.task` alone puts on the queue `default`. The arguments must be JSON.

        Args:
            queue: the queue its jobs go on.
            name: the name a job carries to find the function (default: `module.qualname`).
            max_attempts: runs before its job is dead (None: the queue's).
            priority: its jobs' priority.
            timeout_s: bounds a run of the task in a consumer, in place of the queue's
                `timeout_s` (0: no bound; None: the queue's).
            key: its jobs' flow-control key (`Producer.put`'s `key`), which the queue's
                `limit_per_key`, `rate_per_key` and `fair` count them under: a string for all of
                them, or a function that takes the task's arguments and returns a job's key
                (or None: no key), e.g. `key=lambda customer_id, **_: f"customer-{customer_id}"`.
            dedup: what `.enqueue(..., dedup_key=K)` does while a job of K is pending: `"keep"`
                (that job stays) or `"replace"` (debounce: the new job takes its place unless
                it is already running; `Producer.put`'s `dedup`).
            min_version: its jobs run only on consumers of at least this code version
                (`consumer.version`; rolling deploys: a task new in a release, or one whose
                arguments changed). None: any consumer.
        """
        def wrap(f: Callable[..., Any]) -> Task:
            if not callable(f):
                raise errors.InputError(f"task: expected a function, got {values.shown(f)}")
            task_name = name or f"{f.__module__}.{f.__qualname__}"
            t = Task(f, self, queue=queue, name=task_name, max_attempts=max_attempts, priority=priority,
                     timeout_s=timeout_s, key=key, dedup=dedup, min_version=min_version)
            self.tasks[task_name] = t
            return t
        return wrap(fn) if fn is not None else wrap

    def configure(self, config: Config | Callable[[], Config] | None) -> None:
        """The config enqueue() uses, or a function that gives it when a queue's producer is
        first needed (contrib.django's: the database of its settings); None: load_config().
        Closes the producers of the one before."""
        self.close()
        self._config = config

    def producer(self, queue: str) -> Producer:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's sessions are not its own
                self._producers, self._pid = {}, os.getpid()
            if queue not in self._producers:
                if self._config is None:
                    self._config = load()
                config = self._config() if callable(self._config) else self._config
                self._producers[queue] = Producer(queue, config, ring=True)
            return self._producers[queue]

    def close(self) -> None:
        with self._lock:
            producers, self._producers = self._producers, {}
        for producer in producers.values():
            producer.close()


default_registry = TaskRegistry()
task = default_registry.task
