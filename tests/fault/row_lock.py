"""The `row_lock` class: an application that holds a ready job's row for a while, as a mysql
client's BEGIN; SELECT ... FOR UPDATE (or a report's locking read) does, then rolls back.

A claim skips a row another session holds (SKIP LOCKED), as it skips a peer's claim under way.
Once, an idle watcher's empty claim then took the queue for watched and nothing woke a
consumer for that job again until the watcher's safety claim (a minute); now the watcher
claims again after waits that grow up to wakeup.poll_max_s. The checker's `locked_pickup` rule
wants each such job claimed within about that of the lock's end (History.row_locks).

The application is the server's admin, not the runtime user: the schedule's KILLs of the
runtime user's sessions (kill_connection, kill_query) never end its lock early. It locks jobs
without a key only: a keyed job may wait after the lock for its key's limit, by design.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable

import MySQLdb

from notifyq.config import DSN

from .history import RowLock

FIND_S = 2.0  # how long a lock looks for a ready job (the queue drains fast: they come and go)
FIND_EVERY_S = 0.02
CANDIDATES = 200
READY = 0
WAIT_LOOK_S = 0.05  # how often a holder looks for a transaction waiting for its lock
# The transactions waiting for a lock the holder's own transaction holds (InnoDB's view)
WAITERS = ("SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS w JOIN information_schema.INNODB_TRX t "
           "ON t.trx_id = w.blocking_trx_id WHERE t.trx_mysql_thread_id = CONNECTION_ID()")


class LockHolder(threading.Thread):
    """One lock of an outside session (row_lock's, key_lock's): taken by _take (None: nothing
    found, or the server was away), held and rolled back by _hold, which returns its record
    (`lock`, None until then)."""

    def __init__(self, name: str, admin: DSN, deploy: str, queue: str, pick: float, length_s: float):
        super().__init__(name=name, daemon=True)
        self.admin, self.deploy, self.queue, self.length_s = admin, deploy, queue, length_s
        self.rng = random.Random(pick)
        self.lock: Any = None
        self.stop = threading.Event()  # cuts the hold short (the run is being torn down)

    def run(self) -> None:
        try:
            conn = holder_session(self.admin)
        except MySQLdb.Error:
            return  # the server restarts: no lock this time
        try:
            taken, start = self._take(conn)
            if taken is not None:
                self.lock = self._hold(conn, taken, start)
        finally:
            try:
                conn.close()
            except MySQLdb.Error:
                pass

    def _take(self, conn) -> tuple[Any, float]:
        raise NotImplementedError

    def _hold(self, conn, taken: Any, start: float) -> Any:
        raise NotImplementedError

    def _watch(self, conn, until: float) -> list[tuple[float, float | None]]:
        """Hold the lock until `until` (or the stop), looking for waiters every WAIT_LOOK_S: the
        spans in which one was seen, each from the first look that saw one to the first that
        saw none (None: still seen at the last look). A look the server does not answer ends
        the hold: the session went, its lock with it."""
        waits: list[tuple[float, float | None]] = []
        cur = conn.cursor()
        while not self.stop.is_set() and (now := time.monotonic()) < until:
            try:
                cur.execute(WAITERS)
                waiting = int(cur.fetchone()[0]) > 0
            except MySQLdb.Error:
                break
            seen = time.monotonic()
            if waiting and (not waits or waits[-1][1] is not None):
                waits.append((seen, None))
            elif not waiting and waits and waits[-1][1] is None:
                waits[-1] = (waits[-1][0], seen)
            # the lock's length is the fault's duration; this wait paces the looks, it waits for no state
            self.stop.wait(min(WAIT_LOOK_S, max(0.0, until - now)))
        return waits


class RowLocker(LockHolder):
    """One lock: find a ready job of `queue` without a key, hold its row `length_s`, roll back.
    `lock` is its RowLock once taken (None: no ready job was found, or the server was away)."""

    def __init__(self, admin: DSN, deploy: str, queue: str, pick: float, length_s: float):
        super().__init__("row-lock", admin, deploy, queue, pick, length_s)

    def _hold(self, conn, job: int, start: float) -> RowLock:
        self.stop.wait(self.length_s)  # the lock's length: the fault's duration, not a wait for a state
        cur = conn.cursor()
        try:
            cur.execute("SELECT status FROM nq_job WHERE id = %s", (job,))
            status = int(cur.fetchone()[0])
            conn.rollback()
        except MySQLdb.Error:
            status = None  # the session went (a server fault), the lock with it, when is not known
        return RowLock(self.deploy, job, start, time.monotonic(), status)

    def _take(self, conn) -> tuple[int | None, float]:
        """Lock a random ready job's row (not waiting for one a claim holds); (its id, when)."""
        job, start = take_one(conn, self.rng, self.stop,
                              ("SELECT id FROM nq_job WHERE queue = %s AND status = %s AND job_key IS NULL LIMIT %s",
                               (self.queue, READY, CANDIDATES)),
                              lambda job: ("SELECT id FROM nq_job WHERE id = %s AND status = %s FOR UPDATE SKIP LOCKED",
                                           (job, READY)))
        return (None if job is None else int(job)), start


def holder_session(admin: DSN):
    """A lock holder's session: the server's admin (the schedule's KILLs of the runtime user's
    sessions never end its lock early), autocommit until it locks, READ COMMITTED."""
    args = admin.connect_args()
    args["database"] = admin.database
    conn = MySQLdb.connect(**args, autocommit=True, connect_timeout=2, read_timeout=10)
    conn.query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn


def take_one(conn, rng: random.Random, stop: threading.Event, find: tuple[str, tuple],
             lock: Callable[[Any], tuple[str, tuple]]) -> tuple[Any, float]:
    """Look for candidates (`find`) for up to FIND_S, lock a random one with `lock(candidate)`
    (a locking read that skips what a claim holds) and leave its transaction open: (the locked
    row's first column, when), or (None, 0.0) if none was locked or the server went."""
    deadline = time.monotonic() + FIND_S
    cur = conn.cursor()
    while time.monotonic() < deadline and not stop.is_set():
        try:
            conn.autocommit(True)
            cur.execute(*find)
            found = [value for (value,) in cur.fetchall()]
            if found:
                conn.autocommit(False)
                cur.execute(*lock(rng.choice(found)))
                row = cur.fetchone()
                if row is not None:
                    return row[0], time.monotonic()
                conn.rollback()
        except MySQLdb.Error:
            return None, 0.0
        stop.wait(FIND_EVERY_S)  # the look's pace, not a synchronisation
    return None, 0.0
