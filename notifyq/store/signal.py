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


def bump_free_slot(cur, queue: str, n: int) -> None:
    """bump_signal on a slot that no other transaction holds (signal_free_slot), for a reaper's
    take-back, which must not wait behind a producer stopped inside its transaction; a random one
    (which may wait) only when every slot row there is is held, or none exists yet."""
    cur.execute(Q["signal_free_slot"], {"queue": queue})
    row = cur.fetchone()
    if row is None:
        bump_signal(cur, queue, n)
    else:
        cur.execute(Q["bump_signal"], {"queue": queue, "slot": row[0], "n": n})
