"""Django's task framework, whichever the project has: `django.tasks` (Django 6, DEP 0014) or
the `django-tasks` backport (Django 5: `django_tasks`, the same API under other names). The
backend and the runner import it from here only."""

from __future__ import annotations

try:  # Django 6
    from django.tasks import TaskContext, TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
except ImportError:  # Django 5 with the backport
    try:
        from django_tasks import TaskContext, TaskResult, TaskResultStatus
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json
    except ImportError:
        raise ImportError("notifyq.contrib.django.tasks needs Django's task framework: Django 6, "
                          "or Django 5 with the backport (pip install django-tasks)") from None

    FRAMEWORK = "django_tasks"

__all__ = ["FRAMEWORK", "BaseTaskBackend", "InvalidTask", "Task", "TaskContext", "TaskError", "TaskResult",
           "TaskResultDoesNotExist", "TaskResultStatus", "normalize_json", "task_enqueued", "task_finished",
           "task_started"]
