"""The consumer's side of Django's task framework: `run`, the handler of a NotifyqBackend's
queues (`manage.py notifyq consume -q QUEUE`, where it is the queues' default handler), runs
the task a job names with its arguments, and sends Django's task_started / task_finished.

Its return value is the job's result (kept: the backend's queues keep their finished jobs); an
exception fails the job, which notifyq retries up to the queue's max_attempts (each failed
run is one of the TaskResult's errors)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from notifyq.contrib.django import task_results
from notifyq.contrib.django.task_api import (TaskContext, TaskError, TaskResult, TaskResultStatus, normalize_json,
                                             task_finished, task_started)
from notifyq.contrib.django.tasks import PAYLOAD_KEY, UnknownDjangoTask, is_task_payload, task_named
from notifyq.jobs import Job


def run(job: Job) -> Any:
    if not is_task_payload(job.payload):
        raise UnknownDjangoTask("the job is not a Django task's: its payload is not "
                                f'{{"{PAYLOAD_KEY}": PATH, "args": [...], "kwargs": {{...}}}}')
    payload = job.payload
    task = task_named(payload[PAYLOAD_KEY])
    started = timezone.now()
    result = TaskResult(task=task, id=str(job.id), status=TaskResultStatus.RUNNING,
                        enqueued_at=task_results.utc(job.created_at), started_at=started, finished_at=None,
                        last_attempted_at=started, args=payload["args"], kwargs=payload["kwargs"],
                        backend=payload.get("backend") or task.backend, errors=[],
                        # this run is the job's attempts-th (TaskContext.attempt)
                        worker_ids=[""] * (job.attempts - 1) + ["notifyq"])
    task_started.send(sender=type(task.get_backend()), task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
        else:
            value = task.call(*result.args, **result.kwargs)
        value = normalize_json(value)
    except BaseException as e:
        _finished(result, TaskResultStatus.FAILED, e)
        raise
    _finished(result, TaskResultStatus.SUCCESSFUL)
    return value


def _finished(result: TaskResult, status: TaskResultStatus, exception: BaseException | None = None) -> None:
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    if exception is not None:
        import traceback

        kind = type(exception)
        result.errors.append(TaskError(exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                                       traceback="".join(traceback.format_exception(exception))))
    # Sent inside the except block for a failure: Django's receiver logs it with exc_info.
    task_finished.send(sender=type(result.task.get_backend()), task_result=result)
