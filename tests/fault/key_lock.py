"""The `key_lock` class: a consumer stopped in the middle of a claim of a limited queue, as the
queue's key rows see it: another session holds a busy key's nq_flow_key row (FOR UPDATE, as a
claim's KeyGate holds it until its COMMIT) for longer than the lease, then lets it go.

Claims pass over a held key (SKIP LOCKED). An outcome of a job of that key that is running (its
ack, failure or give-back: they take the job off its key's running count first) waits for the
row. It once waited with the job's own row unlocked: a finished job whose ack waited past its
lease was taken back by a reaper (uncharged) and ran again on another consumer, its attempt
repeated, while its own consumer was healthy (the checker's run_twice and attempts; the stall
class made it, rarely, when it stopped a consumer inside a claim). The lock is no fault of
either consumer, so it excuses no second run; it is recorded (with pid None) as a fault of
nobody's, so that the checker's no_progress rule lets the fleet wait for the held key.

While it holds the row the holder looks, every WAIT_LOOK_S (row_lock.LockHolder._watch), for a
transaction waiting for its lock, and records the spans it saw one (History.key_locks): a
worker whose claim carries an ack of the key's job waits there with the jobs it would claim,
and if it is the one idle watcher the fleet runs nothing meanwhile. The checker's locked_pickup
rule counts such a span as work, not idleness (an outcome waiting on a key row), and nothing
else of the hold.

The holder is the server's admin, not the runtime user: the schedule's KILLs of the runtime
user's sessions never end it early. It takes a key that has claimed jobs, so that their
outcomes meet it.
"""

from __future__ import annotations

import time

import MySQLdb

from notifyq.config import DSN

from .history import Fault, KeyLock
from .row_lock import LockHolder, take_one


class KeyLocker(LockHolder):
    """One lock: a key of `queue` with claimed jobs, its nq_flow_key row held `length_s`, then
    rolled back. `lock` is its KeyLock once taken (None: no such key was found, or the server
    was away)."""

    def __init__(self, admin: DSN, deploy: str, queue: str, pick: float, length_s: float):
        super().__init__("key-lock", admin, deploy, queue, pick, length_s)

    @property
    def fault(self) -> Fault | None:
        """The lock as a fault of nobody's (the no_progress rule's excuse)."""
        lock = self.lock
        return None if lock is None else Fault("key_lock", lock.start, lock.end, None, detail=lock.key)

    def _hold(self, conn, key: str, start: float) -> KeyLock:
        waits = self._watch(conn, start + self.length_s)
        try:
            conn.rollback()
        except MySQLdb.Error:
            pass  # the session went (a server fault), the lock with it
        end = time.monotonic()
        return KeyLock(self.deploy, key, start, end, tuple((a, end if b is None else b) for a, b in waits))

    def _take(self, conn) -> tuple[str | None, float]:
        """Lock the row of a random key with claimed jobs (not waiting for one a claim holds)."""
        return take_one(conn, self.rng, self.stop,
                        ("SELECT DISTINCT job_key FROM nq_job WHERE queue = %s AND status = 2 "
                         "AND job_key IS NOT NULL LIMIT 20", (self.queue,)),
                        lambda key: ("SELECT job_key FROM nq_flow_key WHERE queue = %s AND job_key = %s "
                                     "FOR UPDATE SKIP LOCKED", (self.queue, key)))
