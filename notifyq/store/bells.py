"""The wake-up's statements: the watcher's wait, the polling read, a ringing producer's look and
ring, and the look of a producer that interrupts the watcher's wait (instant_wake; the KILL
itself is advisory.kill_query).

A ringing producer holds one of its queue's two bells. After each COMMIT it looks (in the
COMMIT's own round trip) whether a consumer watches the queue; only then it rings: it takes the
other bell and releases the one it held, in one statement. The watcher waits on the bell it saw
held at the end of its previous statement (notifyq/wakeup says why that loses no ring).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import MySQLdb

from notifyq.store.db import Session
from notifyq.store.driver import QUERY_INTERRUPTED, error_code
from notifyq.store.locks import QueueLocks
from notifyq.store.liveness import POLLING_STALE_S
from notifyq.store.advisory import lock_wait_s
from notifyq.store.queries import ensure_queue, microseconds
from notifyq.store.sql import QUERIES as Q

RING_WAIT_S = 5  # the other bell is busy only while a watcher's statement releases its grant


@dataclass
class WatchState:
    """What one watch statement saw: the counts, the pause, the bells, the next due job."""

    total: int  # the queue's enqueue count (0 when interrupted)
    watched: int
    paused: bool
    reap: int
    due_in_s: float | None
    waited: int | None
    held: int | None  # the bell a ringer holds once the statement is done, None without a ringer
    interrupted: bool = False  # a KILL QUERY ended the wait (a wake-up, or a stop): nothing was read


def watch(session: Session, queue: str, locks: QueueLocks, wait_on: int | None, wait_s: float,
          use_bell: bool = True, on_generation: int | None = None, nap: str | None = None) -> WatchState:
    """on_generation: as advisory.get_lock's (a rerun on a newer connection does not wait).
    nap: the lock a wait without a bell waits on, if another session holds it (wakeup/nap.py)."""
    def body(cur) -> WatchState:
        wait_s_now = wait_s if on_generation in (None, session.generation) else 0.0
        try:
            cur.execute(Q["watch_bell"], {
                "queue": queue, "bell0": locks.bells[0], "bell1": locks.bells[1], "wait_on": wait_on,
                "wait_s": max(0.0, wait_s_now),
                "lock_wait_s": lock_wait_s(session, wait_s_now), "use_bell": int(use_bell), "nap": nap,
                "stale_us": microseconds(POLLING_STALE_S)})
        except MySQLdb.OperationalError as e:
            if error_code(e) != QUERY_INTERRUPTED:
                raise
            # KILL QUERY interrupted our SLEEP: a wake-up (or a stop), not an error to retry.
            return WatchState(0, 0, False, 0, None, None, None, interrupted=True)
        row = cur.fetchone()
        if row is None:  # queue row missing (a fresh database): make it and report nothing new
            ensure_queue(cur, queue)
            return WatchState(0, 0, False, 0, None, None, None)
        total, watched, paused, waited, reap, due_in_us, held = row
        return WatchState(int(total), int(watched), bool(paused), int(reap or 0),
                          None if due_in_us is None else due_in_us / 1e6,
                          None if waited is None else int(waited), None if held is None else int(held))

    return session.run(body, what="watch", wait_s=math.ceil(max(0.0, wait_s)))  # (MySQL rounds up)


def ring_look(locks: QueueLocks) -> tuple[str, dict[str, Any]]:
    """The read a ringing producer's COMMIT carries (Pipeline.commit_then_read): it returns the
    connection ids holding the watch lock, bell 0 and bell 1 (None: free)."""
    return Q["ring_look"], {"watch": locks.watch, "bell0": locks.bells[0], "bell1": locks.bells[1]}


def ring(session: Session, locks: QueueLocks, held: int) -> None:
    """Take the other bell, release bell `held`, without waiting for the reply (Pipeline.send_later:
    the reply is read before the session's next statement). The next look says whether it rang."""
    session.pipeline.send_later(Q["ring"], {"next": locks.bells[1 - held], "held": locks.bells[held],
                                            "wait_s": RING_WAIT_S})


def ring_if_watched(session: Session, locks: QueueLocks, on_reply: Callable[[int], None]) -> None:
    """Ring if a consumer watches, the look and the ring in one statement, without waiting for
    the reply (Pipeline.send_later): `on_reply` gets its code (ring_if_watched's) when the reply
    is read, before the session's next statement."""
    session.pipeline.send_later(Q["ring_if_watched"], {"watch": locks.watch, "bell0": locks.bells[0],
                                                       "bell1": locks.bells[1], "wait_s": RING_WAIT_S},
                                on_row=lambda row: on_reply(-1 if row is None or row[0] is None else int(row[0])))


def poll_signal(session: Session, queue: str) -> tuple[int, bool, float | None, bool]:
    """The polling fallback's read: (enqueue count, paused, seconds until the earliest scheduled
    job or None, whether a reap is needed)."""
    def body(cur):
        cur.execute(Q["poll_signal"], {"queue": queue, "stale_us": microseconds(POLLING_STALE_S)})
        total, paused, due_in_us, reap = cur.fetchone()
        return int(total), bool(paused), None if due_in_us is None else due_in_us / 1e6, bool(reap)

    return session.run(body, what="poll signal")


def instant_look(locks: QueueLocks) -> tuple[str, dict[str, Any]]:
    """The read an instant wake's COMMIT carries (Pipeline.commit_then_read): the connection id
    holding the watch lock (None: nobody watches) and this session's own id as the server knows
    it (a proxy's handshake gives another). The KILL it may lead to: advisory.kill_query."""
    return Q["lock_holder_and_me"], {"name": locks.watch}
