"""Run: one job's attempt in a worker's hands, apart from the Job its handler sees.

What the worker knows of an attempt and the handler does not read: its outcome (failed with
what, retried or not, snoozed for how long, the value the handler returned), its timings for
the attempt's record, whether it was completed in the handler's own transaction, whether an
on_failure hook heard of it, and the worker's handles for it (the lease extension, the claim's
Completion: claim token, owner, work session). The worker reaches it with
`notifyq.jobs.run_of(job)`.

This module alone writes it: each field has a read-only property, and a method named for the
moment it changes (start, finish, fail, snooze, keep_result, committed, ...). The handler's
own calls (Job.fail, Job.snooze, Job.cancel_requested) go through those methods too.
"""

from __future__ import annotations

import time
from operator import attrgetter
from typing import Any

# How a job was completed in the handler's own transaction (Run.completed)
COMMITTED = "committed"  # job.transaction(): its completion committed
PENDING = "pending"  # job.complete_in(conn): the caller commits; the worker finds out whether it did
_NEVER = float("-inf")  # a cancel check's time before the first (made once, not per job)


class Run:
    __slots__ = ("_error", "_retry", "_detail", "_exception", "_snooze_s", "_result", "_started", "_ended",
                 "_completed", "_reported", "_extend", "_completion", "_cancel_seen", "_cancel_checked_at", "_trace", "_task",
                 "_interrupted", "_text", "_encoded", "_clock", "_released")

    def __init__(self, clock: Any = None) -> None:
        self._error: str | None = None  # None: a success (so far)
        self._retry = True
        self._detail: str | None = None  # the traceback of a handler that raised, for the log line only
        self._exception: BaseException | None = None  # what the handler raised, for on_failure only
        self._snooze_s: float | None = None  # job.snooze(): back after this long
        self._result: Any = None  # the handler's return value, kept when the queue keeps results
        # That value as kept (JSON, or None: not kept), rendered once the handler returned
        # (encode_result): from then on the value itself is let go
        self._text: str | None = None
        self._encoded = False
        self._started: float | None = None  # monotonic, for the attempt's record
        self._ended: float | None = None
        self._completed: str | None = None  # COMMITTED, PENDING or None
        self._released: tuple[str, ...] = ()  # PENDING: the queues of the children it released
        self._reported = False  # handed to on_failure already
        self._extend: Any = None  # the worker's: () -> None, push the claim's lease out
        self._completion: Any = None  # the worker's: the claim's Completion (consume/effects.py)
        self._cancel_seen = False
        self._cancel_checked_at = _NEVER
        self._trace: dict[str, str] | None = None  # the enqueue's trace context (jobs/envelope.py)
        self._task = ""  # the task it runs, for the per-task figures ("": a plain handler's job)
        self._interrupted = False  # stopped by its own consumer's shutdown, not by its code
        # Its claim's clock (queries.Claim.clock): the server's time of the claim and the monotonic
        # time it was read at, which place started and ended on the server's clock in its record
        self._clock = clock

    # -------------------------------------------------------- read (never written but below)

    error = property(attrgetter("_error"))
    retry = property(attrgetter("_retry"))
    detail = property(attrgetter("_detail"))
    exception = property(attrgetter("_exception"))
    snooze_s = property(attrgetter("_snooze_s"))
    result = property(attrgetter("_result"))
    text = property(attrgetter("_text"))
    encoded = property(attrgetter("_encoded"))
    started = property(attrgetter("_started"))
    ended = property(attrgetter("_ended"))
    completed = property(attrgetter("_completed"))
    released = property(attrgetter("_released"))
    completion = property(attrgetter("_completion"))
    cancel_seen = property(attrgetter("_cancel_seen"))
    trace = property(attrgetter("_trace"))
    task = property(attrgetter("_task"))
    interrupted = property(attrgetter("_interrupted"))
    clock = property(attrgetter("_clock"))

    # -------------------------------------------------------- the worker's handles

    def hand(self, extend: Any, completion: Any) -> None:
        """What the worker gives the attempt before its handler runs: the lease extension and
        the claim's Completion."""
        self._extend, self._completion = extend, completion

    def carried(self, trace: dict[str, str] | None) -> None:
        """The trace context the job was put with (its stored envelope), for the run's span."""
        self._trace = trace

    def named(self, task: str) -> None:
        """The task the job runs, as its handler names it (Handler.task_name)."""
        self._task = task

    def complete_through(self, completion: Any) -> None:
        """A new Completion (the old session went with a timed-out call)."""
        self._completion = completion

    def extend_lease(self) -> None:
        if self._extend is not None:
            self._extend()

    # -------------------------------------------------------- timings

    def start(self, now: float) -> None:
        self._started = now

    def finish(self, now: float) -> None:
        """Its handler's call returned: the attempt's end, unless the handler told an earlier
        one (end_at)."""
        if self._ended is None:
            self._ended = now

    def end_at(self, at: float) -> None:
        """The attempt ended at `at` (monotonic), whenever its call returns: a command's exit,
        which its call may see only once a lease extension stops waiting on the server."""
        self._ended = at

    # -------------------------------------------------------- outcome

    def fail(self, error: str, retry: bool = True, detail: str | None = None,
             exception: BaseException | None = None) -> None:
        """The attempt failed (job.fail(), the handler raised, a timeout, the worker failed)."""
        self._error = str(error) or "failed"
        self._retry = retry
        if detail is not None:
            self._detail = detail
        if exception is not None:
            self._exception = exception

    def interrupt(self, reason: str) -> None:
        """The consumer's shutdown grace ran out while the attempt ran (its command killed, or
        its handler left running as the process exits): not the job's failure. It goes back
        uncharged, its attempt recorded 'interrupted' (queries.reschedule_or_bury)."""
        self._error = str(reason) or "interrupted"
        self._retry = True
        self._interrupted = True

    def snooze(self, seconds: float) -> None:
        self._snooze_s = seconds

    def keep_result(self, value: Any) -> None:
        self._result = value

    def drop_result(self) -> None:
        """A result that cannot be stored (its outcomes are sent again without it)."""
        self._result = self._text = None

    def encode_result(self, encode: Any) -> None:
        """The value as kept, rendered by `encode` (value -> JSON text or None) on the worker's
        thread as soon as the handler returned, and the value let go. Its cost (a value nested
        100,000 deep: its encoding, the collector's passes over it, its freeing) is the handler's
        then, before the next job starts and the lease is looked at; held to its ack, each such
        value made every collection of the batch slower, under a lease that nothing extended
        (a starved host took seconds, and the job ran twice)."""
        if self._encoded:
            return
        value, self._result = self._result, None
        self._text = None if value is None else encode(value)
        self._encoded = True

    def committed(self) -> None:
        """job.transaction() committed the job's completion: done, never acked again."""
        self._completed = COMMITTED

    def completed_pending(self, released: list[str]) -> None:
        """job.complete_in(conn) wrote the completion, which released workflow children on the
        queues `released`; the caller's COMMIT decides."""
        self._completed = PENDING
        self._released = tuple(released)

    def completion_missed(self) -> None:
        """complete_in's transaction did not commit: nothing of it is stored, the attempt fails
        (unless it failed already)."""
        self._completed = None
        if self._error is None:
            self.fail("job.complete_in(): the transaction that completes the job did not commit")

    def report_once(self) -> bool:
        """True the first time only: the on_failure hook hears of a failure once."""
        first, self._reported = not self._reported, True
        return first

    # -------------------------------------------------------- cancel checks

    def cancel_requested(self, job_id: int, max_age_s: float) -> bool:
        """Job.cancel_requested(): the database asked at most once per max_age_s, and never
        again once it said yes."""
        if self._cancel_seen or self._completion is None:
            return self._cancel_seen
        now = time.monotonic()
        if now - self._cancel_checked_at >= max_age_s:
            self._cancel_checked_at = now
            self._cancel_seen = bool(self._completion.cancel_requested(job_id))
        return self._cancel_seen

    def cancel_answered(self, seen: bool) -> None:
        """notifyq.cancelled(jobs) asked for the whole batch at once."""
        self._cancel_seen = seen
