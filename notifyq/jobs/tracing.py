"""The tracing hook: where an installed tracer (notifyq.contrib.otel.instrument()) plugs into
the enqueue and the run, and nothing else. Ground floor, no import of any tracing library: the
core reads `HOOK` once per put and once per handler call, and goes its usual way while it is
None (the extra not installed, or not instrumented).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from notifyq.jobs import Job


class Tracer(Protocol):
    def send(self, queue: str, count: int, server: tuple[str, int | None],
             write: Callable[[str | None], list[int]]) -> list[int]:
        """An enqueue of `count` jobs on `queue`: write(context) stores them, each with
        `context` (envelope.context_text's JSON, or None for none) and returns their ids."""
        ...

    def process(self, queue: str, jobs: list["Job"], call: Callable[[], None]) -> None:
        """One handler call on `jobs` (their trace contexts: run_of(job).trace); call() runs
        it, each job's outcome left on it (job.error, job.exception)."""
        ...


HOOK: Tracer | None = None


def install(tracer: Tracer | None) -> None:
    """Set (or with None, clear) the hook: from notifyq.contrib.otel."""
    global HOOK
    HOOK = tracer
