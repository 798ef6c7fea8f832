"""How idle consumers learn of new work without polling the jobs table.

Consumers of a queue that have nothing to do queue up in GET_LOCK(watch) (FIFO on both servers).
The one holding it, the watcher, runs one statement in a loop (sql `watch`): it reads the
queue's enqueue count (the sum of its nq_signal slots) and, only if nothing new arrived, waits
inside that same statement: in GET_LOCK on the current bell when a long-running producer rings
this queue, otherwise in SLEEP with exponential backoff (poll_initial_s doubling up to
poll_max_s, and never past the earliest scheduled job's run_at). When the count moved or the
bell rang, the watcher claims a batch while still holding the watch lock. That claim reads the
count again in its first round trip, just before its candidate read, and if the batch drained
the queue it records that count as watched in its own COMMIT (queries.claim, as_watcher), so the
next watcher does not wake for work already taken. Then it releases the watch lock (without
waiting for the reply) before running the batch: the next idle consumer becomes the watcher.
A burst therefore wakes consumers one after another while batches come back full, and a
single job wakes exactly one.

From a ring to the handler: the producer's RELEASE_LOCK, the grant ending the watch statement
(which releases the bell itself), then the claim's three round trips (count + candidates, the
locking read, the mark + COMMIT).

Wake-ups only make pick-up fast; correctness never depends on them. Every wait is bounded,
and after every wait either the count is read again or a claim looks at the jobs table.

Bells: a producer ringer holds bell[b] where b is nq_queue.bell. To publish, it takes
bell[1-b], commits its jobs together with nq_queue.bell = 1-b, then releases bell[b]. So a
ringer always holds at least one bell, and holds only bell[1-b] while nq_queue.bell = b only
after that commit. The watcher waits on the bell its read named whenever either bell is held:
  - read before the commit, GET_LOCK before the release: it is granted bell[b] on release;
  - read before the commit, GET_LOCK after the release: bell[b] is free, granted at once;
  - read after the commit: it sees the new count and does not wait.
The watch statement releases a granted bell at once (the producer needs it for its next ring),
and the watcher goes to claim. No interleaving loses the wake-up. Two grants on the same bell
value with the same count mean the bells are in a state no ringer leaves them in for long (a
producer arming or dying): that watcher's next waits sleep instead until the count moves, so
a free bell can never become a spin (at most one needless claim per consumer).

Reconnects: the lock session's advisory locks die with its connection. Session.run reconnects
(tenacity) and reruns the statement, so after every statement the Waiter compares the session's
generation and, if it changed, gives up its turn: the worker re-registers (takes its liveness
lock back, or a new one) before it claims anything. A producer's bell session raises its own
wait_timeout (queries.hold_session): it sits idle while the producer waits for input, and an
idle-timeout disconnect would drop the bell. A consumer's lock session has a short one instead
(consumer.session_idle_s), kept alive while its handlers run (consume/keepalive.py), so that the
liveness lock of a host that vanished is freed soon.

Without advisory locks (wakeup.use_locks = false, or the server refuses them: Galera's 1235,
a proxy's 1105) every idle consumer polls the signal row itself with the same backoff: correct,
but the cost grows with the number of consumers, and `notifyq status` says so.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from notifyq import errors
from notifyq.config import WakeupConfig
from notifyq.store import queries
from notifyq.store.db import DriverError, Session, locks_unavailable
from notifyq.store.locks import QueueLocks

log = logging.getLogger("notifyq.wakeup")

SAFETY_S = 60.0  # the longest a watcher goes without one claim, whatever it was told
READ_MARGIN_S = 5.0  # a wait in a statement ends this long before the client's read timeout
ARM_RETRY_S = 1.0  # a producer that found another ringer tries to become the ringer this often


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
        self.watch_timed_out = False  # the last acquire_watch ended by its timeout
        # Why wait_for_work/poll_for_work returned work: tests and the benchmark read these.
        self.wakeups: dict[str, int] = {"bell": 0, "signal": 0, "timeout": 0, "due": 0}
        self._last_grant: tuple[int, int] | None = None  # (bell value, count) of the last grant
        self._suspect_bell = False  # a grant without a ring was seen: sleep until the count moves
        self._last_total = -1  # polling fallback only
        self._poll_backoff = cfg.poll_initial_s  # polling fallback: kept across idle spells

    def _bounded(self, wait_s: float) -> float:
        """A wait inside a statement must end before the client stops reading its reply. The
        lock session's read timeout is fixed when it connects, from the config of that time;
        a SIGHUP may raise idle_wait_s or poll_max_s past it, and a wait that outlasts it ends
        in a lost connection (and liveness lock), reconnected and waited again: a loop."""
        timeout = self.session.read_timeout_s
        return min(wait_s, max(timeout - READ_MARGIN_S, timeout / 2))

    # -------------------------------------------------------- the watch lock

    def acquire_watch(self) -> bool:
        """Block (bounded) until we are the watcher; False on timeout, interruption or reconnect."""
        generation = self.session.generation
        got = queries.get_lock(self.session, self.locks.watch, self._bounded(self.cfg.idle_wait_s))
        self.watch_timed_out = False
        if self.session.generation != generation:
            # Reconnected while queued: our liveness lock went with the old connection, so we
            # must not claim yet. Give the turn back; the worker re-registers and queues again.
            if got == 1:
                queries.release_lock(self.session, self.locks.watch)
            self.watching = False
            return False
        self.watching = got == 1
        self.watch_timed_out = got == 0
        return self.watching

    def watcher_overdue(self) -> bool:
        """After a watch-lock timeout: is there work the watcher has not dispatched?

        A healthy watcher hands work on within milliseconds. A watcher whose host vanished
        without closing its connection (power loss, partition) keeps the watch lock until the
        server's TCP keepalive gives up, hours later; queued consumers must not sleep that long.
        One cheap read per idle_wait_s: if work is pending, the caller claims it itself. The
        same read asks whether a peer died: the watcher, which runs the reaper for an idle
        fleet, may be the one that is gone.
        """
        state = queries.watch(self.session, self.queue, self.locks.bells, 0, use_bell=False)
        if state.reap:
            self.on_reap()
        if state.paused or state.total < 0:
            return False
        return state.total > state.watched or (state.due_in_s is not None and state.due_in_s <= 0)

    def release_watch(self, wait: bool = True) -> None:
        """Hand the watch on. wait=False sends the release without waiting for its reply: the
        next idle consumer is granted the watch while we already run our batch."""
        if self.watching:
            self.watching = False
            if wait:
                queries.release_lock(self.session, self.locks.watch)
            else:
                queries.release_lock_later(self.session, self.locks.watch)

    # -------------------------------------------------------- waiting for work

    def wait_for_work(self, safety_s: float = SAFETY_S) -> bool | None:
        """As the watcher: return True once there may be something to claim.

        That is: the enqueue count moved past the watched count, a scheduled job fell due, or
        a producer rang the bell. A bell grant returns at once, without reading the count
        again: the claim reads it itself in its first round trip (queries.claim, as_watcher),
        so a ring costs one statement here between the producer's release and the claim.

        Returns None when stopping, or when the lock session reconnected (the caller must
        re-register first). The watch statement also reports the time until the earliest
        scheduled job, which bounds the next wait. After `safety_s` of silence it returns
        anyway, so one claim checks the jobs table: a belt for the braces of a lost wake-up
        nobody foresaw.
        """
        generation = self.session.generation
        start = time.monotonic()
        backoff = self.cfg.poll_initial_s
        due_at: float | None = None
        while not self.stop.is_set():
            self.on_turn()
            wait = self._bounded(min(backoff, self.cfg.poll_max_s))
            if due_at is not None:
                wait = max(0.0, min(wait, due_at - time.monotonic()))
            sent = time.monotonic()  # due_in_s is measured before the statement's wait
            state = queries.watch(self.session, self.queue, self.locks.bells, wait,
                                use_bell=not self._suspect_bell)
            if self.session.generation != generation:
                self.watching = False  # the watch lock died with the old connection
                return None
            if state.total < 0:  # KILL QUERY interrupted the SLEEP: a wake-up or a stop
                continue
            if state.reap:
                self.on_reap()
            if self._last_grant is not None and state.total != self._last_grant[1]:
                self._suspect_bell = False  # the count moved: rings are real again
            if not state.paused:
                if state.total > state.watched:
                    self.wakeups["signal"] += 1
                    return True
                if state.due_in_s is not None and state.due_in_s <= 0:
                    self.wakeups["due"] += 1
                    return True
            # A paused queue ignores due jobs: waking for them would only find the pause again.
            due_at = None if state.paused or state.due_in_s is None else sent + state.due_in_s
            if state.waited == 1:
                # Every ring flips the bell and comes with a new count. A grant on the same
                # bell value with the same count as the last grant (in this turn or an earlier
                # one) had no ring behind it: the bells are in a state no ringer leaves them in
                # for long (see the module docstring). Sleep the next waits instead of spinning
                # on a free bell, until the count moves.
                grant = (state.bell, state.total)
                if grant == self._last_grant:
                    self._suspect_bell = True
                    continue
                self._last_grant = grant
                if state.paused:
                    continue
                self.wakeups["bell"] += 1
                return True
            if state.waited is None:  # did not wait: an instant wake interrupted the SLEEP
                continue
            backoff *= 2
            if time.monotonic() - start >= safety_s:
                self.wakeups["timeout"] += 1
                return True
        return None

    def poll_for_work(self, safety_s: float = SAFETY_S) -> bool:
        """Fallback without advisory locks: each idle consumer polls the signal row itself.

        The backoff survives between idle spells and restarts only when the count moves, so
        an idle consumer settles at one cheap read per poll_max_s.
        """
        start = time.monotonic()
        while not self.stop.is_set():
            self.on_turn()
            total, paused, due_in_s = queries.poll_signal(self.session, self.queue)
            if not paused:
                if total != self._last_total:
                    self._last_total = total
                    self._poll_backoff = self.cfg.poll_initial_s
                    self.wakeups["signal"] += 1
                    return True
                if due_in_s is not None and due_in_s <= 0:
                    self.wakeups["due"] += 1
                    return True
            if time.monotonic() - start >= safety_s:
                self.wakeups["timeout"] += 1
                return True
            wait = min(self._poll_backoff, self.cfg.poll_max_s)
            if not paused and due_in_s is not None:
                wait = min(wait, due_in_s)
            self.stop.wait(wait)
            self._poll_backoff = min(self._poll_backoff * 2, self.cfg.poll_max_s)
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
        self._retry_arm_at = 0.0

    def arm(self, work: Session) -> bool:
        """Become this queue's ringer if none is; `work` is the producer's work session."""
        if self.session.generation != self._generation:
            # A new lock connection (or none yet): whatever we held died with the old one.
            self.held = self._next = None
        if self.held is not None:
            return True
        if time.monotonic() < self._retry_arm_at:
            return False
        try:
            if queries.get_lock(self.session, self.locks.ringer, 0) != 1:
                # Another producer rings this queue's bells. Ask again in a while, not on every
                # put: at hundreds of puts a second the refused GET_LOCK was a statement each.
                self._retry_arm_at = time.monotonic() + ARM_RETRY_S
                return False
            self._generation = self.session.generation
            queries.hold_session(self.session)
            bell = work.run(lambda cur: queries.read_bell(cur, self.queue), what="read bell")
            if queries.get_lock(self.session, self.locks.bells[bell], 5) != 1:
                queries.release_lock(self.session, self.locks.ringer)
                return False
            if self.session.generation != self._generation:
                # Reconnected in between: the ringer lock is gone, but this connection may hold
                # the bell; a later arm would take it twice and one release would never ring.
                self._forget()
                return False
            self.held = bell
            return True
        except DriverError as e:
            if locks_unavailable(e):
                return False
            raise

    def before_commit(self, cur) -> None:
        """Inside the jobs' transaction: take the other bell and point watchers at it."""
        if self.held is None:
            return
        other = 1 - self.held
        if self._next == other:  # the transaction is being retried: we hold it already
            queries.set_bell(cur, self.queue, other)
            return
        got = queries.get_lock(self.session, self.locks.bells[other], 5)
        if self.session.generation != self._generation:
            # The lock connection was lost and reopened: the ringer lock and our bell went
            # with it. Skip this ring (the watcher's backoff poll covers it) and re-arm later.
            self._forget()
            return
        if got != 1:
            self._next = None  # a watcher sat on it too long: skip this ring, polling covers it
            return
        queries.set_bell(cur, self.queue, other)
        self._next = other

    def after_commit(self) -> None:
        if self.held is None or self._next is None:
            return
        # Ring, without waiting for the reply: the server grants the bell to the watcher the
        # moment the release arrives, and put() returns right after its COMMIT. The reply is
        # read before this session's next statement (a lost connection shows up there, as a
        # new generation, and the next put re-arms).
        queries.release_lock_later(self.session, self.locks.bells[self.held])
        self.held, self._next = self._next, None

    def after_rollback(self) -> None:
        """The transaction failed. If it had moved the bell we cannot know whether its COMMIT
        landed (OutcomeUnknown), so which bell is current is unknown too: let go of everything
        and re-arm from the committed state on the next put."""
        if self._next is not None:
            self._forget()

    def _forget(self) -> None:
        # Drop the lock connection: the server frees the ringer and both bells with it, at
        # once and whatever state they were in; the next put re-arms on a fresh connection.
        self.session.discard()
        self.held = self._next = None
        self._generation = -1

    def disarm(self) -> None:
        # The other bell first: releasing the current one wakes the watcher, which must then
        # find both free (no ringer) rather than a bell that looks like a ring in progress.
        order = (1 - self.held, self.held) if self.held is not None else (0, 1)
        for name in (*(self.locks.bells[i] for i in order), self.locks.ringer):
            try:
                queries.release_lock(self.session, name)
            except Exception:  # closing anyway; the server frees them with the session
                pass
        self.held = None


def instant_wake(session: Session, locks: QueueLocks) -> bool:
    """Interrupt the watcher's wait so it re-reads the count now (`wakeup.instant_wake`).

    Best effort, after the jobs are committed: it never fails a put. Safe only when
      - producers and consumers log in as the same database user (KILL needs that, or
        CONNECTION ADMIN / SUPER, which a runtime user should not have);
      - they talk to the same server directly: the watcher's connection id means nothing
        behind a multiplexing proxy (ProxySQL, Vitess, RDS Proxy) or on another Galera or
        group-replication node, where the KILL could hit an unrelated session;
      - an extra connection and two statements per put are acceptable.
    A KILL that lands between two of the watcher's statements is lost (KILL QUERY on an idle
    connection does nothing); the next read catches the job anyway, within poll_max_s. The
    watcher's lock session only runs lock statements and autocommit single-row updates, which
    are rerun when interrupted, so the KILL can never abort a claim.
    """
    try:
        conn_id = queries.lock_holder(session, locks.watch)
        return bool(conn_id) and queries.kill_query(session, conn_id)
    except (DriverError, errors.NotifyqError) as e:
        log.debug("instant wake failed, the watcher's poll will find the job error=%s", e)
        session.discard()
        return False
