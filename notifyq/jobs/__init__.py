"""Job: what a handler receives, and how it reports a per-job outcome in batch mode.

What the worker keeps of the attempt (its outcome, timings, result, completion) is the job's
Run (jobs/run.py), which only its own module writes; the Job's methods go through it."""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from notifyq.jobs.run import Run


class Status(enum.IntEnum):
    READY = 0
    SCHEDULED = 1  # run_at lies in the future (delayed put, or a retry waiting for its backoff)
    CLAIMED = 2
    DONE = 3  # only kept when the queue has keep_done = true
    DEAD = 4  # out of attempts; last_error says why
    CANCELLED = 5  # its cancel was requested while it ran (`notifyq jobs cancel`): who and when on the row
    WAITING = 6  # put with after=: waits for its parents (nq_edge); never claimed until released


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
        dedup_key: the dedup key it was put with, if any.
        key: the flow-control key it was put with (`put(..., key=)`), if any: the key its queue's
            limits count it under.
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
    key: str | None = None
    # The attempt's state in the worker's hands (jobs/run.py): none of the handler's business
    _run_state: Run = field(default_factory=Run, init=False, repr=False)

    @property
    def error(self) -> str | None:
        """Why this attempt failed (job.fail(), or what the handler raised); None so far."""
        return self._run_state.error

    @property
    def retry(self) -> bool:
        """Whether a failed attempt is retried (False: `fail(..., retry=False)`)."""
        return self._run_state.retry

    @property
    def detail(self) -> str | None:
        """The traceback of a handler that raised, for the failure's log line only (never stored)."""
        return self._run_state.detail

    @property
    def exception(self) -> BaseException | None:
        """What the handler raised, for the on_failure hook only (never stored)."""
        return self._run_state.exception

    def fail(self, error: str, *, retry: bool = True) -> None:
        """Mark this job failed, then return from the handler: it is retried with backoff, or
        with `retry=False` dead at once (an error no retry will fix). A batch handler fails its
        jobs one by one this way; the jobs it does not fail succeed."""
        self._run_state.fail(error, retry)

    def snooze(self, seconds: float) -> None:
        """Put this job back to run again in `seconds`, without spending an attempt (the handler
        then returns; `raise notifyq.Snooze(seconds)` does the same). Its attempt record says
        `snoozed`. A job whose cancel was requested ends cancelled instead."""
        seconds = float(seconds)
        if not seconds >= 0:
            raise ValueError(f"snooze: seconds must be >= 0, got {seconds!r}")
        self._run_state.snooze(seconds)

    def extend_lease(self) -> None:
        """Long-running handlers: push the claim's lease out again so no reaper takes the job.
        Inside job.transaction() too: the extension commits apart, never the block."""
        self._run_state.extend_lease()

    def cancel_requested(self, max_age_s: float = 1.0) -> bool:
        """Long-running handlers: has `notifyq jobs cancel` asked this job to stop?

        Cooperative: the handler decides where it is safe to stop, then returns or calls
        `job.fail("cancelled", retry=False)`: once this said yes, the job ends cancelled. Also true
        once the claim is no longer this worker's (lease expired, job taken back). Cheap to
        call in a loop: the database is asked at most once per `max_age_s`, and never again
        after it said yes. Inside job.transaction() it reads in the block's transaction and
        commits nothing of it.
        """
        return self._run_state.cancel_requested(self.id, max_age_s)

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
        completion = self._run_state.completion
        if completion is None:
            raise RuntimeError("job.transaction() needs a job a notifyq worker claimed")
        return completion.transaction(self, result)

    def complete_in(self, conn, result: Any = None) -> None:
        """Complete this job inside the caller's own transaction on `conn` (a MySQLdb
        connection, Django's `connection`, an SQLAlchemy Connection or Session) to notifyq's
        database: the caller commits, and the job is done only if that COMMIT lands. Fenced as
        transaction() is: `notifyq.ClaimLost` (and the transaction rolled back) if the claim
        was taken back. A connection in autocommit mode with no transaction open is refused
        (`InputError`). Commit before the handler returns: the worker then finds out whether
        the completion landed; if not, the job fails and is retried."""
        completion = self._run_state.completion
        if completion is None:
            raise RuntimeError("job.complete_in() needs a job a notifyq worker claimed")
        completion.complete_in(self, conn, result)

    def step(self, name: str, *, transaction: bool = False):
        """A durable step of this job: its result is kept once it has committed, and a later run
        of the job (a retry, a run after its claim was taken back) skips it.

            with job.step("fetch") as step:
                if not step.done:                 # True: finished in an earlier run
                    step.result = fetch(url)      # JSON; stored as the block ends
            page = step.result

            @job.step("fetch")                    # or as a decorator: the function returns the
            def page():                           # stored result, or runs and stores its own
                return fetch(url)

        Outside job.transaction() the record commits in a transaction of its own, after the body:
        a crash in between runs the body again (at least once). Inside job.transaction() it commits
        with the block's writes and the job's completion. With `transaction=True`, `step.cursor`
        (the decorated function's first argument) writes in the step's own transaction, which
        commits with its record and does not complete the job: exactly once per step. Each is
        fenced by the claim: `notifyq.ClaimLost` if it was taken back (nothing stored). A name is a
        string of 1 to 191 characters; a result that is not strict JSON (or over 64 KiB) is refused
        (`InputError`) and nothing of the step is stored.
        """
        completion = self._run_state.completion
        if completion is None:
            raise RuntimeError("job.step() needs a job a notifyq worker claimed")
        return completion.step(self, name, transaction)

    @property
    def steps(self) -> dict[str, Any]:
        """{name: result} of this job's finished steps: earlier runs' and this one's."""
        completion = self._run_state.completion
        if completion is None:
            raise RuntimeError("job.steps needs a job a notifyq worker claimed")
        return completion.steps_of(self).finished()

    @property
    def last_attempt(self) -> bool:
        return self.attempts >= self.max_attempts


class _ServerTime:
    """Job.run_at and Job.created_at: a datetime, as given to Job(), or as the server wrote it
    for a job a claim took (claimed(): its text, as bytes), decoded when first read, then kept.
    A consumer's handlers seldom read them, and decoding both on every claimed row cost more
    than any other column. Kept in a private attribute (`_run_at`), read and written by name:
    the instance's __dict__, asked for, would be made per job, and cost more than the decode.
    Set on Job after the dataclass is made, so that Job()'s signature (both required) stays as
    it is; Job() stores its arguments through __set__."""

    __slots__ = ("slot",)

    def __init__(self, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, job: Job | None, owner: type | None = None) -> Any:
        if job is None:
            return self
        value = getattr(job, self.slot)
        if value.__class__ is bytes:  # the claim's text: decoded once
            value = _decoded(value)
            setattr(job, self.slot, value)
        return value

    def __set__(self, job: Job, value: Any) -> None:
        setattr(job, self.slot, value)


_fromisoformat = dt.datetime.fromisoformat


def _decoded(text: bytes) -> dt.datetime | None:
    """A DATETIME(6)'s text (b'YYYY-MM-DD hh:mm:ss.ffffff') as the database driver decodes the
    column (store/driver.py): a naive datetime (UTC), or None for a text that is no date (a
    zero date, which a lax sql_mode lets a hand-written row hold)."""
    try:
        return _fromisoformat(text.decode())
    except ValueError:
        return None


Job.run_at = _ServerTime("run_at")  # type: ignore[assignment]
Job.created_at = _ServerTime("created_at")  # type: ignore[assignment]
_new = object.__new__


def claimed(id: int, queue: str, payload: Any, priority: int, attempts: int, max_attempts: int,
            run_at_text: bytes, created_at_text: bytes, dedup_key: str | None, key: str | None,
            clock: Any = None) -> Job:
    """A Job as a claim builds it, one per row it took: run_at and created_at as the server's
    text (CAST ... AS BINARY), decoded when first read; and without Job()'s keyword call and its
    stores through __set__ (the claim builds one per job). clock: the claim's (Claim.clock)."""
    job = _new(Job)
    job.id = id
    job.queue = queue
    job.payload = payload
    job.priority = priority
    job.attempts = attempts
    job.max_attempts = max_attempts
    job._run_at = run_at_text  # (_ServerTime's slots)
    job._created_at = created_at_text
    job.dedup_key = dedup_key
    job.key = key
    job._run_state = Run(clock)
    return job


# run_of(job): the worker's side of a job, its attempt's state (jobs/run.py). An attrgetter, not
# a function: the worker asks it several times per job, and a Python call costs more than the read.
run_of: Callable[[Job], Run] = attrgetter("_run_state")


def cancelled(jobs: list[Job]) -> list[Job]:
    """Per-batch handlers: which of these jobs has `notifyq jobs cancel` asked to stop (or are
    no longer this worker's)? One statement for the whole batch; a job once seen cancelled stays
    so. Stop them where it is safe and return (or `job.fail("cancelled", retry=False)` each):
    the jobs this returned end cancelled, the others as the handler says."""
    asking = [j for j in jobs if not j._run_state.cancel_seen and j._run_state.completion is not None]
    if asking:
        found = asking[0]._run_state.completion.cancelled([j.id for j in asking])
        for job in asking:
            job._run_state.cancel_answered(job.id in found)
    return [j for j in jobs if j._run_state.cancel_seen]
