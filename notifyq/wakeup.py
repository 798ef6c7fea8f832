"""How idle consumers learn of new work without polling the jobs table.

Consumer processes of a queue that have nothing to do queue up in GET_LOCK(watch) (granted in
arrival order on MariaDB; MySQL leaves the order undefined, and nothing here relies on it: any one
queued consumer becoming the watcher is all the protocol needs), each on its watcher session for that queue, which one idle worker of the process uses
at a time (consume/presence.py); its other idle workers wait for that seat in the process.
The one holding it, the watcher, runs one statement in a loop (sql `watch_bell`): it reads the
queue's enqueue count (the sum of its nq_signal slots) and, only if nothing new arrived, waits
inside that same statement: in GET_LOCK on a bell when a long-running producer rings
this queue, otherwise in SLEEP with exponential backoff (poll_initial_s doubling up to
poll_max_s, and never past the earliest scheduled job's run_at). When the count moved or the
bell rang, the watcher claims a batch while still holding the watch lock. That claim reads the
count again in its first round trip, just before its candidate read, and if the batch drained
the queue it records that count as watched in its own COMMIT (queries.claim, as_watcher), so the
next watcher does not wake for work already taken. Then it releases the watch lock (without
waiting for the reply) before running the batch: the next idle consumer becomes the watcher.
A burst therefore wakes consumers one after another while batches come back full, and a
single job wakes exactly one.

From a ring to the handler: the producer's ring statement (GET_LOCK of its other bell, then
RELEASE_LOCK of the held one, sent without waiting for its reply), the grant ending the watch statement (which releases the bell
itself), then the claim's two round trips (count + candidates, the locking read) and its last
query unwaited (the mark, the watched count, the COMMIT), and the handler starts. An instant
wake's KILL ends the watch statement with an error instead of the grant: the watcher claims at once.

Wake-ups only make pick-up fast; correctness never depends on them. Every wait is bounded,
and after every wait either the count is read again or a claim looks at the jobs table.

Bells: a producer ringer holds one of bell0/bell1 (store/bells.py). One per queue and server:
a GET_LOCK waits on one name, and only its holder can release it, so a second ringer could
never end the watcher's wait. The first producer to become ringer holds the ringer lock; the others
interrupt the watcher's wait (produce/interrupt.py, `wakeup.instant_wake`), else their jobs are
found by the watcher's poll. Its COMMIT carries, in the
same round trip, a read of who holds the watch lock and the bells. Only when a consumer holds
the watch lock does it ring: in one statement it takes the other bell and releases the held one,
so it always holds at least one. Nobody watching after the COMMIT means nobody needs a ring:
whoever becomes the watcher later reads the count after the COMMIT. A look that saw nobody
holds for QUIET_LOOK_S: the puts in that window skip it (under load, where nobody idles, that
is nearly every put). A watcher that began inside the window reads the count again within its
first backoff steps, and the first put after the window looks and rings it. The watcher waits on the
bell its previous statement saw held at that statement's end; a new turn's first statement
only reads. That choice is made before the statement's read of the count, so:
  - a commit after the read is followed by a ring that releases the bell held at the choice
    (or, if a ring came between the choice and the read, the count already shows its jobs);
  - the released bell is granted at once if the release came before the GET_LOCK.
The watch statement releases a granted bell at once (the producer needs it for its next ring),
and the watcher goes to claim. Two grants on the same bell with the same count mean a bell held
by something that is no ringer (a producer arming, dying, or of an older version): that
watcher's next waits sleep instead until the count moves, so a free bell can never become a
spin (at most one needless claim per consumer). Two rings between one statement's choice and
its GET_LOCK would leave it waiting on a bell held again; its bounded wait covers that.
While no ringer holds a bell the watcher sleeps, so a ring reaches it only once it has read the
locks again: a new ringer's first put, and a put whose look finds the bell lost while a consumer
watches, wake it with the instant wake instead, where the producer may (Producer._wakers).

Reconnects: the watcher session's advisory locks die with its connection (the first queue's
also holds the process's liveness lock). Session.run reconnects (tenacity) and reruns the
statement, so after every statement the Waiter compares the session's generation and, if it
changed, gives up its turn: the worker re-registers (takes its liveness lock back, or a new
one) before it waits or claims again. A producer's bell session raises its own
wait_timeout (advisory.hold_session): it sits idle while the producer waits for input, and an
idle-timeout disconnect would drop the bell. The watcher session that holds a consumer's liveness lock has
a short one instead (consumer.session_idle_s), kept alive while its workers are busy
(consume/presence.py), so that the liveness lock of a host that vanished is freed soon.

Without advisory locks (wakeup.use_locks = false, or the server refuses them: Galera's 1235,
a proxy's 1105) every idle consumer polls the signal row itself with the same backoff: correct,
but the cost grows with the number of consumers, and `notifyq status` says so.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from notifyq import errors
from notifyq.config import WakeupConfig
from notifyq.store import advisory, bells
from notifyq.store.db import Session
from notifyq.store.driver import DriverError, locks_unavailable
from notifyq.store.locks import QueueLocks

log = logging.getLogger("notifyq.wakeup")

SAFETY_S = 60.0  # the longest a watcher goes without one claim, whatever it was told
READ_MARGIN_S = 5.0  # a wait in a statement ends this long before the client's read timeout
RINGER_RETRY_S = 1.0  # a producer that found another ringer tries to become the ringer this often
# A ringer's look that saw nobody watching holds this long: the puts in between commit without a
# look, as plain puts do. Under load no consumer idles, and a look per put was a statement per
# job. A consumer that starts watching inside the window is rung by the first put after it, or
# finds the jobs first by its own reads of the count (poll_initial_s doubling): a few ms more.
QUIET_LOOK_S = 0.005


class Waiter:
    """A consumer process's side of the wake-up protocol for one queue, on its watcher session
    (used by one idle worker at a time: on_turn and on_reap are that worker's)."""

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
        watcher session's read timeout is fixed when it connects, from the config of that time;
        a SIGHUP may raise idle_wait_s or poll_max_s past it, and a wait that outlasts it ends
        in a lost connection (and liveness lock), reconnected and waited again: a loop."""
        timeout = self.session.read_timeout_s
        return min(wait_s, max(timeout - READ_MARGIN_S, timeout / 2))

    # -------------------------------------------------------- the watch lock

    def acquire_watch(self) -> bool:
        """Block (bounded) until we are the watcher; False on timeout, interruption or reconnect."""
        generation = self.session.generation
        got = advisory.get_lock(self.session, self.locks.watch, self._bounded(self.cfg.idle_wait_s))
        self.watch_timed_out = False
        if self.session.generation != generation:
            # Reconnected while queued: our liveness lock may have gone with the old connection,
            # so we must not claim yet. Give the turn back; the worker re-registers and queues again.
            if got == 1:
                advisory.release_lock(self.session, self.locks.watch)
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
        state = bells.watch(self.session, self.queue, self.locks, None, 0, use_bell=False)
        if state.reap:
            self.on_reap()
        if state.paused or state.interrupted:
            return False
        return state.total > state.watched or (state.due_in_s is not None and state.due_in_s <= 0)

    def release_watch(self, wait: bool = True, claimed: int | None = None) -> None:
        """Hand the watch on. wait=False sends the release without waiting for its reply: the
        next idle consumer is granted the watch while we already run our batch (`claimed`: a
        job of the claim just made, advisory.hand_watch_on)."""
        if self.watching:
            self.watching = False
            if wait:
                advisory.release_lock(self.session, self.locks.watch)
            else:
                advisory.hand_watch_on(self.session, self.locks.watch, self.queue, claimed)

    # -------------------------------------------------------- waiting for work

    def wait_for_work(self, safety_s: float = SAFETY_S) -> bool | None:
        """As the watcher: return True once there may be something to claim.

        That is: the enqueue count moved past the watched count, a scheduled job fell due, or
        a producer rang the bell. A bell grant returns at once, without reading the count
        again: the claim reads it itself in its first round trip (queries.claim, as_watcher),
        so a ring costs one statement here between the producer's release and the claim.

        Returns None when stopping, or when the watcher session reconnected (the caller must
        re-register first). The watch statement also reports the time until the earliest
        scheduled job, which bounds the next wait. After `safety_s` of silence it returns
        anyway, so one claim checks the jobs table: a belt for the braces of a lost wake-up
        nobody foresaw.
        """
        generation = self.session.generation
        start = time.monotonic()
        backoff = self.cfg.poll_initial_s
        due_at: float | None = None
        # The bell to wait on: the one the previous statement saw held at its end. A new turn
        # does not know it yet, so its first statement only reads (bells.watch).
        wait_on: int | None = None
        paused = False  # what this turn's last statement read (an interrupted one reads nothing)
        while not self.stop.is_set():
            self.on_turn()
            wait = self._bounded(min(backoff, self.cfg.poll_max_s))
            if due_at is not None:
                wait = max(0.0, min(wait, due_at - time.monotonic()))
            sent = time.monotonic()  # due_in_s is measured before the statement's wait
            state = bells.watch(self.session, self.queue, self.locks, wait_on, wait,
                                use_bell=not self._suspect_bell)
            if self.session.generation != generation:
                self.watching = False  # the watch lock died with the old connection
                return None
            if state.interrupted:  # KILL QUERY interrupted the wait: a wake-up or a stop
                if self.stop.is_set():
                    return None
                if not paused:
                    # A producer's instant wake, sent after its COMMIT: claim now. The claim
                    # reads the count itself in its first round trip, so reading it here first
                    # would only add a round trip to the pick-up. (A KILL aimed elsewhere costs
                    # an empty claim.)
                    self.wakeups["signal"] += 1
                    return True
                # Paused when last read: a put's KILL still arrives, and a claim would only find
                # the pause again. Read again instead (the resume shows there).
                wait_on = None  # the statement ended early: it did not say which bell is held
                continue
            paused = state.paused
            waited_on, wait_on = wait_on, state.held
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
                grant = (waited_on, state.total)
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

    def work_left(self) -> None:
        """Polling: the last claim left work behind; the next poll claims at once."""
        self._last_total = -1

    def poll_for_work(self, safety_s: float = SAFETY_S) -> bool:
        """Fallback without advisory locks: each idle consumer polls the signal row itself.

        The backoff survives between idle spells and restarts only when the count moves, so
        an idle consumer settles at one cheap read per poll_max_s.
        """
        start = time.monotonic()
        while not self.stop.is_set():
            self.on_turn()
            total, paused, due_in_s, reap = bells.poll_signal(self.session, self.queue)
            if reap:
                self.on_reap()
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
    """A long-running producer's side: hold a bell, and ring it after a commit that a consumer
    is watching for, by taking the other bell and releasing the held one (bells.ring)."""

    def __init__(self, session: Session, queue: str, locks: QueueLocks):
        self.session = session
        self.queue = queue
        self.locks = locks
        self.held: int | None = None  # index of the bell we hold
        self.rings = 0  # rings sent: tests and the benchmark read it
        self.looks = 0  # looks taken (the others were skipped in a quiet window): the same
        self.quiet_s = QUIET_LOOK_S
        self._quiet_until = 0.0  # monotonic: until then, the last look's "nobody watching" holds
        self._generation = -1
        self._retry_ringer_at = 0.0
        self._told_not_ringer = False
        self._look_query: str | None = None
        # Whether an idle watcher can be waiting on our bell yet: not until it has read the
        # locks again since we took it (it sleeps while no ringer holds a bell), so a new
        # ringer's first put wakes it another way (Producer._wakers).
        self.announced = False

    def become_ringer(self) -> bool:
        """Become this queue's ringer if none is."""
        if self.session.generation != self._generation:
            # A new lock connection (or none yet): whatever we held died with the old one.
            self.held = None
        if self.held is not None:
            # The last ring's reply, read now (it came long ago, as a rule): the look after our
            # COMMIT must see the ring done. A lost connection shows as a new generation.
            try:
                self.session.conn
            except (DriverError, errors.NotifyqError) as e:
                log.debug("the last ring failed, becoming ringer again error=%s", e)
                self._forget()
            if self.held is not None and self.session.generation == self._generation:
                return True
            self.held = None
        if time.monotonic() < self._retry_ringer_at:
            return False
        try:
            if advisory.get_lock(self.session, self.locks.ringer, 0) != 1:
                # Another producer rings this queue's bells. Ask again in a while, not on every
                # put: at hundreds of puts a second the refused GET_LOCK was a statement each.
                self._retry_ringer_at = time.monotonic() + RINGER_RETRY_S
                if not self._told_not_ringer:  # once: why this producer's jobs start later
                    self._told_not_ringer = True
                    log.info("another producer rings this queue's bell (one per queue and server): "
                             "this one wakes the consumers by interrupting their wait (wakeup.instant_wake), "
                             "else their poll finds its jobs, within wakeup.poll_max_s queue=%s", self.queue)
                return False
            self._generation = self.session.generation
            self.announced = False
            advisory.hold_session(self.session)
            # Either bell will do: a watcher chooses the one it sees held. One is busy only for
            # the instant a watcher's statement holds a grant.
            for bell, wait_s in ((0, 0), (1, 0), (0, 5)):
                if advisory.get_lock(self.session, self.locks.bells[bell], wait_s) == 1:
                    self.held = bell
                    break
            else:
                self._forget()
                return False
            if self.session.generation != self._generation:
                # Reconnected in between: the ringer lock is gone, but this connection may hold
                # the bell; a later become_ringer would take it twice and one release would never ring.
                self._forget()
                return False
            return True
        except DriverError as e:
            if locks_unavailable(e):
                self.held = None
                return False
            raise

    def look_due(self) -> bool:
        """Whether this put's COMMIT carries the look: not inside the quiet window of a look that
        saw nobody watching (QUIET_LOOK_S)."""
        return time.monotonic() >= self._quiet_until

    def commit_and_look(self, work: Session, cur, result: Any) -> tuple | None:
        """COMMIT the put's transaction on `work` and, in that round trip, look whether a consumer
        watches (Pipeline.commit_then_read): the row for after_commit(). `result` is what the
        put's body returns, for Session.run to ask about if the COMMIT's reply is lost."""
        self.looks += 1
        if self._look_query is None:  # bound once, not mogrified on every put
            self._look_query = cur.mogrify(*bells.look(self.locks))
        return work.pipeline.commit_then_read(cur, self._look_query, result=result)

    def ring_if_watched(self) -> bool:
        """After a COMMIT this bell did not look after (the caller's own, `put(conn=...)`): look
        on the bell's session whether a consumer watches, and ring if so. Nothing inside the
        quiet window of a look that saw nobody watching. False as after_commit()."""
        if not self.look_due():
            return True
        self.looks += 1
        sql, params = bells.look(self.locks)
        seen = self.session.run(lambda cur: (cur.execute(sql, params), cur.fetchone())[1], what="look for a watcher")
        return self.after_commit(seen)

    def after_commit(self, seen: tuple | None) -> bool:
        """Ring if a consumer watches the queue. `seen` is the look's row (watch holder, bell 0
        and bell 1 holders), read after our COMMIT: nobody watching then means whoever watches
        later reads the count after our jobs, so no ring is needed. None: the look failed; ring
        anyway (one needless claim at worst). False when a watcher may be left unrung (the bell
        was lost, or the ring failed): the caller wakes it another way if it can."""
        if self.held is None:
            return True
        if self.session.generation != self._generation:
            self._forget()
            return False
        if seen is not None:
            watcher, *holders = seen
            mine = self.session.connection_id
            if [holder == mine for holder in holders] != [self.held == 0, self.held == 1]:
                # Our lock connection lost its bell (killed, the server restarted, or the last
                # ring could not take the other bell): let go of everything and become ringer
                # again on a fresh connection at the next put.
                self._forget()
                return watcher is None
            if watcher is None:
                self._quiet_until = time.monotonic() + self.quiet_s
                return True
        try:
            bells.ring(self.session, self.locks, self.held)
        except (DriverError, errors.NotifyqError) as e:
            # The jobs are committed. Become ringer again at the next put.
            log.debug("ring failed error=%s", e)
            self._forget()
            return False
        if self.session.generation != self._generation:
            self._forget()  # a new connection that holds neither bell: start over
            return False
        self.held = 1 - self.held  # the next look checks it
        self.rings += 1
        return True

    def _forget(self) -> None:
        # Drop the lock connection: the server frees the ringer and both bells with it, at
        # once and whatever state they were in; the next put re-arms on a fresh connection.
        self.session.discard()
        self.held = None
        self._generation = -1
        self._quiet_until = 0.0

    def stop_ringing(self) -> None:
        """At close: give up the ringer lock and the bell, waking the watcher to its polling."""
        # The bell first: releasing it wakes the watcher, which then finds no bell held (no
        # ringer) and sleeps with backoff.
        names = ([self.locks.bells[self.held]] if self.held is not None else list(self.locks.bells))
        for name in (*names, self.locks.ringer):
            try:
                advisory.release_lock(self.session, name)
            except Exception:  # closing anyway; the server frees them with the session
                pass
        self.held = None
