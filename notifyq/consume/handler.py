"""Handler: what a worker calls on the jobs it claimed, declared once.

The consumer's handlers declare it (handlers.PythonHandler and tasks.TaskHandler,
commands.CommandHandler; reporting.Reporting and traced.Traced around any of them, through
Wrapping) and take its defaults where they have nothing to add. A bare object with only `per_batch` and the call (a test's
recorder) is made one by `declared`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from notifyq.jobs import Job


@runtime_checkable
class Handler(Protocol):
    per_batch: bool  # a call gets the claim's whole batch, not the jobs of one group
    concurrency: int = 1  # per job: jobs handed over at once (a coroutine handler runs them together)

    def __call__(self, jobs: list[Job], extend: Callable[[], None]) -> None:
        """Run `jobs`, each one's outcome left on it (job.fail, its result); `extend` pushes
        their lease out at once."""
        ...

    def timeout_for(self, jobs: list[Job], queue_timeout_s: float) -> float:
        """How long a call on `jobs` may run on its helper thread, 0 for no bound (a command is
        bounded by its own command_timeout_s)."""
        return 0.0

    def task_name(self, job: Job) -> str:
        """The task a job runs, for the per-task figures: "" when the handler runs no tasks
        (a TaskHandler names the job's, among its own only: the label's values are bounded)."""
        return ""

    def report(self, failed: list[Job]) -> None:
        """Jobs failed outside the call (it ran past its timeout): an on_failure hook hears of
        them (reporting.Reporting); nothing else does."""

    def stop_running(self) -> bool:
        """The shutdown grace expired: stop what the calls still run. True when that ends them
        (a command's process group), and their batches settle by themselves."""
        return False

    def ran_to_end(self, thread_id: int) -> bool:
        """After stop_running: whether the call of that worker thread had run what it runs to a
        successful end by itself before the stop (a command that exited 0 while its call still
        waited on the server). Its job is then done, not interrupted."""
        return False

    def ended_at(self, thread_id: int) -> float | None:
        """After stop_running: when what the call of that worker thread ran had ended by itself
        (monotonic; a command's exit), for its attempt's record; None: unknown, or it had not."""
        return None


class Wrapping(Handler):
    """A handler around another one (reporting.Reporting, traced.Traced): all but the call is
    the inner handler's, so that a method the protocol gains reaches through every wrapper
    (a wrapper that kept the protocol's default would hide, say, a command's exit from the
    stop)."""

    def __init__(self, inner: Handler):
        self.inner = inner
        self.per_batch = inner.per_batch

    @property
    def concurrency(self) -> int:
        return self.inner.concurrency

    def timeout_for(self, jobs: list[Job], queue_timeout_s: float) -> float:
        return self.inner.timeout_for(jobs, queue_timeout_s)

    def task_name(self, job: Job) -> str:
        return self.inner.task_name(job)

    def report(self, failed: list[Job]) -> None:
        self.inner.report(failed)

    def stop_running(self) -> bool:
        return self.inner.stop_running()

    def ran_to_end(self, thread_id: int) -> bool:
        return self.inner.ran_to_end(thread_id)

    def ended_at(self, thread_id: int) -> float | None:
        return self.inner.ended_at(thread_id)

    def __call__(self, jobs: list[Job], extend: Callable[[], None]) -> None:
        self.inner(jobs, extend)


class _Bare(Handler):
    """An object of `per_batch` and the call only, with the defaults for the rest."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.per_batch = inner.per_batch

    def __call__(self, jobs: list[Job], extend: Callable[[], None]) -> None:
        self.inner(jobs, extend)


def declared(handler: Any) -> Handler:
    """`handler` as a Handler: itself when it is one."""
    return handler if isinstance(handler, Handler) else _Bare(handler)
