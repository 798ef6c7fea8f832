"""`notifyq produce`: JSON lines from a stream, enqueued in batches, bad lines reported and skipped."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from notifyq import errors
from notifyq.produce.lines import ReadError


class LineProducer(Protocol):
    """What the stream needs of a producer (notifyq.Producer, or the one-server Producer)."""

    config: Any

    def line_row(self, payload: Any, priority: int, delay: float, run_at: dt.datetime | None,
                 key: str | None = None) -> tuple: ...

    def put_rows(self, rows: list[tuple]) -> list[int]: ...


@dataclass
class ProduceStats:
    lines: int = 0
    enqueued: int = 0
    rejected: int = 0
    batches: int = 0


def _batches(lines: Iterable[str], limits: Callable[[], tuple[int, float]],
             more: Callable[[float], bool]) -> Iterator[list[tuple[int, str]]]:
    """Group lines for one commit each: a line with nothing behind it is committed at once, and
    the lines that came while a commit was in flight go together in the next one.

    `more(timeout)` says whether a further line is waiting (or comes within timeout).
    `limits()` gives (max_lines, max_wait_s), asked again for every line, so a reload applies at
    once: max_wait_s > 0 holds a batch open that long after its first line for more to come.
    """
    batch: list[tuple[int, str]] = []
    opened = 0.0
    for item in enumerate(lines, 1):
        if not batch:
            opened = time.monotonic()
        batch.append(item)
        max_lines, max_wait_s = limits()
        if len(batch) >= max_lines or not more(max(0.0, opened + max_wait_s - time.monotonic())):
            yield batch
            batch = []
    if batch:
        yield batch


def produce_lines(producer: LineProducer, lines: Iterable[str], *, on_ids: Callable[[list[int]], None],
                  on_reject: Callable[[int, str, str], None], more: Callable[[float], bool],
                  priority: int = 0, delay: float = 0, run_at: dt.datetime | None = None,
                  key: str | None = None) -> ProduceStats:
    """Enqueue JSON lines until `lines` ends; bad lines are reported and skipped, good ones never lost.

    Every line `lines` yields is enqueued or rejected, also after a stop request: ending the
    stream on a stop is the reader's job (lines.LineSource), which stops reading first.
    `more` is LineSource.ready. Batch limits come from producer.config.producer, read live
    (SIGHUP reload)."""
    stats = ProduceStats()

    def limits() -> tuple[int, float]:
        return producer.config.producer.batch_lines, producer.config.producer.batch_wait_s

    try:
        for batch in _batches(lines, limits, more):
            _produce_batch(producer, batch, stats, on_ids, on_reject, priority, delay, run_at, key)
    except ReadError as e:  # the lines before it are enqueued: say how far it got
        if not stats.lines:
            raise
        raise ReadError(e.name, e.why, after_line=stats.lines, enqueued=stats.enqueued) from None
    return stats


def _produce_batch(producer: LineProducer, batch: list[tuple[int, str]], stats: ProduceStats,
                   on_ids: Callable[[list[int]], None], on_reject: Callable[[int, str, str], None],
                   priority: int, delay: float, run_at: dt.datetime | None, key: str | None) -> None:
    rows = []
    for number, line in batch:
        stats.lines += 1
        text = line.strip()
        if not text:
            continue
        try:
            row = producer.line_row(json.loads(text), priority, delay, run_at, key)
        except (ValueError, RecursionError, errors.InputError) as e:  # RecursionError: [[[[...
            stats.rejected += 1
            on_reject(number, text, str(e) if isinstance(e, errors.InputError) else f"invalid JSON: {e}")
            continue
        rows.append(row)
    if rows:
        on_ids(producer.put_rows(rows))
        stats.enqueued += len(rows)
        stats.batches += 1
