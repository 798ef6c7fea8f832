"""Producer.result(): a handler's return value, once its job is done (docs/exactly-once.md#results).

Kept with the job's completion, on its attempt record, when the queue keeps results (keep_done,
or result_ttl_s > 0). A result is read once, not streamed, so no wake-up machinery is spent on
it: waits poll, and every wait of one producer on one server shares one Poller, that is one
session and one thread however many wait (250 waits with a session each took 250 connections,
and the server's max_connections ran out under its consumers, 1040). The poller looks at every
waiting job in one statement (jobs_status), reads the result of each that finished (`read`),
and looks again with backoff (5 ms doubling to 0.2 s; a new wait is looked at at once, but
never sooner than 5 ms after the last look). It lives while someone waits: the last wait to
end closes its session and ends its thread.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from notifyq import errors
from notifyq.config import DSN
from notifyq.jobs import Status
from notifyq.store import admin_queries
from notifyq.store.db import Session

POLL_FIRST_S, POLL_MAX_S = 0.005, 0.2
UNFINISHED = (Status.READY, Status.SCHEDULED, Status.CLAIMED)


class Pending(errors.ResultPending):
    """`read`: not finished yet; what to raise if the wait is over."""


def read(session: Session, job_id: int) -> Any:
    """One look at job `job_id`: its result once done (None when it returned None or the queue
    keeps none). Raises Pending while it is not finished, JobFailed if it ended dead,
    InputError if it was cancelled (its row kept or not) or is gone otherwise (purged, never
    existed)."""
    status, last_error, outcome, result = admin_queries.job_result(session, int(job_id))
    if status == Status.DONE or (status is None and outcome == "done"):
        return None if result is None else json.loads(result)
    if status == Status.DEAD:
        raise errors.JobFailed(f"job {job_id} ended dead: {last_error}")
    if status == Status.CANCELLED:
        # Ended, and it never will run (a workflow's job kept cancelled, or a cancel asked while
        # it ran): as a cancelled job that is gone, answered now, not at the end of the wait
        raise errors.InputError(f"job {job_id} was cancelled: {last_error or 'cancelled'}")
    if status is None:
        from notifyq.ops import admin  # the wording of `no job N`, in one place

        raise errors.InputError(admin.gone(session, int(job_id)))
    raise Pending(unfinished(job_id, status))


def unfinished(job_id: int, status: int) -> str:
    return f"job {job_id} has not finished (it is {Status(status).name.lower()})"


def next_delay(delay: float) -> float:
    return min(delay * 2, POLL_MAX_S)


class Wait:
    """One result() wait, as the poller sees it: `told` is called on the poller's thread after
    each look, with the job's outcome once it has one (("value", v) or ("error", exception)),
    else None (`pending` then says why)."""

    __slots__ = ("job_id", "told", "pending")

    def __init__(self, job_id: int, told: Callable[[tuple[str, Any] | None], None]):
        self.job_id, self.told = int(job_id), told
        self.pending = f"job {job_id} has not been looked at"


class Poller:
    """The one session and thread that look at the jobs of every wait of a producer on one
    server (`dsn`). Thread-safe: waits come and go from any thread, or an event loop."""

    def __init__(self, dsn: DSN, retry: dict[str, Any] | None = None):
        """retry: the session's connect retry (Session's retry_s, retry_setting,
        retry_log_level), the producer's: a wait fails as fast as a put does."""
        self.dsn = dsn
        self._retry = dict(retry or {})
        self._mutex = threading.Lock()
        self._waits: list[Wait] = []
        self._thread: threading.Thread | None = None
        self._new = threading.Event()  # a wait came: look at once
        # Held by the thread for its life, session included: the next thread opens its session
        # only once the last one's is closed, so there is never more than one.
        self._alive = threading.Lock()

    def add(self, wait: Wait) -> None:
        with self._mutex:
            self._waits.append(wait)
            self._new.set()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="notifyq-results", daemon=True)
                self._thread.start()

    def remove(self, wait: Wait) -> None:
        with self._mutex:
            if wait in self._waits:
                self._waits.remove(wait)

    def _run(self) -> None:
        with self._alive:
            session = Session(self.dsn, name="result", **self._retry)
            try:
                delay, looked_at = POLL_FIRST_S, -POLL_FIRST_S
                while True:
                    # At most a look every POLL_FIRST_S, however fast new waits come: one busy
                    # session, never a busy server
                    time.sleep(max(0.0, looked_at + POLL_FIRST_S - time.monotonic()))
                    with self._mutex:
                        waits = list(self._waits)
                        if not waits:
                            self._thread = None  # a wait added from now on starts a thread
                            return
                        self._new.clear()
                    looked_at = time.monotonic()
                    self._look(session, waits)
                    if self._new.wait(delay):
                        delay = POLL_FIRST_S
                    else:
                        delay = next_delay(delay)
            finally:
                session.close()

    def _look(self, session: Session, waits: list[Wait]) -> None:
        """One look at every waiting job: which are unfinished, in one statement; then each of
        the others, by `read`. A database error is every wait's outcome."""
        job_ids = sorted({w.job_id for w in waits})
        outcomes: dict[int, tuple[str, Any]] = {}
        pending: dict[int, str] = {}
        try:
            states = admin_queries.jobs_status(session, job_ids)
            for job_id in job_ids:
                if states.get(job_id) in UNFINISHED:
                    pending[job_id] = unfinished(job_id, states[job_id])
                    continue
                try:
                    outcomes[job_id] = ("value", read(session, job_id))
                except Pending as e:
                    pending[job_id] = str(e)
                except (errors.JobFailed, errors.InputError) as e:
                    outcomes[job_id] = ("error", e)
        except Exception as e:  # noqa: BLE001 - the server is away, or refused: each wait raises it
            outcomes, pending = {job_id: ("error", e) for job_id in job_ids}, {}
        for wait in waits:
            if wait.job_id in pending:
                wait.pending = pending[wait.job_id]
                wait.told(None)
            else:
                self.remove(wait)
                wait.told(outcomes[wait.job_id])


def outcome_of(outcome: tuple[str, Any]) -> Any:
    kind, value = outcome
    if kind == "error":
        raise value
    return value


def wait_for(poller: Poller, job_id: int, wait_s: float) -> Any:
    """Job `job_id`'s result, through the poller, within wait_s (then ResultPending); at least
    one look, however short the wait."""
    deadline = time.monotonic() + max(0.0, wait_s)
    told = threading.Condition()
    state: dict[str, Any] = {"looked": False, "outcome": None}

    def tell(outcome: tuple[str, Any] | None) -> None:
        with told:
            state["looked"] = True
            state["outcome"] = outcome
            told.notify_all()

    wait = Wait(job_id, tell)
    poller.add(wait)
    try:
        with told:
            while state["outcome"] is None:
                left = deadline - time.monotonic()
                if state["looked"] and left <= 0:
                    raise errors.ResultPending(wait.pending)
                told.wait(left if state["looked"] else 1.0)  # the first look comes whatever the wait
        return outcome_of(state["outcome"])
    finally:
        poller.remove(wait)
