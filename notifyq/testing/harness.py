"""QueueHarness: notifyq.testing's functions bound to one test database, as the pytest fixture
`notifyq_queue` hands them over (usable from unittest too)."""

from __future__ import annotations

from typing import Any

from notifyq.config import Config
from notifyq.testing import drainer
from notifyq.testing import peek
from notifyq.testing.target import config_of


class QueueHarness:
    """`drain`, `jobs`, `assert_enqueued` and `clear` on `config`'s database."""

    def __init__(self, config: Config | str | None):
        self.config = config_of(config)

    def drain(self, queues: Any, handler: Any = None, **options: Any) -> drainer.Drained:
        return drainer.drain(self.config, queues, handler, **options)

    def jobs(self, queue: str, **options: Any) -> list[peek.QueuedJob]:
        return peek.jobs(self.config, queue, **options)

    def assert_enqueued(self, queue: str, **options: Any) -> list[peek.QueuedJob]:
        return peek.assert_enqueued(self.config, queue, **options)

    def clear(self, queues: str | list[str] | None = None) -> int:
        return peek.clear(self.config, queues)

    def __repr__(self) -> str:
        return f"<notifyq QueueHarness {self.config.dsn.masked()}>"
