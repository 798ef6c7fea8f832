"""A worker's counters, and the --max-jobs budget its process shares across workers."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from notifyq.figures import ByTask, Histogram, batch_size_histogram, handler_seconds_histogram


@dataclass
class Stats:
    """Counters of one worker; the supervisor sums them (each has a single writer)."""

    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    cancelled: int = 0  # ended cancelled: their cancel was requested while they ran (not failed)
    lost_acks: int = 0
    given_back: int = 0
    snoozed: int = 0  # put back for later by the handler (job.snooze, notifyq.Snooze): no attempt spent
    reclaimed: int = 0
    batches: int = 0
    # Bounded: bucket counts, not every observation (a long-lived worker's lists never stopped growing).
    batch_sizes: Histogram = field(default_factory=batch_size_histogram)
    handler_seconds: Histogram = field(default_factory=handler_seconds_histogram)
    # Per task (figures.TaskFigures): the outcomes, each job's run time and its wait in the queue
    by_task: ByTask = field(default_factory=ByTask)


class Budget:
    """--max-jobs across all workers of a process."""

    def __init__(self, limit: int | None):
        self.left = limit
        self._lock = threading.Lock()

    def take(self, n: int) -> int:
        if self.left is None:
            return n
        with self._lock:
            granted = min(n, self.left)
            self.left -= granted
            return granted

    @property
    def exhausted(self) -> bool:
        return self.left is not None and self.left <= 0
