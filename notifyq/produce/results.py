"""Producer.result(): a handler's return value, once its job is done (docs/exactly-once.md#results).

Kept with the job's completion, on its attempt record, when the queue keeps results (keep_done,
or result_ttl_s > 0). Waiting polls the record with backoff (5 ms doubling to 0.2 s): a
result is read once, not streamed, so no wake-up machinery is spent on it.
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


def wait_for(session: Callable[[], Session], job_id: int, wait_s: float) -> Any:
    """The result of job `job_id` (None when it returned None or the queue keeps none). Raises
    ResultPending if it is not done within wait_s, JobFailed if it ended dead, InputError if it
    is gone otherwise (cancelled, purged, never existed)."""
    deadline = time.monotonic() + max(0.0, wait_s)
    delay = POLL_FIRST_S
    while True:
        status, last_error, outcome, result = admin_queries.job_result(session(), int(job_id))
        if status == Status.DONE or (status is None and outcome == "done"):
            return None if result is None else json.loads(result)
        if status == Status.DEAD:
            raise errors.JobFailed(f"job {job_id} ended dead: {last_error}")
        if status is None:
            from notifyq.ops import admin  # the wording of `no job N`, in one place

            raise errors.InputError(admin.gone(session(), int(job_id)))
        left = deadline - time.monotonic()
        if left <= 0:
            raise errors.ResultPending(f"job {job_id} has not finished (it is "
                                       f"{Status(status).name.lower()})")
        time.sleep(min(delay, left))  # a poll with backoff inside the caller's wait
        delay = min(delay * 2, POLL_MAX_S)
