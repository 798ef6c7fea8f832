"""Looking at a queue without running it: the jobs it holds (`jobs`), an assertion that a job
was put (`assert_enqueued`), and the clean slate between tests (`clear`, `ensure_schema`).

`jobs(..., conn=...)` reads on the caller's connection, inside its open transaction: that is how
a Django TestCase (whose puts never commit) sees what it enqueued.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

from notifyq import errors
from notifyq.config import values
from notifyq.config import Config, validate_queue_name
from notifyq.consume.tasks import Task
from notifyq.jobs import STATUS_NAMES, Status, envelope
from notifyq.produce.conns import dbapi
from notifyq.store import schema
from notifyq.store import testing as store
from notifyq.testing.target import config_of, session_for

PENDING = (Status.READY, Status.SCHEDULED, Status.CLAIMED, Status.WAITING)  # waiting: a workflow job
_BY_NAME = {name: value for value, name in STATUS_NAMES.items()}
_ANY = object()  # assert_enqueued: this part of the job is not compared


@dataclasses.dataclass(frozen=True)
class QueuedJob:
    """A job's row as a test sees it; `payload` decoded (the stored text if it is not JSON)."""

    id: int
    queue: str
    status: str  # ready, scheduled, claimed, done, dead, cancelled
    priority: int
    run_at: dt.datetime  # UTC
    attempts: int
    max_attempts: int
    dedup_key: str | None
    payload: Any
    last_error: str | None
    created_at: dt.datetime
    key: str | None = None  # its flow-control key (put(..., key=), a task's key)

    @property
    def task(self) -> str | None:
        """The task's name, for a task's job (@notifyq.task)."""
        name = self.payload.get("task") if isinstance(self.payload, dict) else None
        return name if isinstance(name, str) else None

    @property
    def args(self) -> list:
        return list(self.payload.get("args", [])) if self.task else []

    @property
    def kwargs(self) -> dict:
        return dict(self.payload.get("kwargs", {})) if self.task else {}


def jobs(config: Config | str | None, queue: str, *, status: str | tuple[str, ...] = "pending",
         task: Task | str | None = None, conn: Any = None, limit: int = 1000) -> list[QueuedJob]:
    """The queue's jobs, oldest first: pending ones (ready, scheduled, claimed or waiting) unless `status`
    names others ("done" needs the queue's keep_done). `task`: only that task's jobs (a task or
    its name). `conn`: read on this connection (MySQLdb, Django's, SQLAlchemy's), in its current
    transaction; else on a session of notifyq's own, which sees committed jobs only."""
    queue = validate_queue_name(queue)
    statuses = _statuses(status)
    limit = values.number("limit", limit, lo=1, integer=True)
    if conn is not None:
        rows = store.jobs_on(dbapi(conn), queue, statuses, limit)
    else:
        session = session_for(config_of(config), "testing-jobs")
        try:
            rows = store.jobs(session, queue, statuses, limit)
        finally:
            session.close()
    found = [_job(r) for r in rows]
    if task is not None:
        name = _task_name(task)
        found = [j for j in found if j.task == name]
    return found


def assert_enqueued(config: Config | str | None, queue: str, *, task: Task | str | None = None,
                    payload: Any = _ANY, args: Any = _ANY, kwargs: Any = _ANY, count: int | None = None,
                    status: str | tuple[str, ...] = "pending", conn: Any = None) -> list[QueuedJob]:
    """Assert that the queue holds a job like this (by default: pending); returns the ones that
    match. `payload`, or a task's `args` and `kwargs`, are compared whole (==) when given.
    `count`: exactly that many match (0: none does). Fails with what the queue does hold."""
    if count is not None:
        count = values.number("count", count, lo=0, integer=True)
    if payload is not _ANY and (args is not _ANY or kwargs is not _ANY):
        raise errors.InputError("assert_enqueued: compare the payload, or a task's args and kwargs, not both")
    held = jobs(config, queue, status=status, conn=conn)  # all of them: the failure shows them
    name = None if task is None else _task_name(task)
    match = [j for j in held if (name is None or j.task == name) and (payload is _ANY or j.payload == payload)
             and (args is _ANY or j.args == list(args)) and (kwargs is _ANY or j.kwargs == kwargs)]
    if (count is None and match) or (count is not None and len(match) == count):
        return match
    wanted = {k: v for k, v in (("payload", payload), ("args", args), ("kwargs", kwargs)) if v is not _ANY}
    if name is not None:
        wanted = {"task": name, **wanted}
    expected = f"{count} such job(s)" if count is not None else "a job"
    lines = [f"  #{j.id} {j.status} payload={json.dumps(j.payload, default=str)[:300]}" for j in held[:20]]
    shown = "\n".join(lines) if lines else "  (none)"
    more = f"\n  ... and {len(held) - 20} more" if len(held) > 20 else ""
    raise AssertionError(f"expected {expected} on queue {queue} ({_status_text(status)}) with {wanted or 'anything'}; "
                         f"{len(match)} matched. The queue holds:\n{shown}{more}")


def clear(config: Config | str | None, queues: str | list[str] | None = None) -> int:
    """Delete the jobs (their attempt records, dedup keys and periodic ticks too) of `queues`,
    every queue's when None, and resume a paused one: a clean queue for the next test. Returns
    how many jobs were deleted. Do not point it at a database you keep."""
    names: list[str | None] = [None] if queues is None else [
        validate_queue_name(q) for q in ([queues] if isinstance(queues, str) else queues)]
    session = session_for(config_of(config), "testing-clear")
    try:
        return sum(store.clear(session, q) for q in names)
    finally:
        session.close()


def ensure_schema(config: Config | str | None) -> None:
    """notifyq's tables in the database, created or upgraded as `notifyq init` does (and the
    database too, if the user may create it); nothing to do if they are current."""
    schema.init(config_of(config).dsn, retry_s=10.0)


def _statuses(status: str | tuple[str, ...]) -> tuple[int, ...]:
    names = (status,) if isinstance(status, str) else tuple(status)
    out: list[int] = []
    for name in names:
        if name == "pending":
            out.extend(PENDING)
        elif isinstance(name, str) and name in _BY_NAME:
            out.append(_BY_NAME[name])
        else:
            raise errors.InputError(f"invalid status {values.shown(name)}: expected pending or one of "
                                    f"{', '.join(_BY_NAME)}")
    if not out:
        raise errors.InputError("no status given")
    return tuple(dict.fromkeys(out))


def _status_text(status: str | tuple[str, ...]) -> str:
    return status if isinstance(status, str) else "/".join(status)


def _task_name(task: Task | str) -> str:
    if isinstance(task, Task):
        return task.name
    if isinstance(task, str):
        return task
    raise errors.InputError(f"task: expected a task or its name, got {values.shown(task)}")


def _job(row: tuple) -> QueuedJob:
    record = dict(zip(store.JOB_FIELDS, row))
    text = record["payload"]
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    try:
        record["payload"] = envelope.opened(text)[0]  # as put: a traced job's envelope opened
    except ValueError:
        record["payload"] = text  # as stored; a consumer buries it as invalid JSON
    record["status"] = STATUS_NAMES.get(record["status"], str(record["status"]))
    return QueuedJob(**record)
