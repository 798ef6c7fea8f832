"""Traced: a handler whose every call runs inside the installed tracer's "process" span
(jobs/tracing.py). Made per call by the batch's run, only while a tracer is installed; it runs
on the thread that calls the handler (a timeout_s helper thread too), so that the handler's
own spans are children of the run's.
"""

from __future__ import annotations

from collections.abc import Callable

from notifyq.consume.handler import Handler, Wrapping
from notifyq.jobs import Job
from notifyq.jobs.tracing import Tracer


class Traced(Wrapping):
    def __init__(self, inner: Handler, tracer: Tracer, queue: str):
        super().__init__(inner)
        self.tracer, self.queue = tracer, queue

    def __call__(self, jobs: list[Job], extend: Callable[[], None]) -> None:
        self.tracer.process(self.queue, jobs, lambda: self.inner(jobs, extend))
