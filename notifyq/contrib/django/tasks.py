"""notifyq as a backend of Django's task framework (Django 6's `django.tasks`, DEP 0014; Django
5 with the `django-tasks` backport). See docs/django.md#djangos-task-framework.

    TASKS = {"default": {"BACKEND": "notifyq.contrib.django.tasks.NotifyqBackend",
                         "QUEUES": ["default", "emails"],
                         "OPTIONS": {"DATABASE": "default", "ENQUEUE_ON_COMMIT": True}}}

- `task.enqueue()` puts a job on the queue of the task's `queue_name`, in the current
  transaction of Django's connection (ENQUEUE_ON_COMMIT, the default: the job is stored if and
  only if that transaction commits, and the consumers are woken when it does), or at once on
  notifyq's own session (ENQUEUE_ON_COMMIT False). Priority is notifyq's (the same order:
  higher first; Django's -100..100 lies inside notifyq's range), `run_after` its run_at.
- `get_result(id)` reads the job's row and attempt records (on Django's connection: a job put
  in the caller's transaction is seen there before it commits).
- `manage.py notifyq consume -q QUEUE` runs the jobs (task_runner.run, the default handler of
  the backend's queues; they keep their finished jobs, `keep_done`, so results stay readable
  until `retention_s`).
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from notifyq import errors
from notifyq.config import validate_queue_name
from notifyq.jobs import envelope
from notifyq.contrib.django import task_results
from notifyq.contrib.django.conf import database_alias
from notifyq.contrib.django.enqueue import get_producer
from notifyq.contrib.django.task_api import (BaseTaskBackend, InvalidTask, Task, TaskResult, TaskResultDoesNotExist,
                                             TaskResultStatus, normalize_json, task_enqueued)
from notifyq.produce import conns
from notifyq.store import admin_queries

PAYLOAD_KEY = "django_task"  # a job's payload: {"django_task": PATH, "args": [...], "kwargs": {...}, "backend": ALIAS}
OPTIONS = ("DATABASE", "ENQUEUE_ON_COMMIT")


class NotifyqBackend(BaseTaskBackend):
    supports_defer = True  # run_after: the job's run_at
    supports_async_task = True  # a coroutine task runs through async_to_sync in the consumer
    supports_get_result = True  # from the job's row and attempt records
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']: unknown key(s) {', '.join(map(str, unknown))} "
                                       f"(known: {', '.join(OPTIONS)})")
        self.database = self.options.get("DATABASE")  # None: NOTIFYQ["DATABASE"], asked when used
        self.enqueue_on_commit = self.options.get("ENQUEUE_ON_COMMIT", True)
        if not isinstance(self.enqueue_on_commit, bool):
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']['ENQUEUE_ON_COMMIT']: expected True or "
                                       f"False, got {self.enqueue_on_commit!r}")
        for queue in self.queues:
            try:
                _notifyq_queue(queue)
            except InvalidTask as e:
                raise ImproperlyConfigured(f"TASKS[{alias!r}]['QUEUES']: {e}") from None

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        _notifyq_queue(task.queue_name)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        payload = {PAYLOAD_KEY: task.module_path, "args": args, "kwargs": kwargs, "backend": self.alias}
        alias = self.database or database_alias()
        producer = get_producer(task.queue_name, alias)
        run_at = task.run_after
        if run_at is not None and timezone.is_naive(run_at):  # USE_TZ = False: the project's local time
            run_at = timezone.make_aware(run_at)
        options = {"priority": int(task.priority), "run_at": run_at}  # Django allows 5.0
        if self.enqueue_on_commit:
            job_id = producer.put(payload, conn=connections[alias], **options)
            transaction.on_commit(producer.wake, using=alias)
        else:
            job_id = producer.put(payload, **options)  # the producer's own session: committed now
        result = TaskResult(task=task, id=str(job_id), status=TaskResultStatus.READY, enqueued_at=timezone.now(),
                            started_at=None, finished_at=None, last_attempted_at=None, args=args, kwargs=kwargs,
                            backend=self.alias, errors=[], worker_ids=[])
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        text = str(result_id)
        if not text.isascii() or not text.isdigit():
            raise TaskResultDoesNotExist(f"no task result {result_id!r}: notifyq's ids are job ids")
        job_id = int(text)
        raw = conns.dbapi(connections[self.database or database_alias()])
        cur = raw.cursor()
        try:
            row, records = admin_queries.job_with_attempts(cur, job_id)
        finally:
            cur.close()
        payload = _payload(row["payload"]) if row is not None else None
        if payload is None:
            raise TaskResultDoesNotExist(_gone(job_id, row, records))
        task = task_named(payload[PAYLOAD_KEY]).using(priority=row["priority"], queue_name=row["queue"],
                                                      backend=self.alias)
        return task_results.task_result(task, job_id, row, records, self.alias, payload["args"], payload["kwargs"])


def task_named(path: Any) -> Task:
    """The Task a job names: a module-level Task of one of the project's INSTALLED_APPS (a job's
    payload never makes a process import a module outside them)."""
    if not isinstance(path, str) or not any(path.startswith(f"{app.name}.") for app in apps.get_app_configs()):
        raise UnknownDjangoTask(f"the job names {path!r}, which is not in one of INSTALLED_APPS")
    try:
        found = import_string(path)
    except ImportError as e:
        raise UnknownDjangoTask(f"the job names {path!r}, which cannot be imported: {e}") from None
    if not isinstance(found, Task):
        raise UnknownDjangoTask(f"the job names {path!r}, which is not a task (no @task on it)")
    return found


class UnknownDjangoTask(errors.NotifyqError):
    """A job that names no task of the project."""


def is_task_payload(payload: Any) -> bool:
    return (isinstance(payload, dict) and isinstance(payload.get(PAYLOAD_KEY), str)
            and isinstance(payload.get("args"), list) and isinstance(payload.get("kwargs"), dict))


def _payload(text: str | bytes) -> dict[str, Any] | None:
    try:  # the payload as put: a traced enqueue's envelope opened (notifyq/jobs/envelope.py)
        payload = envelope.opened(text.decode() if isinstance(text, bytes) else text)[0]
    except ValueError:
        return None
    return payload if is_task_payload(payload) else None


def _gone(job_id: int, row: dict[str, Any] | None, records: list[dict[str, Any]]) -> str:
    if row is not None:
        return f"job {job_id} is not a Django task's"
    if records:
        return (f"job {job_id} ended ({records[-1]['outcome']} at {records[-1]['ended_at']}) and its row is gone "
                "(purged by retention_s, or keep_done turned off for its queue)")
    return f"no job {job_id}"


def _notifyq_queue(name: str) -> str:
    try:
        return validate_queue_name(name)
    except errors.NotifyqError as e:
        raise InvalidTask(f"queue_name {name!r}: {e}") from None
