"""The consumer's periodic INFO line: what it did since the last one, and that it is alive
when it did nothing. Per-batch and per-job lines are DEBUG; this is what INFO shows of the work.

    consumer summary window_s=60 done=5230 failed=3 retried=3 dead=0 cancelled=0 rate=87.2/s
        handler_avg_ms=4.1 busy=2/4 idle=no
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from notifyq.consume.stats import Stats

log = logging.getLogger("notifyq.service")


class Summary:
    """Logs at most once per `every_s` (log.summary_s; 0 turns it off), from the workers' counters."""

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic):
        self.every_s = every_s
        self._clock = clock
        self._since = clock()
        self._last = _Totals()

    def maybe_log(self, stats: Iterable[Stats], busy: int, workers: int) -> None:
        now = self._clock()
        if self.every_s <= 0 or now - self._since < self.every_s:
            return
        totals = _Totals.of(stats)
        d = totals.minus(self._last)
        window = now - self._since
        self._since, self._last = now, totals
        avg_ms = f"{1000 * d.handler_s / d.handler_n:.1f}" if d.handler_n else "-"
        log.info("consumer summary window_s=%.0f done=%d failed=%d retried=%d dead=%d cancelled=%d rate=%.1f/s "
                 "handler_avg_ms=%s busy=%d/%d idle=%s", window, d.done, d.failed, d.retried, d.dead, d.cancelled,
                 (d.done + d.failed) / window if window > 0 else 0.0, avg_ms, busy, workers,
                 "yes" if d.claimed == 0 and busy == 0 else "no")


class _Totals:
    FIELDS = ("done", "failed", "retried", "dead", "cancelled", "claimed", "handler_s", "handler_n")

    def __init__(self, *numbers: float):
        for name, value in zip(self.FIELDS, numbers or (0,) * len(self.FIELDS)):
            setattr(self, name, value)

    @classmethod
    def of(cls, stats: Iterable[Stats]) -> "_Totals":
        t = cls()
        for s in stats:
            t.done += s.succeeded
            t.failed += s.failed
            t.retried += s.retried
            t.dead += s.dead
            t.cancelled += s.cancelled
            t.claimed += s.claimed
            t.handler_s += s.handler_seconds.sum
            t.handler_n += s.handler_seconds.count
        return t

    def minus(self, other: "_Totals") -> "_Totals":
        return _Totals(*(getattr(self, f) - getattr(other, f) for f in self.FIELDS))
