"""Producer.result(): a handler's return value, once its job is done (docs/exactly-once.md#results).

Kept with the job's completion, on its attempt record, when the queue keeps results (keep_done,
or result_ttl_s > 0). Waiting polls the record with backoff (5 ms doubling to 0.2 s): a
result is read once, not streamed, so no wake-up machinery is spent on it. `read` is one look;
the waits around it are the caller's (a thread's sleep here, the event loop's in
AsyncProducer.result).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from notifyq import errors
from notifyq.jobs import Status
from notifyq.store import admin_queries
from notifyq.store.db import Session

POLL_FIRST_S, POLL_MAX_S = 0.005, 0.2


class Pending(errors.ResultPending):
    """`read`: not finished yet; what to raise if the wait is over."""


def read(session: Session, job_id: int) -> Any:
    """One look at job `job_id`: its result once done (None when it returned None or the queue
    keeps none). Raises Pending while it is not finished, JobFailed if it ended dead,
    InputError if it is gone otherwise (cancelled, purged, never existed)."""
    status, last_error, outcome, result = admin_queries.job_result(session, int(job_id))
    if status == Status.DONE or (status is None and outcome == "done"):
        return None if result is None else json.loads(result)
    if status == Status.DEAD:
        raise errors.JobFailed(f"job {job_id} ended dead: {last_error}")
    if status is None:
        from notifyq.ops import admin  # the wording of `no job N`, in one place

        raise errors.InputError(admin.gone(session, int(job_id)))
    raise Pending(f"job {job_id} has not finished (it is {Status(status).name.lower()})")


def next_delay(delay: float) -> float:
    return min(delay * 2, POLL_MAX_S)


def wait_for(session: Callable[[], Session], job_id: int, wait_s: float) -> Any:
    """`read` until the job finished or wait_s passed (then ResultPending)."""
    deadline = time.monotonic() + max(0.0, wait_s)
    delay = POLL_FIRST_S
    while True:
        try:
            return read(session(), job_id)
        except Pending as e:
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.ResultPending(str(e)) from None
            time.sleep(min(delay, left))  # a poll with backoff inside the caller's wait
            delay = next_delay(delay)
