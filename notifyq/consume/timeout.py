"""A Python handler's per-job timeout (`timeout_s`): the call runs on a helper thread, and the
worker waits for it at most that long.

Threads cannot be killed. A handler past its timeout is left running on its helper thread; its
job fails ("timeout", retried by the queue's policy) and the worker moves on with a new helper
thread and a new work session: the old session is the stray call's alone (its extensions are
refused, its job.transaction() is fenced out by the failure, which clears the claim), and it is
closed when the call returns. Its connection is ended at once on the server, as are those it
completed jobs on with complete_in whose completion did not land (end_connection, end_callers):
their locks go, and the job's next run never waits on them. A handler that must be stopped for good belongs in a process:
`--command`, whose timeout kills its process group.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from notifyq import errors
from notifyq.consume import handlers
from notifyq.consume.handler import Handler
from notifyq.consume.stats import Stats
from notifyq.jobs import Job, run_of
from notifyq.store import completion, queries
from notifyq.store.db import Session

log = logging.getLogger("notifyq.consumer")


def limit_for(handler: Handler, jobs: list[Job], queue_timeout_s: float) -> float:
    """How long the handler's call on `jobs` may run, 0 for no bound: a Python handler's
    (its task's timeout_s, else the queue's), also when wrapped (Reporting asks the handler it
    wraps); a command has none here, its process is bounded by command_timeout_s."""
    return handler.timeout_for(jobs, queue_timeout_s)


def fail_timed_out(handler: Handler, jobs: list[Job], timeout_s: float) -> None:
    """The handler's call on `jobs` ran past timeout_s: what it had not decided fails with
    "timeout", and an on_failure hook (reporting.Reporting) hears of it now, not when the
    stray call returns, if it ever does."""
    failed = [job for job in jobs if job.error is None and run_of(job).completed is None]
    for job in failed:
        job.fail(f"timeout: the handler ran longer than timeout_s ({timeout_s:g} s); its thread was left running")
    handler.report(failed)


def end_connection(session: Session, queue_name: str, conn_id: int | None, alive_at: float | None = None,
                   run: float | None = None) -> None:
    """A timed-out call's connection ended, and waited for, from the new work session (not
    killed if the server restarted since alive_at, when it was last known open, or is another
    run than `run`, the one it was connected to: queries.end_connection)."""
    if conn_id is None:
        return
    try:
        ended = session.run(lambda cur: queries.end_connection(cur, conn_id, session, alive_at, run),
                            what="end a timed-out handler's connection")
    except errors.NotifyqError as e:
        ended, reason = False, str(e)
    else:
        reason = "it outlived its KILL"
    if not ended:
        log.warning("a timed-out handler's connection could not be ended: a transaction it has open "
                    "keeps its locks until it ends queue=%s conn=%d reason=%s", queue_name, conn_id, reason)


def end_callers(session: Session, queue_name: str, token: int, conns: dict[int, tuple[int, float]]) -> None:
    """The connections a timed-out call completed jobs on with complete_in (job id -> (server
    id, when it last answered)), whose completion has not landed: their transaction still
    holds the job's row (the job's failure and its next run would wait on it). One whose
    completion landed is left alone: it is idle, and may be back in its framework's pool. Nor
    is one whose job's row nobody holds: its transaction ended (a server restart since it
    answered ends it too, and then its id may be another client's; the time it answered
    cannot always tell a restart a second later), so there is nothing to end."""
    if not conns:
        return

    def holding(cur) -> set[int]:
        left = sorted(set(conns) - completion.landed(cur, sorted(conns), token))
        return queries.rows_locked(cur, left) if left else set()

    try:
        held = session.run(holding, what="check a timed-out handler's completions")
    except errors.NotifyqError as e:
        log.warning("a timed-out handler's completions could not be checked: its connections are left "
                    "open queue=%s error=%s", queue_name, e)
        return
    for job_id, (conn_id, alive_at) in sorted(conns.items()):
        if job_id in held:
            end_connection(session, queue_name, conn_id, alive_at)


class HandlerCaller:
    """A worker's calls of its handler: timed into its stats, and bounded by the handler's
    timeout on a helper thread when it has one (the same thread call after call)."""

    def __init__(self, name: str, stats: Stats, on_return: Callable[[], None]):
        self.name = name
        self.stats = stats
        self.on_return = on_return  # the worker's loop turned: a long call is not a stall
        self.in_handler_since: float | None = None  # monotonic; the service's stall check reads it
        self._thread: HandlerThread | None = None

    def call(self, handler: Handler, jobs: list[Job], extend: Callable[[], None], queue_timeout_s: float,
             on_timeout: Callable[["Stray"], None]) -> None:
        """Call the handler on `jobs` (what it raises is raised here). Past its timeout, the call
        is left on its helper thread: `on_timeout` takes from it what it held, then its jobs
        fail; all of that still counts as the handler's time (the worker is not stalled)."""
        self.in_handler_since = t0 = time.monotonic()
        try:
            limit = handler.timeout_for(jobs, queue_timeout_s)  # limit_for's answer, asked direct
            if limit <= 0:  # (a command is bounded by its own command_timeout_s)
                handler(jobs, extend)
                return
            if self._thread is None:
                self._thread = HandlerThread(f"{self.name}-handler")
            if self._thread.run(lambda: handler(jobs, extend), limit):
                return
            stray, self._thread = Stray(self._thread, limit, jobs), None  # the next bounded call gets a new one
            on_timeout(stray)
            fail_timed_out(handler, jobs, limit)
        finally:
            self.in_handler_since = None
            self.stats.handler_seconds.observe(time.monotonic() - t0)
            self.on_return()

    def close(self) -> None:
        if self._thread is not None:
            self._thread.close()


class Stray:
    """A handler call that ran past its timeout, on the helper thread it keeps."""

    def __init__(self, thread: "HandlerThread", timeout_s: float, jobs: list[Job]):
        self.thread, self.timeout_s, self.jobs = thread, timeout_s, jobs
        self.ident = thread.thread.ident or 0

    def abandon(self, cleanup: Callable[[], None]) -> None:
        """Once the call returns, `cleanup`, then its thread ends."""
        self.thread.abandon(cleanup)


class HandlerThread:
    """One helper thread that runs a worker's handler calls, one at a time."""

    def __init__(self, name: str):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def run(self, call: Callable[[], None], timeout_s: float) -> bool:
        """True when `call` returned within timeout_s (what it raised is raised here)."""
        done, raised = threading.Event(), []
        self._calls.put((call, done, raised))
        if not done.wait(timeout_s):
            return False
        if raised:
            raise raised[0]
        return True

    def abandon(self, cleanup: Callable[[], None]) -> None:
        """The call under way timed out: once it returns, `cleanup`, then the thread ends."""
        self._calls.put((cleanup, threading.Event(), []))
        self._calls.put(None)

    def close(self) -> None:
        self._calls.put(None)

    def _loop(self) -> None:
        try:
            while True:
                item = self._calls.get()
                if item is None:
                    return
                call, done, raised = item
                try:
                    call()
                except BaseException as e:  # handed to the waiting worker
                    raised.append(e)
                finally:
                    done.set()
        finally:
            handlers.close_loop()  # a coroutine handler's event loop, if it made one
