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

The holder is the server's admin, not the runtime user: the schedule's KILLs of the runtime
user's sessions never end it early. It takes a key that has claimed jobs, so that their
outcomes meet it.
"""

from __future__ import annotations

import random
import threading
import time

import MySQLdb

from notifyq.config import DSN

from .history import Fault
from .row_lock import holder_session, take_one



class KeyLocker(threading.Thread):
    """One lock: a key of `queue` with claimed jobs, its nq_flow_key row held `length_s`, then
    rolled back. `fault` is its record once taken (None: no such key was found, or the server
    was away)."""

    def __init__(self, admin: DSN, queue: str, pick: float, length_s: float):
        super().__init__(name="key-lock", daemon=True)
        self.admin, self.queue, self.length_s = admin, queue, length_s
        self.rng = random.Random(pick)
        self.fault: Fault | None = None
        self.stop = threading.Event()  # cuts the hold short (the run is being torn down)

    def run(self) -> None:
        try:
            conn = holder_session(self.admin)
        except MySQLdb.Error:
            return  # the server restarts: no lock this time
        try:
            key, start = self._take(conn)
            if key is None:
                return
            self.stop.wait(self.length_s)  # the lock's length: the fault's duration, not a wait for a state
            try:
                conn.rollback()
            except MySQLdb.Error:
                pass  # the session went (a server fault), the lock with it
            self.fault = Fault("key_lock", start, time.monotonic(), None, detail=key)
        finally:
            try:
                conn.close()
            except MySQLdb.Error:
                pass

    def _take(self, conn) -> tuple[str | None, float]:
        """Lock the row of a random key with claimed jobs (not waiting for one a claim holds)."""
        return take_one(conn, self.rng, self.stop,
                        ("SELECT DISTINCT job_key FROM nq_job WHERE queue = %s AND status = 2 "
                         "AND job_key IS NOT NULL LIMIT 20", (self.queue,)),
                        lambda key: ("SELECT job_key FROM nq_flow_key WHERE queue = %s AND job_key = %s "
                                     "FOR UPDATE SKIP LOCKED", (self.queue, key)))
