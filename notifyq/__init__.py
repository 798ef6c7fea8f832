"""notifyq: a durable job queue in MySQL 8.0+ / MariaDB 10.6+."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from notifyq.config import Config
from notifyq.config import load as load_config
from notifyq.errors import ClaimLost, NotifyqError, Snooze
from notifyq.jobs import Job, Status, cancelled

if TYPE_CHECKING:
    from notifyq.consume.service import ConsumeOptions
    from notifyq.tasks import Task, TaskRegistry, task
    from notifyq.sharding.aio import AsyncProducer
    from notifyq.sharding.service import ConsumerService
    from notifyq.sharding.producer import Producer
    from notifyq.produce.workflow import Workflow

__all__ = ["AsyncProducer", "ClaimLost", "Config", "ConsumeOptions", "ConsumerService", "Job", "NotifyqError",
           "Producer", "Snooze", "Status", "Task", "TaskRegistry", "Workflow", "cancelled", "load_config",
           "setup_logging", "task"]

# Imported on first use (PEP 562): they pull in the driver, the store and the consumer, which
# `notifyq --help`, `notifyq config` or a plain `import notifyq.config` never need.
_LAZY = {"Producer": "notifyq.sharding.producer", "AsyncProducer": "notifyq.sharding.aio",
         "task": "notifyq.tasks", "Task": "notifyq.tasks", "TaskRegistry": "notifyq.tasks",
         "setup_logging": "notifyq.logs", "ConsumeOptions": "notifyq.consume.service",
         "ConsumerService": "notifyq.sharding.service", "Workflow": "notifyq.produce.workflow"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'notifyq' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
