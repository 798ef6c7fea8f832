"""Traced: a handler whose every call runs inside the installed tracer's "process" span
(jobs/tracing.py). Made per call by the batch's run, only while a tracer is installed; it runs
on the thread that calls the handler (a timeout_s helper thread too), so that the handler's
own spans are children of the run's.
"""

from __future__ import annotations

from collections.abc import Callable

from notifyq.consume.handler import Handler
from notifyq.jobs import Job
from notifyq.jobs.tracing import Tracer


class Traced(Handler):
    def __init__(self, inner: Handler, tracer: Tracer, queue: str):
        self.inner, self.tracer, self.queue = inner, tracer, queue
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
        self.tracer.process(self.queue, jobs, lambda: self.inner(jobs, extend))
