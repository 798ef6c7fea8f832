"""The queues' enqueue counters (nq_signal): spread over slots, bumped by whatever makes jobs
ready (a put, a retry, a due promotion, a released workflow child), read by the watchers."""

from __future__ import annotations

import random

from notifyq.store.sql import QUERIES as Q

SIGNAL_SLOTS = 16  # enough that concurrent producers rarely share a row lock


def slot() -> int:
    return random.randrange(SIGNAL_SLOTS)


def bump(queue: str, n: int) -> tuple[str, dict]:
    """The statement that bumps a queue's counter by n, to send with others."""
    return Q["bump_signal"], {"queue": queue, "slot": slot(), "n": n}


def bump_signal(cur, queue: str, n: int) -> None:
    cur.execute(*bump(queue, n))


def bump_unheld(queue: str, n: int) -> tuple[str, dict]:
    """bump() on a slot no other transaction holds (bump_signal_unheld), to send with others: for
    a transaction that must not wait behind one stopped inside its own (a limited claim, a
    reaper's take-back)."""
    return Q["bump_signal_unheld"], {"queue": queue, "slot": slot(), "n": n}


def bump_signal_unheld(cur, queue: str, n: int) -> None:
    """bump_unheld, run now (a reaper's take-back)."""
    cur.execute(*bump_unheld(queue, n))
