"""Job retry policy: a pure function from attempts made to the delay before the next one."""

from __future__ import annotations

import random


def backoff_s(attempts: int, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter: uniform(0.5, 1.0) * min(max, base * 2**(n-1)).

    Half-jitter keeps the delay growing with every attempt while spreading a burst of failures
    (a downstream outage fails thousands of jobs at once) so they do not all return together.
    """
    rng = rng or random
    ceiling = min(max_s, base_s * (2 ** max(attempts - 1, 0)))
    return ceiling * (0.5 + rng.random() / 2)


def next_delay_s(attempts: int, max_attempts: int, base_s: float, max_s: float) -> float | None:
    """None when the job is out of attempts (it becomes dead), else the delay in seconds."""
    if attempts >= max_attempts:
        return None
    return backoff_s(attempts, base_s, max_s)
