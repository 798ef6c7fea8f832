"""The `signal_gap` class: an outside application holds a gap lock on nq_signal's key range for a
few seconds, as a report's or a mysql client's locking read of a queue that does not exist
does under REPEATABLE READ (the read finds nothing and locks the gap where that queue's rows
would go), then rolls back.

Every INSERT into that gap waits for it: a new queue's 16 signal slot rows, and the one a put
on a new queue makes for its bump. What notifyq says it does then (notifyq/store/slot_rows.py,
docs/how-it-works.md): making the slot rows is best effort, given up after about a second with
one warning; a consumer's registration on a new queue still completes; a put on a new queue
waits for the lock as any INSERT there does and returns once it goes (the hold is shorter than
the lock wait timeout); traffic on the live queues (their bumps update rows that exist) goes on.

So each hold, once its lock is taken, puts one job on a queue that did not exist (a thread:
when the put began, when it returned, what it raised) and the harness starts a
`consume --exit-when-empty` on another new queue as the hold begins: it must register and exit
0 by itself. The checker's `signal_gap` rule judges both. The new queues sort after the live one
(fq) and after every earlier hold's, so their rows go in the gap the hold locks; nothing
consumes the put's job: the harness deletes the class's jobs before the drain (GAP_QUEUES).

The holder is the server's admin, as the other lock holders: the schedule's KILLs of the runtime
user's sessions never end its lock early. Its lock holds up no job of the live queues, so it is
no fault of anyone's and excuses nothing.
"""

from __future__ import annotations

import threading
import time

import MySQLdb

from notifyq.config import DSN, Config
from notifyq.produce.producer import Producer

from .history import GapPut, SignalGap
from .row_lock import LockHolder, holder_session

PREFIX = "sg"  # the class's queues: after "fq" in nq_signal's key order (utf8mb4_bin)
GAP_QUEUES = f"{PREFIX}%"  # LIKE: every queue of the class (the harness deletes their jobs)
# A locking read that finds nothing: under REPEATABLE READ it locks the gap where the row would be
LOCK_GAP = "SELECT queue, slot, seq FROM nq_signal WHERE queue = %s FOR UPDATE"
# The proof that the read locked the gap: an INSERT of the absent queue's row on another session,
# refused at once (lock wait 0, MariaDB) rather than made, and rolled back either way. (InnoDB's
# status shows the read's lock: lock_mode X on the next record, the supremum when the class's
# queues sort last; a put's INSERT waits on it as "insert intention waiting".)
PROBE = "INSERT INTO nq_signal (queue, slot, seq) VALUES (%s, 0, 0)"
LOCK_WAIT_TIMEOUT = 1205
PUT_JOIN_S = 30.0  # a put not back this long after the hold's end is recorded as such (an error)


def absent_queue(n: int) -> str:
    """The n-th hold's queue that does not exist (the locking read's): each after the last."""
    return f"{PREFIX}{n:04d}"


def put_queue(n: int) -> str:
    """The queue the n-th hold's put makes: in the gap absent_queue(n)'s read locks."""
    return absent_queue(n) + "p"


def consumer_queue(n: int) -> str:
    """The queue the n-th hold's `consume --exit-when-empty` registers on: in the same gap."""
    return absent_queue(n) + "c"


class GapPutter(threading.Thread):
    """One put of one job on `queue` (a new one), on a producer of its own; `put` is its GapPut
    once it returned or raised."""

    def __init__(self, config: Config, queue: str):
        super().__init__(name="signal-gap-put", daemon=True)
        self.config, self.queue = config, queue
        self.put: GapPut | None = None

    def run(self) -> None:
        start, error = time.monotonic(), ""
        try:
            with Producer(self.queue, self.config) as producer:
                producer.put({"s": 0})
        except Exception as e:  # noqa: BLE001 - any error is the record's, the checker judges it
            error = f"{type(e).__name__}: {e}"[:300]
        self.put = GapPut(self.queue, start, time.monotonic(), error)


class GapHolder(LockHolder):
    """One hold: the gap of absent_queue(n) in nq_signal locked `length_s`, a put on
    put_queue(n) made meanwhile, then rolled back. `lock` is its SignalGap once taken (None:
    the server was away)."""

    def __init__(self, admin: DSN, deploy: str, config: Config, n: int, pick: float, length_s: float):
        super().__init__("signal-gap", admin, deploy, absent_queue(n), pick, length_s)
        self.config, self.n = config, n
        self.consumer: int | None = None  # the harness's `consume --exit-when-empty` (its pid)

    def _take(self, conn) -> tuple[bool | None, float]:
        """The locking read, its transaction left open: (whether it locked the gap, when)."""
        cur = conn.cursor()
        try:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            conn.autocommit(False)
            cur.execute(LOCK_GAP, (self.queue,))
            cur.fetchall()
        except MySQLdb.Error:
            return None, 0.0
        return self._probe(), time.monotonic()

    def _probe(self) -> bool:
        """Whether an INSERT of the absent queue's row is refused (PROBE): the gap is locked."""
        try:
            probe = holder_session(self.admin)
        except MySQLdb.Error:
            return False
        try:
            probe.autocommit(False)
            cur = probe.cursor()
            cur.execute("SET SESSION innodb_lock_wait_timeout = 0")
            cur.execute(PROBE, (self.queue,))
            return False
        except MySQLdb.OperationalError as e:
            return e.args[0] == LOCK_WAIT_TIMEOUT
        except MySQLdb.Error:
            return False
        finally:
            try:
                probe.rollback()
                probe.close()
            except MySQLdb.Error:
                pass

    def _hold(self, conn, gap: bool, start: float) -> SignalGap:
        putter = GapPutter(self.config, put_queue(self.n))
        putter.start()
        self.stop.wait(max(0.0, start + self.length_s - time.monotonic()))  # the fault's duration, no state
        try:
            conn.rollback()
        except MySQLdb.Error:
            pass  # the session went (a server fault), the lock with it
        end = time.monotonic()
        putter.join(PUT_JOIN_S)
        put = putter.put or GapPut(putter.queue, start, time.monotonic(), f"not back {PUT_JOIN_S:g} s after the hold")
        return SignalGap(self.deploy, self.queue, start, end, gap, (put,), self.consumer)
