"""How idle consumers learn of new work without polling the jobs table.

Consumers of a queue that have nothing to do queue up in GET_LOCK(watch). The one holding it,
the watcher, runs one statement in a loop (sql `watch`): it reads the queue's enqueue count
(the sum of its nq_signal slots) and, only if nothing new arrived, waits inside that same
statement: in GET_LOCK on the current bell when a long-running producer holds it (the producer
releases it right after each commit), otherwise in SLEEP with exponential backoff. When the
count moved, the watcher claims a batch while still holding the watch lock; if that batch
drained the queue it records the count as watched, so the next watcher does not wake for
work already taken. Then it releases the watch lock: the next idle consumer becomes the
watcher. A burst therefore wakes consumers one after another while batches come back full,
and a single job wakes exactly one.

Wake-ups only make pick-up fast; correctness never depends on them. Every wait is bounded,
and after every wait the count is read again.

Bells: a producer ringer holds bell[b] where b is nq_queue.bell. To publish, it takes
bell[1-b], commits its jobs together with nq_queue.bell = 1-b, then releases bell[b]. A
watcher that read b before the commit is either already waiting on bell[b] (and is granted
it on release) or asks for it after the release and gets it at once; a watcher that read
after the commit sees the new count. No interleaving loses the wake-up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import MySQLdb

from notifyq import store
from notifyq.config import WakeupConfig
from notifyq.db import Session, error_code
from notifyq.locks import QueueLocks

log = logging.getLogger("notifyq.wakeup")

# Lock functions refused: Galera with wsrep_on (1235, NotSupportedError), or a proxy. Not retried.
LOCKS_UNAVAILABLE = frozenset({1235, 1105})


def locks_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, MySQLdb.NotSupportedError) or error_code(exc) in LOCKS_UNAVAILABLE


class Waiter:
    """A consumer's side of the wake-up protocol, on its dedicated lock session."""

    def __init__(self, session: Session, queue: str, locks: QueueLocks, cfg: WakeupConfig,
                 stop: threading.Event, on_turn: Callable[[], None], on_reap: Callable[[], None]):
        self.session = session
        self.queue = queue
        self.locks = locks
        self.cfg = cfg
        self.stop = stop
        self.on_turn = on_turn  # called once per loop turn: liveness for the systemd watchdog
        self.on_reap = on_reap  # the watch statement saw a dead peer or an expired lease
        self.watching = False
        self.wakeups: dict[str, int] = {"bell": 0, "signal": 0, "timeout": 0, "due": 0}
        self._last_total = -1  # polling fallback only

    # -------------------------------------------------------- the watch lock

    def acquire_watch(self) -> bool:
        """Block (bounded) until we are the watcher; False on timeout or interruption."""
        got = store.get_lock(self.session, self.locks.watch, self.cfg.idle_wait_s)
        self.watching = got == 1
        return self.watching

    def release_watch(self, drained_at: int | None) -> None:
        if drained_at is not None:
            store.mark_watched(self.session, self.queue, drained_at)
        if self.watching:
            store.release_lock(self.session, self.locks.watch)
            self.watching = False

    # -------------------------------------------------------- waiting for work

    def wait_for_work(self, safety_s: float = 60.0) -> int | None:
        """As the watcher: return the enqueue count once there is something to claim.

        Returns None when stopping. The watch statement also reports the time until the
        earliest scheduled job, which bounds the next wait. After `safety_s` of silence it
        returns anyway, so one claim checks the jobs table: a belt for the braces of a lost
        wake-up nobody foresaw.
        """
        start = time.monotonic()
        backoff = self.cfg.poll_initial_s
        due_at: float | None = None
        rang = False
        while not self.stop.is_set():
            self.on_turn()
            wait = min(backoff, self.cfg.poll_max_s)
            if due_at is not None:
                wait = max(0.0, min(wait, due_at - time.monotonic()))
            state = store.watch(self.session, self.queue, self.locks.bells, wait)
            if state.total < 0:  # interrupted by KILL QUERY
                continue
            if state.reap:
                self.on_reap()
            if not state.paused:
                if state.total > state.watched:
                    self.wakeups["bell" if rang else "signal"] += 1
                    return state.total
                if state.due_in_s is not None and state.due_in_s <= 0:
                    self.wakeups["due"] += 1
                    return state.total
            due_at = None if state.due_in_s is None else time.monotonic() + state.due_in_s
            rang = False
            if state.waited == 1:  # the bell rang: hand it straight back to its producer
                store.release_lock(self.session, self.locks.bells[state.bell])
                backoff = self.cfg.poll_initial_s
                rang = True
                continue
            if state.waited is None:  # interrupted: a stop request or an instant wake
                continue
            backoff *= 2
            if time.monotonic() - start >= safety_s:
                self.wakeups["timeout"] += 1
                return state.total
        return None

    def poll_for_work(self) -> bool:
        """Fallback without advisory locks: each idle consumer polls the signal row itself."""
        start = time.monotonic()
        backoff = self.cfg.poll_initial_s
        while not self.stop.is_set():
            self.on_turn()
            total, paused = store.poll_signal(self.session, self.queue)
            if total != self._last_total and not paused:
                self._last_total = total
                self.wakeups["signal"] += 1
                return True
            if time.monotonic() - start >= self.cfg.poll_max_s:
                return True  # no watcher to track scheduled jobs: claim once per cap instead
            self.stop.wait(min(backoff, self.cfg.poll_max_s))
            backoff *= 2
        return False


class Bell:
    """A long-running producer's side: hold a bell, ring it by releasing it after each commit."""

    def __init__(self, session: Session, queue: str, locks: QueueLocks):
        self.session = session
        self.queue = queue
        self.locks = locks
        self.held: int | None = None  # index of the bell we hold
        self._next: int | None = None
        self._generation = -1

    def arm(self, work: Session) -> bool:
        """Become this queue's ringer if none is; `work` is the producer's work session."""
        if self.session.generation != self._generation:
            self.held = None  # a new lock connection: whatever we held died with the old one
        if self.held is not None:
            return True
        try:
            if store.get_lock(self.session, self.locks.ringer, 0) != 1:
                return False  # another producer rings this queue's bells
            self._generation = self.session.generation
            bell = work.run(lambda cur: store.read_bell(cur, self.queue), what="read bell")
            if store.get_lock(self.session, self.locks.bells[bell], 5) != 1:
                store.release_lock(self.session, self.locks.ringer)
                return False
            self.held = bell
            return True
        except MySQLdb.Error as e:
            if locks_unavailable(e):
                return False
            raise

    def before_commit(self, cur) -> None:
        """Inside the jobs' transaction: take the other bell and point watchers at it."""
        if self.held is None:
            return
        other = 1 - self.held
        if self._next == other:  # the transaction is being retried: we hold it already
            store.set_bell(cur, self.queue, other)
            return
        if store.get_lock(self.session, self.locks.bells[other], 5) != 1:
            self._next = None  # a watcher sat on it too long: skip this ring, polling covers it
            return
        store.set_bell(cur, self.queue, other)
        self._next = other

    def after_commit(self) -> None:
        if self.held is None or self._next is None:
            return
        store.release_lock(self.session, self.locks.bells[self.held])  # ring
        self.held, self._next = self._next, None

    def after_rollback(self) -> None:
        if self._next is not None:
            store.release_lock(self.session, self.locks.bells[self._next])
            self._next = None

    def disarm(self) -> None:
        for name in (*self.locks.bells, self.locks.ringer):
            try:
                store.release_lock(self.session, name)
            except Exception:  # closing anyway; the server frees them with the session
                pass
        self.held = None


def instant_wake(session: Session, locks: QueueLocks) -> bool:
    """Interrupt the watcher's wait so it re-reads the count now (`wakeup.instant_wake`).

    Sound only where producers and consumers use the same database user (or CONNECTION ADMIN),
    talk to the same server without a multiplexing proxy, and accept that a kill arriving
    between two statements is lost (polling still catches it).
    """
    conn_id = store.lock_holder(session, locks.watch)
    return bool(conn_id) and store.kill_query(session, conn_id)
