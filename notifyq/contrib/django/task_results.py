"""A Django TaskResult from what notifyq keeps of a job: its row (status, times, payload) and
its attempt records (nq_attempt: each run's consumer, times, error, traceback, result).

    ready, scheduled      READY       (also a failed run waiting for its retry)
    claimed               RUNNING
    done                  SUCCESSFUL  return_value: the last record's result
    dead, cancelled       FAILED      errors: one TaskError per failed run, oldest first
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from notifyq.contrib.django.task_api import TaskError, TaskResult, TaskResultStatus
from notifyq.jobs import Status

STATUSES = {Status.READY: TaskResultStatus.READY, Status.SCHEDULED: TaskResultStatus.READY,
            Status.CLAIMED: TaskResultStatus.RUNNING, Status.DONE: TaskResultStatus.SUCCESSFUL,
            Status.DEAD: TaskResultStatus.FAILED, Status.CANCELLED: TaskResultStatus.FAILED}
FAILED_RUNS = ("failed", "dead")  # records of a run that raised (or timed out, or was failed)
# records of a run a worker made: also one snoozed (job.snooze), taken back (its consumer died
# or its lease ran out) or interrupted (its consumer's shutdown), which raised nothing: among the
# runs, not the errors
RAN = ("done", "failed", "dead", "cancelled", "snoozed", "taken back", "interrupted")

# The last line of a traceback, as traceback.format_exception_only writes it: the exception's
# class (module-qualified unless builtin), then ": message" if it has one.
_EXCEPTION_LINE = re.compile(r"([A-Za-z_][\w.]*)(?::|$)")


def task_result(task: Any, job_id: int, row: dict[str, Any], records: list[dict[str, Any]], backend: str,
                args: list[Any], kwargs: dict[str, Any]) -> TaskResult:
    """The TaskResult of job `job_id` for `task` (already set to the job's queue and priority),
    from its row (job_get's columns by name) and its attempt records (oldest first)."""
    status = STATUSES[Status(row["status"])]
    finished = status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
    ran = [r for r in records if r["outcome"] in RAN and r["started_at"] is not None]
    worker_ids = [r["consumer"] or "" for r in ran]
    starts = [r["started_at"] for r in ran]
    if status == TaskResultStatus.RUNNING:
        worker_ids.append(row["owner"] or "")
        starts.append(row["claimed_at"])
    result = TaskResult(
        task=task, id=str(job_id), status=status, enqueued_at=utc(row["created_at"]),
        started_at=utc(starts[0]) if starts else None,
        finished_at=utc(row["finished_at"]) if finished else None,
        last_attempted_at=utc(starts[-1]) if starts else None,
        args=args, kwargs=kwargs, backend=backend,
        errors=[task_error(r["error"], r["traceback"]) for r in records if r["outcome"] in FAILED_RUNS],
        worker_ids=worker_ids)
    if status == TaskResultStatus.SUCCESSFUL:
        done = [r for r in records if r["outcome"] == "done"]
        kept = done[-1]["result"] if done else None
        object.__setattr__(result, "_return_value", None if kept is None else json.loads(kept))
    return result


def task_error(error: str | None, traceback: str | None) -> TaskError:
    """A failed run's TaskError: the exception's class from its traceback's last line (the
    record's error, `Name: message`, when the traceback is missing or was cut short)."""
    return TaskError(exception_class_path=exception_class_path(traceback, error), traceback=traceback or error or "")


def exception_class_path(traceback: str | None, error: str | None) -> str:
    for text in ((traceback or "").strip().splitlines()[-1:] + [error or ""]):
        found = _EXCEPTION_LINE.match(text.strip())
        name = found.group(1) if found and not text.startswith(" ") else ""
        if "." in name:
            return name
        if name[:1].isupper():  # a builtin's (`ValueError: ...`), not notifyq's own words
            return f"builtins.{name}"
    return "builtins.Exception"  # a run failed by notifyq itself with no exception (a command's exit)


def utc(value: dt.datetime | None) -> dt.datetime | None:
    """notifyq's times are UTC, stored without a zone."""
    if value is None:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
