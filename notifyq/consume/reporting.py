"""A handler's failed jobs handed to the consumer's `on_failure(job, exc)` hook (an error
reporter such as Sentry), each once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from notifyq import errors
from notifyq.consume.handler import Handler, Wrapping
from notifyq.consume.handlers import describe
from notifyq.jobs import Job, run_of

log = logging.getLogger("notifyq.consumer")


class Reporting(Wrapping):
    """A handler whose failed jobs are also handed to `on_failure(job, exc)` (an error reporter
    such as Sentry): `exc` is what the handler raised, or errors.JobFailed for a command's
    failure or a batch job failed with job.fail(). A hook that raises is logged, never fails
    the job twice nor the consumer."""

    def __init__(self, inner: Handler, on_failure: Callable[[Job, BaseException], Any]):
        super().__init__(inner)
        self.on_failure = on_failure
        self._lock = threading.Lock()  # a timed-out job is reported by the worker, never again by its stray call

    def __call__(self, jobs: list[Job], extend: Callable[[], None]) -> None:
        fresh = [job for job in jobs if job.error is None]
        try:
            self.inner(jobs, extend)
        finally:
            # an interrupted job (the shutdown's doing, Run.interrupt) did not fail
            self.report([job for job in fresh if job.error is not None and not run_of(job).interrupted])

    def report(self, failed: list[Job]) -> None:
        """Hand each failed job to the hook, once."""
        with self._lock:
            new = [job for job in failed if run_of(job).report_once()]
        for job in new:
            self._report(job)

    def _report(self, job: Job) -> None:
        exc = job.exception if job.exception is not None else errors.JobFailed(job.error or "failed")
        try:
            self.on_failure(job, exc)
        except Exception as e:
            log.warning("on_failure hook raised queue=%s job=%d error=%s", job.queue, job.id, describe(e))
