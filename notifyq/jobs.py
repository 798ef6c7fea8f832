"""Job: what a handler receives, and how it reports a per-job outcome in batch mode."""

from __future__ import annotations

import datetime as dt
import enum
import time
from dataclasses import dataclass, field
from typing import Any


class Status(enum.IntEnum):
    READY = 0
    SCHEDULED = 1  # run_at lies in the future (delayed put, or a retry waiting for its backoff)
    CLAIMED = 2
    DONE = 3  # only kept when the queue has keep_done = true
    DEAD = 4  # out of attempts; last_error says why
    CANCELLED = 5  # its cancel was requested while it ran (`notifyq jobs cancel`): who and when on the row


STATUS_NAMES = {s.value: s.name.lower() for s in Status}


@dataclass(eq=False)
class Job:
    """One job, as a handler gets it: `def handler(job: notifyq.Job) -> None`.

    Return from the handler to complete the job; raise to fail it (retried with backoff, and
    dead after `max_attempts`). A batch handler (`--per-batch`) gets a list of jobs and fails
    them one by one with `job.fail()`.

    Attributes:
        id: the job's id, as `Producer.put()` returned it.
        queue: the queue's name.
        payload: the payload that was put, decoded from JSON.
        priority: higher runs first.
        attempts: how many times the job was claimed, this run included (1 on the first run).
        max_attempts: the run after which a failure makes the job dead.
        run_at: when the job became due (UTC).
        created_at: when it was put (UTC).
        dedup_key: the key it was put with, if any.
    """

    id: int
    queue: str
    payload: Any
    priority: int
    attempts: int  # including the current one
    max_attempts: int
    run_at: dt.datetime
    created_at: dt.datetime
    dedup_key: str | None = None
    # Set by a batch handler that wants to fail this one job; None means success.
    error: str | None = field(default=None, repr=False)
    retry: bool = field(default=True, repr=False)
    # For the failure's log line only (never stored): the traceback of a handler that raised.
    detail: str | None = field(default=None, repr=False)
    # What the handler raised, for the on_failure hook only (never stored).
    exception: BaseException | None = field(default=None, repr=False)
    _extend: Any = field(default=None, repr=False)
    _cancel_check: Any = field(default=None, repr=False)  # set by the worker: () -> bool
    _cancel_seen: bool = field(default=False, repr=False)
    _cancel_checked_at: float = field(default=float("-inf"), repr=False)
    # Set by the worker: the job's completion in the handler's own transaction (consume/effects.py)
    _completion: Any = field(default=None, repr=False)
    # None; "committed" (job.transaction() committed its completion); "pending" (complete_in:
    # the caller commits, the worker finds out whether it did)
    _completed: str | None = field(default=None, repr=False)
    _snooze_s: float | None = field(default=None, repr=False)  # job.snooze(): back after this long
    _result: Any = field(default=None, repr=False)  # the handler's return value (per-job handlers)
    _started: float | None = field(default=None, repr=False)  # monotonic, for the attempt's record
    _ended: float | None = field(default=None, repr=False)
    _reported: bool = field(default=False, repr=False)  # handed to on_failure already

    def fail(self, error: str, *, retry: bool = True) -> None:
        """Mark this job failed, then return from the handler: it is retried with backoff, or
        with `retry=False` dead at once (an error no retry will fix). A batch handler fails its
        jobs one by one this way; the jobs it does not fail succeed."""
        self.error = str(error) or "failed"
        self.retry = retry

    def snooze(self, seconds: float) -> None:
        """Put this job back to run again in `seconds`, without spending an attempt (the handler
        then returns; `raise notifyq.Snooze(seconds)` does the same). Its attempt record says
        `snoozed`. A job whose cancel was requested ends cancelled instead."""
        seconds = float(seconds)
        if not seconds >= 0:
            raise ValueError(f"snooze: seconds must be >= 0, got {seconds!r}")
        self._snooze_s = seconds

    def extend_lease(self) -> None:
        """Long-running handlers: push the claim's lease out again so no reaper takes the job.
        Inside job.transaction() too: the extension commits apart, never the block."""
        if self._extend is not None:
            self._extend()

    def cancel_requested(self, max_age_s: float = 1.0) -> bool:
        """Long-running handlers: has `notifyq jobs cancel` asked this job to stop?

        Cooperative: the handler decides where it is safe to stop, then returns or calls
        `job.fail("cancelled", retry=False)`: once this said yes, the job ends cancelled. Also true
        once the claim is no longer this worker's (lease expired, job taken back). Cheap to
        call in a loop: the database is asked at most once per `max_age_s`, and never again
        after it said yes. Inside job.transaction() it reads in the block's transaction and
        commits nothing of it.
        """
        check = self._cancel_check
        if check is None and self._completion is not None:
            check = lambda: self._completion.cancel_requested(self.id)  # noqa: E731
        if self._cancel_seen or check is None:
            return self._cancel_seen
        now = time.monotonic()
        if now - self._cancel_checked_at >= max_age_s:
            self._cancel_checked_at = now
            self._cancel_seen = bool(check())
        return self._cancel_seen

    def transaction(self, result: Any = None):
        """A transaction on notifyq's database that also completes this job.

            with job.transaction() as cur:
                cur.execute("INSERT INTO charge (order_id, cents) VALUES (%s, %s)", (order, cents))

        The handler's writes and the job's completion commit together or not at all. The
        completion is fenced by the claim (its token and attempt): if the job was taken back
        meanwhile, nothing is committed and `notifyq.ClaimLost` is raised. Once it committed,
        the worker does not ack the job again. `cur.connection` is the connection. `result`
        (JSON) is stored with the completion when the queue keeps results. Do not end the
        transaction inside the block (COMMIT, ROLLBACK, or a statement that commits implicitly:
        START TRANSACTION, SET autocommit = 1, LOCK TABLES, DDL): the block then raises
        `notifyq.errors.TransactionEnded` and the job fails without a retry.
        """
        if self._completion is None:
            raise RuntimeError("job.transaction() needs a job a notifyq worker claimed")
        return self._completion.transaction(self, result)

    def complete_in(self, conn, result: Any = None) -> None:
        """Complete this job inside the caller's own transaction on `conn` (a MySQLdb
        connection, Django's `connection`, an SQLAlchemy Connection or Session) to notifyq's
        database: the caller commits, and the job is done only if that COMMIT lands. Fenced as
        transaction() is: `notifyq.ClaimLost` (and the transaction rolled back) if the claim
        was taken back. A connection in autocommit mode with no transaction open is refused
        (`InputError`). Commit before the handler returns: the worker then finds out whether
        the completion landed; if not, the job fails and is retried."""
        if self._completion is None:
            raise RuntimeError("job.complete_in() needs a job a notifyq worker claimed")
        self._completion.complete_in(self, conn, result)

    @property
    def last_attempt(self) -> bool:
        return self.attempts >= self.max_attempts


def cancelled(jobs: list[Job]) -> list[Job]:
    """Per-batch handlers: which of these jobs has `notifyq jobs cancel` asked to stop (or are
    no longer this worker's)? One statement for the whole batch; a job once seen cancelled stays
    so. Stop them where it is safe and return (or `job.fail("cancelled", retry=False)` each):
    the jobs this returned end cancelled, the others as the handler says."""
    asking = [j for j in jobs if not j._cancel_seen and j._completion is not None]
    if asking:
        found = asking[0]._completion.cancelled([j.id for j in asking])
        for job in asking:
            job._cancel_seen = job.id in found
    return [j for j in jobs if j._cancel_seen]
