"""The consumer's side of the wake-up: a Waiter, on a consumer process's watcher session for one
queue, waits for work as the watcher (in GET_LOCK on the bell a ringer holds, else in SLEEP with
backoff), or polls the signal row where there are no advisory locks. The protocol: the package
docstring (notifyq/wakeup/__init__.py)."""


from __future__ import annotations

import threading
import time
from collections.abc import Callable

from notifyq.config import WakeupConfig
from notifyq.store import advisory, bells
from notifyq.store.db import Session
from notifyq.store.locks import QueueLocks
from notifyq.wakeup.waker import QUIET_LOOK_S

SAFETY_S = 60.0  # the longest a watcher goes without one claim, whatever it was told
READ_MARGIN_S = 5.0  # a wait in a statement ends this long before the client's read timeout
# A turn's first wait ends this soon, whatever poll_initial_s says, and the count is read again:
# the turn may have begun inside a producer's quiet window (waker.py's Look: its look saw nobody
# watching, as in the gap of a hand-off), whose puts neither ring nor interrupt. The window
# closes QUIET_LOOK_S after the look's reply, which came before this turn began; the rest is
# room for that reply's way back to a loaded producer.
FIRST_WAIT_S = 10 * QUIET_LOOK_S
# Past the end of a counter's trust (Waiter.recount_after), so that the claim then made finds it
# untrusted (the server's clock and ours may run apart by that much in a trust period)
RECOUNT_MARGIN_S = 0.1


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
        self.nap: str | None = None  # the seated worker's nap lock (nap.py; None: SLEEP)
        self.watching = False
        self.watch_timed_out = False  # the last acquire_watch ended by its timeout
        # Why wait_for_work/poll_for_work returned work: tests and the benchmark read these.
        # "locked": the claim again for ready jobs another session's locks held came due (locked_out)
        self.wakeups: dict[str, int] = {"bell": 0, "signal": 0, "timeout": 0, "due": 0, "locked": 0}
        self._last_grant: tuple[int, int] | None = None  # (bell value, count) of the last grant
        self._suspect_bell = False  # a grant without a ring was seen: sleep until the count moves
        self._last_total = -1  # polling fallback only
        self._poll_backoff = cfg.poll_initial_s  # polling fallback: kept across idle spells
        # Monotonic: when the idle worker claims again for jobs a counter held back (recount_after)
        self.recount_at: float | None = None
        # Monotonic: when the idle worker claims again for ready jobs another session's locks held
        # (locked_out), and the wait that set it (the backoff's last step; None: starts over)
        self.locked_at: float | None = None
        self._locked_wait_s: float | None = None
        # Monotonic: when the wait for the watch lock under way (acquire_watch) ends; None: none
        self._watch_wait_end: float | None = None
        self._recount_lock = threading.Lock()  # (the queue's workers: one of them takes it)

    def _bounded(self, wait_s: float) -> float:
        """A wait inside a statement must end before the client stops reading its reply. The
        watcher session's read timeout is fixed when it connects, from the config of that time;
        a SIGHUP may raise idle_wait_s or poll_max_s past it, and a wait that outlasts it ends
        in a lost connection (and liveness lock), reconnected and waited again: a loop."""
        timeout = self.session.read_timeout_s
        return min(wait_s, max(timeout - READ_MARGIN_S, timeout / 2))

    # -------------------------------------------------------- jobs a counter held back

    def recount_after(self, seconds: float | None) -> None:
        """A claim of the queue in this process held ready jobs back by counters (drained or
        not), or drained it: `seconds` until the trust of the counters that held its ready jobs
        back ends (queries.Claim.recount_s), None when it held none. A counter left high frees
        its slot only when a claim recounts it, and nothing may wake the watcher for that: the
        idle worker of the queue claims then, once (that claim, if it holds jobs again, says when
        next). The latest claim's word counts: a claim that drained holding nothing ends it, and
        a later one that held jobs moves it (a claim recounts what it may no longer trust, so a
        period needs no claim but the last)."""
        with self._recount_lock:
            self.recount_at = None if seconds is None else time.monotonic() + seconds + RECOUNT_MARGIN_S

    def locked_out(self, held: bool) -> None:
        """A claim of the queue in this process came back empty: `held`, ready (or due) jobs are
        left that another session holds locked (an application's BEGIN; SELECT ... FOR UPDATE, a
        stuck transaction), which its SKIP LOCKED passed over as a peer's. It recorded the count
        as watched, so the count will not wake anyone for them once the lock goes: the idle
        worker of the queue claims again after a wait that starts at poll_initial_s and doubles
        up to poll_max_s (claiming again at once would spin on empty claims; waiting for the
        count left them to the safety claim, a minute). Kept here, not in the worker that saw
        them: a claim that takes jobs meanwhile (a put's) hands the watch on, a reconnect ends
        the watch, and the wait must outlive both. Only an empty claim that finds none ends it
        (a claim that takes jobs does not know whether it left any locked)."""
        with self._recount_lock:
            if not held:
                self.locked_at = self._locked_wait_s = None
                return
            self._locked_step(time.monotonic())

    def _locked_step(self, now: float) -> None:
        """The backoff's next step for locked jobs (under _recount_lock): poll_initial_s after a
        start over, else twice the last wait, at most poll_max_s; the claim again then."""
        last = self._locked_wait_s
        self._locked_wait_s = self.cfg.poll_initial_s if last is None else min(2 * last, self.cfg.poll_max_s)
        self.locked_at = now + self._locked_wait_s

    def _fresh_wake(self) -> None:
        """The count moved (a put): the wait for locked jobs starts over at poll_initial_s after
        the next empty claim; the claim again it set stays due (the lock may have gone)."""
        self._locked_wait_s = None

    def until_claim_again(self, wait_s: float) -> float:
        """`wait_s`, ended by the claim for held jobs (a counter's, recount_after; another
        session's locks, locked_out) if that comes first."""
        at = min((t for t in (self.recount_at, self.locked_at) if t is not None), default=None)
        return wait_s if at is None else max(0.0, min(wait_s, at - time.monotonic()))

    def watch_wait_outlasts_claim_again(self) -> bool:
        """A worker of ours waits for the watch lock (queued behind another consumer's watcher,
        in a GET_LOCK begun before the claim for held jobs was set) until more than poll_max_s
        past that claim's time. The caller, whose claim just set it (recount_after, locked_out),
        ends that wait (Worker._end_watch_wait): the queued worker is the one to make the claim
        (the other consumer's watcher knows nothing of our held jobs, and the caller runs the
        jobs its claim took), and would make it only at its GET_LOCK's end, up to idle_wait_s."""
        end = self._watch_wait_end
        at = min((t for t in (self.recount_at, self.locked_at) if t is not None), default=None)
        return end is not None and at is not None and end - at > self.cfg.poll_max_s

    def claim_again_due(self) -> bool:
        """The claim for held jobs is due (and taken: the caller claims now, once). The locked
        jobs' deadline stays armed, moved on by the backoff, until an empty claim finds none
        (locked_out): a claim that takes others and runs them must not end it."""
        with self._recount_lock:
            now = time.monotonic()
            if self.recount_at is not None and now >= self.recount_at:
                self.recount_at = None
                self.wakeups["due"] += 1  # (as a rate's refill: jobs held back came due)
                return True
            if self.locked_at is not None and now >= self.locked_at:
                # Moved on by the backoff's next step (as an empty claim would), so that the
                # queue's other idle workers do not claim for it too before this claim's word
                # lands, and so that claims made for it back off even when their word never
                # lands (a put's fresh wake started the backoff over: without the step, every
                # claim again came poll_initial_s after the last, about 200 a second)
                self._locked_step(now)
                self.wakeups["locked"] += 1
                return True
            return False

    def _due_in(self, due_in_s: float | None, seen_ahead: bool = False) -> float | None:
        """A watch's time until the earliest scheduled job, None for one already due while jobs
        others' locks hold are left: it may be one of them (wait_for_work). Unless the last read
        saw the earliest still ahead (`seen_ahead`): it fell due since, after the claim that
        left the locked ones, so it is none of them, and it wakes the watcher at its run_at (the
        claim again came up to poll_max_s later). A due job that is one of them still wakes it at
        most once: the next turn's first read does not see it ahead."""
        if due_in_s is not None and due_in_s <= 0 and self.locked_at is not None and not seen_ahead:
            return None
        return due_in_s

    # -------------------------------------------------------- the watch lock

    def acquire_watch(self) -> bool:
        """Block (bounded) until we are the watcher; False on timeout, interruption or reconnect."""
        generation = self.session.generation
        # Not waited again on a new connection: the wait would keep the worker here, holding the
        # seat of a session that may hold the process's liveness lock, before it re-registers.
        # After a server restart it waited out idle_wait_s (behind a peer's watcher) with the
        # lock free, past a reaper's restart grace, and its process's running jobs were taken
        # back as a dead consumer's.
        # (ended by the claim for held jobs: Worker._idle_with_locks makes it if the lock is another's)
        wait_s = self.until_claim_again(self._bounded(self.cfg.idle_wait_s))
        self._watch_wait_end = time.monotonic() + wait_s  # (a claim of ours that sets the claim again ends it)
        try:
            got = advisory.get_lock(self.session, self.locks.watch, wait_s, on_generation=generation)
        finally:
            self._watch_wait_end = None
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
        due_in_s = self._due_in(state.due_in_s)
        return state.total > state.watched or (due_in_s is not None and due_in_s <= 0)

    def release_watch(self, wait: bool = True, claimed: int | None = None) -> None:
        """Hand the watch on. wait=False sends the release without waiting for its reply: the
        next idle consumer is granted the watch while we already run our batch (`claimed`: a
        job of the claim just made, advisory.hand_watch_on)."""
        if self.watching:
            self.watching = False
            if self.session.current_conn is None:
                return  # the lock died with its connection: no connect to release it (a frozen server's 10 s)
            if wait:
                advisory.release_lock(self.session, self.locks.watch)
            else:
                advisory.hand_watch_on(self.session, self.locks.watch, self.queue, claimed)

    # -------------------------------------------------------- waiting for work

    def wait_for_work(self, safety_s: float = SAFETY_S) -> bool | None:
        """As the watcher: return True once there may be something to claim.

        That is: the enqueue count moved past the watched count, a scheduled job fell due, a
        producer rang the bell, or the claim for jobs a counter held back (recount_after) or
        another session's locks held (locked_out) is due. A bell grant returns at once, without
        reading the count again: the claim reads it itself in its first round trip
        (queries.claim, as_watcher), so a ring costs one statement here between the producer's
        release and the claim.

        Returns None when stopping, or when the watcher session reconnected (the caller must
        re-register first). The watch statement also reports the time until the earliest
        scheduled job, which bounds the next wait. After `safety_s` of silence it returns
        anyway, so one claim checks the jobs table: a belt for the braces of a lost wake-up
        nobody foresaw.

        While ready jobs another session holds locked are left (locked_out), a scheduled job
        already due when the turn's read comes is no reason to wake: it may be one of them (the
        claim's promotion skips a locked row), and it would wake every turn; it is claimed at the
        claim again, within poll_max_s. One this turn's last read saw still ahead fell due since,
        and wakes it at its run_at (_due_in).
        """
        generation = self.session.generation
        start = time.monotonic()
        backoff = self.cfg.poll_initial_s
        due_at: float | None = None
        # The bell to wait on: the one the previous statement saw held at its end. A new turn
        # does not know it yet, so its first statement only reads (bells.watch).
        wait_on: int | None = None
        paused = False  # what this turn's last statement read (an interrupted one reads nothing)
        first_wait = True  # no wait yet this turn: FIRST_WAIT_S bounds the first
        while not self.stop.is_set():
            self.on_turn()
            wait = self._bounded(min(backoff, self.cfg.poll_max_s))
            cut = first_wait and wait > FIRST_WAIT_S  # (the backoff then starts after it)
            if cut:
                wait = FIRST_WAIT_S
            if due_at is not None:
                wait = max(0.0, min(wait, due_at - time.monotonic()))
            if not paused:
                wait = self.until_claim_again(wait)
            sent = time.monotonic()  # due_in_s is measured before the statement's wait
            state = bells.watch(self.session, self.queue, self.locks, wait_on, wait,
                                use_bell=not self._suspect_bell, on_generation=generation, nap=self.nap)
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
                    self._fresh_wake()
                    return True
                # Paused when last read: a put's KILL still arrives, and a claim would only find
                # the pause again. Read again instead (the resume shows there).
                wait_on = None  # the statement ended early: it did not say which bell is held
                continue
            paused = state.paused
            waited_on, wait_on = wait_on, state.held
            if state.waited is not None:
                first_wait = False
            if state.reap:
                self.on_reap()
            if self._last_grant is not None and state.total != self._last_grant[1]:
                self._suspect_bell = False  # the count moved: rings are real again
            due_in_s = self._due_in(state.due_in_s, seen_ahead=due_at is not None)
            if not state.paused:
                if state.total > state.watched:
                    self.wakeups["signal"] += 1
                    self._fresh_wake()
                    return True
                if due_in_s is not None and due_in_s <= 0:
                    self.wakeups["due"] += 1
                    return True
                if self.claim_again_due():
                    return True
            # A paused queue ignores due jobs: waking for them would only find the pause again.
            due_at = None if state.paused or due_in_s is None else sent + due_in_s
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
                self._fresh_wake()
                return True
            if state.waited is None:  # did not wait: an instant wake interrupted the SLEEP
                continue
            if not cut:
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
        an idle consumer settles at one cheap read per poll_max_s. It ends at the claim for held
        jobs, and ignores due jobs while locked ones are left, as wait_for_work does.
        """
        start = time.monotonic()
        seen_ahead = False  # the last poll saw the earliest scheduled job still ahead
        while not self.stop.is_set():
            self.on_turn()
            total, paused, due_in_s, reap = bells.poll_signal(self.session, self.queue)
            due_in_s = self._due_in(due_in_s, seen_ahead)
            seen_ahead = not paused and due_in_s is not None and due_in_s > 0
            if reap:
                self.on_reap()
            if not paused:
                if total != self._last_total:
                    self._last_total = total
                    self._poll_backoff = self.cfg.poll_initial_s
                    self.wakeups["signal"] += 1
                    self._fresh_wake()
                    return True
                if due_in_s is not None and due_in_s <= 0:
                    self.wakeups["due"] += 1
                    return True
                if self.claim_again_due():
                    return True
            if time.monotonic() - start >= safety_s:
                self.wakeups["timeout"] += 1
                return True
            wait = min(self._poll_backoff, self.cfg.poll_max_s)
            if not paused and due_in_s is not None:
                wait = min(wait, due_in_s)
            if not paused:
                wait = self.until_claim_again(wait)
            self.stop.wait(wait)
            self._poll_backoff = min(self._poll_backoff * 2, self.cfg.poll_max_s)
        return False
