"""What a consumer process tells its observers: bounded histograms, and a snapshot of its
figures (ConsumerService.figures()), which the metrics endpoint renders without reaching into
the consumer's objects. Plain values only: a snapshot is taken on the scraper's thread and
never changes after."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

HANDLER_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
BATCH_SIZE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10000)
# From a job's due time (its enqueue's, its delay's or its retry's) to its start.
QUEUE_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400)
# A worker's counters (Stats fields), in the order the endpoint lists them.
COUNTER_NAMES = ("claimed", "succeeded", "failed", "retried", "dead", "given_back", "lost_acks", "snoozed",
                 "cancelled", "batches")


class Histogram:
    """Counts per bucket, a sum and nothing else: constant memory however long a worker runs.

    One writer (the worker thread); a scrape may read a bucket one observation behind the
    sum, which Prometheus tolerates. The +Inf bucket is derived from the counts, so it always
    equals the reported count.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Iterable[float]):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def add(self, other: "Histogram") -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.sum += other.sum

    def copy(self) -> "Histogram":
        out = Histogram(self.bounds)
        out.counts, out.sum = list(self.counts), self.sum
        return out

    def buckets(self) -> list[tuple[str, int]]:
        """Cumulative (le, count) pairs, as the exposition format wants them."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), list(self.counts)):
            total += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
        return out


# The counters also kept per task: the outcomes a job's own run decides.
TASK_COUNTERS = ("succeeded", "failed", "retried", "dead", "cancelled")
# Per worker, at most this many tasks get figures of their own: the jobs of any further task
# count under OTHER_TASK, so that a stream of task names (a payload's "task" key in a queue of
# plain handlers cannot make one: only the tasks a consumer runs are named) never grows a
# scrape without bound.
TASKS_KEPT = 100
OTHER_TASK = "(other)"
NO_TASK = ""  # jobs of plain handlers: no task label in the exposition, as before


class TaskFigures:
    """One task's share of a worker's figures (the worker's thread writes it)."""

    __slots__ = ("counters", "job_seconds", "queue_wait")

    def __init__(self) -> None:
        self.counters = dict.fromkeys(TASK_COUNTERS, 0)
        self.job_seconds = handler_seconds_histogram()
        self.queue_wait = queue_wait_histogram()

    def copy(self) -> "TaskFigures":
        out = TaskFigures()
        out.counters = dict(self.counters)
        out.job_seconds, out.queue_wait = self.job_seconds.copy(), self.queue_wait.copy()
        return out


class ByTask(dict):
    """A worker's TaskFigures by task name, bounded (TASKS_KEPT)."""

    def of(self, task: str) -> TaskFigures:
        figures = self.get(task)
        if figures is None:
            if len(self) >= TASKS_KEPT:
                task = OTHER_TASK
                figures = self.get(task)
            if figures is None:
                figures = self[task] = TaskFigures()
        return figures

    def snapshot(self) -> dict[str, TaskFigures]:
        return {task: figures.copy() for task, figures in list(self.items())}


def queue_wait_histogram() -> Histogram:
    return Histogram(QUEUE_WAIT_BUCKETS)


def handler_seconds_histogram() -> Histogram:
    return Histogram(HANDLER_SECONDS_BUCKETS)


def batch_size_histogram() -> Histogram:
    return Histogram(BATCH_SIZE_BUCKETS)


@dataclass(frozen=True)
class WorkerFigures:
    """One worker: the one running in its slot, or one it replaced (`running` False: its counts
    still count, a counter never goes down)."""

    queue: str
    shard: str  # "" on one server
    running: bool
    counters: dict[str, int]  # COUNTER_NAMES
    handler_seconds: Histogram
    batch_sizes: Histogram
    use_locks: bool = True
    busy: bool = False  # inside a handler now
    by_task: dict[str, TaskFigures] = field(default_factory=dict)  # NO_TASK for plain handlers' jobs


@dataclass(frozen=True)
class WatcherFigures:
    """One queue's watcher session of the process on one server: why its workers woke."""

    queue: str
    shard: str
    wakeups: dict[str, int]
    watching: bool


@dataclass(frozen=True)
class ServiceFigures:
    queues: tuple[str, ...]
    healthy: bool
    workers: list[WorkerFigures] = field(default_factory=list)
    watchers: list[WatcherFigures] = field(default_factory=list)
    # Per queue, summed over its schedulers: leader (0/1), enqueued, skipped, purged.
    periodic: dict[str, dict[str, int]] = field(default_factory=dict)
    reclaimed: int = 0  # by this process's reapers
    conflicts: int = 0  # transactions rerun after 1213
    # Where each queue's jobs are (the shards its consumers claim on; ("",) on one server).
    shards_of: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # SIGHUP reloads by result: "applied", "refused" (the old config running on)
    reloads: dict[str, int] = field(default_factory=dict)
