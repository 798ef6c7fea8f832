"""The queues' enqueue counters (nq_signal): spread over slots, bumped by whatever makes jobs
ready (a put, a retry, a due promotion, a released workflow child), read by the watchers."""

from __future__ import annotations

import random

from notifyq.store.sql import QUERIES as Q

SIGNAL_SLOTS = 16  # enough that concurrent producers rarely share a row lock


def slot() -> int:
    """Where a bump starts looking for a slot no other transaction holds (bump_signal)."""
    return random.randrange(SIGNAL_SLOTS)


def bump(queue: str, n: int) -> tuple[str, dict]:
    """The statement that bumps a queue's counter by n, to send with others: on the first slot
    from a random one on that no other transaction holds (queries.sql, bump_signal), so that it
    never waits behind a transaction that bumped a slot and stays open (a producer stopped inside
    its put's transaction, an application's own transaction that put a job), nor deadlocks
    with a claim that holds its random slot (its acks' bump) and waits for a key row the bumping
    transaction holds (a counting claim's outcome: the claim's victim let go of its acks)."""
    return Q["bump_signal"], {"queue": queue, "slot": slot(), "n": n}


def bump_signal(cur, queue: str, n: int) -> None:
    """bump, run now."""
    cur.execute(*bump(queue, n))
