"""notifyq in a Django project: add "notifyq.contrib.django" to INSTALLED_APPS (pip install
'notifyq[django]'). See docs/django.md.

    NOTIFYQ = {"DATABASE": "default", "QUEUES": {"emails": {"max_attempts": 10}}}

- the schema is a Django migration: `manage.py migrate` (and the test database) get the tables;
- `enqueue_on_commit(queue, payload, ...)` puts a job in the current transaction of Django's
  connection, and wakes the consumers when that transaction commits;
- `manage.py notifyq consume ...` (and every other notifyq command) runs with the database of
  settings.NOTIFYQ["DATABASE"], handlers inside Django's connection hygiene;
- `notifyq.contrib.django.tasks.NotifyqBackend` is a backend of Django's task framework
  (settings.TASKS; tasks.py, task_runner.py, task_results.py).
"""

from __future__ import annotations

from typing import Any

__all__ = ["enqueue_on_commit", "enqueue_many_on_commit", "get_config", "get_producer", "job_hygiene"]


def __getattr__(name: str) -> Any:
    # Imported on first use: INSTALLED_APPS imports this package before the settings are ready.
    if name in ("get_config",):
        from notifyq.contrib.django import conf

        return getattr(conf, name)
    if name in ("enqueue_on_commit", "enqueue_many_on_commit", "get_producer", "job_hygiene"):
        from notifyq.contrib.django import enqueue

        return getattr(enqueue, name)
    raise AttributeError(f"module 'notifyq.contrib.django' has no attribute {name!r}")
