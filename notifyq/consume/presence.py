"""Presence: one consumer process on one database, its liveness and its watchers.

A process opens, per database, one watcher session per queue, and each of its workers one work
session (claims and acks): workers + queues sessions, plus one heartbeat session when it is
judged by heartbeat (polling mode, or a Galera node). That is at most workers + queues + 1,
and one more (lineup.py) from the first time jobs of a batch still wait behind a running one
batch_target_s after their claim.

A watcher session is lent to one idle worker of its queue at a time (`WatchSeat.seat`): that
worker queues for the queue's watch lock (across processes), watches the bell, claims as
the watcher and hands the watch lock on (notifyq/wakeup). The process's other idle workers of that
queue wait on a Condition for the seat, not in GET_LOCK, and cost the server nothing.

The first queue's watcher session (`home`) also holds the process's one liveness lock, for its
nq_consumer row, for all its queues and workers. Its server idle timeout is short
(consumer.session_idle_s), so the lock is freed soon after the host vanishes (no FIN); a live
process is never silent that long: an idle worker's watch statements talk on it, and while
nobody holds its seat (every worker of that queue busy, in handlers that may run for hours)
the keeper thread takes the seat and sends one tiny statement every session_idle_s / 4. A
stalled process (SIGSTOP) is judged the same way. In polling mode, and on a Galera node (whose
locks reapers on other nodes cannot see, liveness.py), a heartbeat (heartbeat.py) beats too.
The home session never leaves a connection that works: not to follow the process's other
sessions to a new Galera writer (Session.follows_writer), nor after a failed watch hand-on
(advisory.hand_watch_on): a reaper on its node would read the freed lock as a death.

Trust rules: the lock is taken before the row is written. When the home session reconnected
(a server restart, a KILL), the process first tries to take its old lock back, waiting a moment
(OLD_LOCK_WAIT_S) for a reaper that holds it while it judges it: that succeeds only once no
reaper holds it, and a reaper reclaims only while holding it, so either its claims are
untouched, or they were taken back and its acks are fenced by claim token; otherwise it
re-registers under a new id. A worker asks `ensure_registered` before every
claim: after its work session reconnected it first makes sure the lock is still held by the
home session, so nobody claims under an id a reaper already treats as dead.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time

from notifyq import errors
from notifyq.config import Config
from notifyq.consume import reaper
from notifyq.consume.heartbeat import Heartbeat
from notifyq.consume.lineup import ClaimSizer, LineupWatch
from notifyq.store import advisory, count_trust, liveness, locks, schema, slot_rows, workflows
from notifyq.store.db import Session
from notifyq.store.driver import DriverError, locks_unavailable
from notifyq.store.flow import FlowLimits
from notifyq.wakeup import Waiter

log = logging.getLogger("notifyq.consumer")

TOUCH_S = 60.0  # how often nq_consumer.last_seen is refreshed (information only)
# A registration in a restarted server's first second reads to a reaper as possibly the server's
# before the restart (liveness.restarted_since_s), which gets the restart grace: the row is
# touched again this long after that second ends, and from then on our death reads from our lock.
RETOUCH_AFTER_S = 0.05
PINGS_PER_IDLE = 4  # a ping or two may be slow or lost before the server's timeout is near
# How long a reconnected liveness session waits for its old lock. A reaper holds a consumer's lock
# while it judges it (liveness.reclaim_owner), for one transaction: it may find it alive after all
# (not back yet after a restart, within the grace) and let go. Taken at once for a death, that
# hold moved the process to a new id, and its old row, which still held the claims its handlers
# ran, read as dead once the grace ended: they were taken back. A reaper that did take them back
# lets go at its COMMIT, and our acks of them are fenced by claim token, as ever. Nobody else
# waits for a liveness lock, and the liveness session holds no row lock: no deadlock hides here.
OLD_LOCK_WAIT_S = 2.0
SEAT_POLL_S = 0.5  # a worker waiting for the home seat re-checks its registration this often
# After an outage our reaper passes wait this long with our heartbeat landing before they judge
# anyone by silence: as long as a free lock must go with a silent heartbeat on Galera.
SILENCE_TRUST_S = liveness.GALERA_LOCK_GRACE_S
# How often a process asks whether jobs are claimed by an owner with no registration (a consumer
# gone without settling them): a scan of the claimed range, so not in every reap check.
ORPHAN_CHECK_S = 10.0
# How often an idle process runs the workflow sweep's question (a busy one: every reap_interval_s)
SWEEP_IDLE_S = 10.0


class WatchSeat:
    """One queue's watcher session in this process, and its seat: which idle worker may use it now."""

    def __init__(self, config: Config, queue: str, stop: threading.Event, home: bool = False):
        """home: the session also holds the process's liveness lock (Presence)."""
        wait_s = int(config.wakeup.idle_wait_s + config.wakeup.poll_max_s) + 30
        idle_timeout_s = math.ceil(config.consumer.session_idle_s) if home else None
        # The home session stays on its node while its connection works (Session.follows_writer):
        # following the process's other sessions to a new writer would free the liveness lock,
        # and a reaper on the old node would take a live consumer's jobs back.
        self.session = Session(config.dsn, autocommit=True, read_timeout_s=wait_s,
                               idle_timeout_s=idle_timeout_s, name=f"watch-{queue}", stop=stop,
                               follows_writer=not home, retry_s=config.connect_retry(oneshot=False),
                               retry_setting="connect_retry_s", no_caller_deadline=True)
        self.waiter = Waiter(self.session, queue, locks.QueueLocks(config.dsn.database, queue),
                             config.wakeup, stop, on_turn=lambda: None, on_reap=lambda: None)
        self.stop = stop
        self._seat = threading.Condition()
        self._holder: object | None = None  # who uses the session, None: free

    def seat(self, holder, timeout_s: float) -> bool:
        """Take the session; False when someone else still has it at the timeout, or stopping."""
        with self._seat:
            if not self._seat.wait_for(lambda: self._holder is None or self.stop.is_set(), timeout_s):
                return False
            if self.stop.is_set():
                return False
            self._holder = holder
            return True

    def holds(self, holder) -> bool:
        return self._holder is holder

    def leave(self, holder) -> None:
        """Give the seat up (a no-op once given up)."""
        with self._seat:
            if self._holder is holder:
                self._holder = None
                self._seat.notify()

    def wake_all(self) -> None:
        with self._seat:
            self._seat.notify_all()


class Presence:
    def __init__(self, config: Config, queues: list[str], stop: threading.Event):
        self.config = config
        self.queues = list(dict.fromkeys(queues))
        self.stop = stop
        self.use_locks = config.wakeup.use_locks
        # Fixed for the process's life: the home session's server idle timeout is set when it
        # connects, and its keeper must ping well inside that, whatever a reload says.
        self.session_idle_s = config.consumer.session_idle_s
        self.watch_seats = {q: WatchSeat(config, q, stop, home=i == 0) for i, q in enumerate(self.queues)}
        self.home = self.watch_seats[self.queues[0]]  # its session holds the liveness lock
        # Jobs of mixed duration (lineup.py): claims sized by each queue's time per job, shared by
        # its workers, and the jobs waiting behind a long one handed back.
        self.claim_sizers = {q: ClaimSizer() for q in self.queues}
        self.lineup = LineupWatch(config, stop)
        self.session = self.home.session
        self.consumer_id = ""
        self.heartbeat: Heartbeat | None = None  # judged by heartbeat: polling, or a Galera node
        self._registered_generation = -1
        # Bumped at every (re-)registration: a claim made under an earlier one may have been
        # taken back while the lock was free, even when the old id came back with it.
        self.epoch = 0
        self._lock_seen_at = -math.inf  # monotonic: a work session last saw the home session hold the lock
        # Set by the service when its start-up probe could not reach the server: the schema there
        # is checked at the first registration, before any claim (schema.require_current), and a
        # mismatch is told as "{unchecked}: ...", the name the service's composer gives the server.
        self.unchecked: str | None = None
        self._next_touch = 0.0
        self.flow_applied = self.flow_record()  # what the workers' claims apply (a reload changes it)
        self._flow_recorded: str | None = None  # what our row says we apply
        self._flow_writer = threading.Lock()  # one reload's prompt record at a time (reload)
        self._next_reap = 0.0
        self._next_orphan_check = 0.0
        self._next_sweep = 0.0
        self._reap_mutex = threading.Lock()
        self.reaper_lock_seen = reaper.HeldLock()  # a stalled process's pass does not stop ours
        self._closed = threading.Event()
        self._wake_keeper = threading.Event()  # a touch came due sooner than the keeper's next turn
        self._keeper = threading.Thread(target=self._keep, name="notifyq-liveness", daemon=True)

    @property
    def wakeup_mode(self) -> str:
        return "locks" if self.use_locks else "polling"

    # -------------------------------------------------------- registration

    def registration_current(self) -> bool:
        """Registered, and (lock mode) on the home session's present connection: no statement."""
        return bool(self.consumer_id) and not (self.heartbeat is not None and self.heartbeat.lost.is_set()) \
            and (not self.use_locks or self.session.generation == self._registered_generation)

    def ensure_registered(self, holder, work: Session | None = None) -> str:
        """The id to claim under, (re-)registered first if need be. `work`: the caller's work
        session, when it reconnected since the caller's last claim. If the server restarted,
        the home session died too, maybe unnoticed yet: then our lock is not held by it, and
        we re-register (taking the old lock back if we can) before the claim."""
        seated = self.home.holds(holder)  # then _check costs nothing, but a due touch
        if self.registration_current() and not seated:
            if work is None or not self.use_locks:
                return self.consumer_id
            # Asked on the work session: no need to wait for the home seat.
            asked_at = time.monotonic()
            if advisory.lock_holder(work, self._lock_name()) == self.session.connection_id:
                self._lock_seen_at = asked_at
                return self.consumer_id
        while not seated:
            if self.home.seat(holder, SEAT_POLL_S):
                break
            if self.stop.is_set():
                return self.consumer_id
            if self.registration_current() and work is None:
                return self.consumer_id  # someone else (re-)registered meanwhile
        try:
            if work is not None and self.consumer_id and self.use_locks:
                advisory.lock_holder(self.session, self._lock_name())  # a dead connection reconnects
            self._check()
        finally:
            if not seated:
                self.home.leave(holder)
        return self.consumer_id

    # -------------------------------------------------------- do we still hold our claims?

    def known_alive(self, now: float) -> bool:
        """Whether the process knows, without a statement, that no reaper can have judged it
        dead: its heartbeat, if it beats one, landed less than half the shortest silence a
        reaper takes for death ago; else its liveness lock was seen held, on the connection it
        was registered on, less than half a session_idle_s ago (the server ends that connection
        only after a whole one of silence; a stall of the process, SIGSTOP, is such silence),
        and the server has not closed that connection since (a KILL of it)."""
        if self.heartbeat is not None:
            return not self.heartbeat.lost.is_set() and self.heartbeat.landed_within(
                liveness.GALERA_LOCK_GRACE_S / 2, now)
        if not self.use_locks or not self.registration_current():
            return False
        answered, locked = self.session.answered_at, self._lock_seen_at
        seen = answered if answered > locked else locked  # (max() is a call, before every job)
        # And its connection was not ended since (a KILL of the liveness session frees the lock
        # at once, and a peer's reaper took the jobs back within its reap interval, while this
        # process, its session idle, had not heard yet): the server's close is on the socket.
        return now - seen < self.session_idle_s / 2 and not self.session.closed_by_server()

    def confirm_alive(self, holder, work: Session) -> None:
        """When known_alive is not: one check (a beat, or the lock's holder asked on `work`),
        and a re-registration if it failed (a new epoch, maybe a new id)."""
        if self.heartbeat is not None:
            self.heartbeat.beat()  # finds our row gone if a reaper judged us: lost is set
            self.ensure_registered(holder)
        else:
            self.ensure_registered(holder, work)

    def _lock_name(self, consumer_id: str | None = None) -> str:
        return locks.consumer_lock(self.config.dsn.database, consumer_id or self.consumer_id)

    def _check(self) -> None:
        """Holding the home seat: register, or re-register if the home session reconnected or a
        reaper judged our heartbeat stale; refresh the row's last_seen now and then."""
        if not self.consumer_id:
            self._register()
        elif self.heartbeat is not None and self.heartbeat.lost.is_set():
            # A reaper found our heartbeat stale (a stall longer than POLLING_STALE_S) and took
            # our claims back; our acks of them are fenced. Carry on under a new id.
            self.heartbeat.lost.clear()
            old = self.consumer_id
            self._register()
            log.warning("heartbeat was judged stale, re-registered consumer=%s old=%s", self.consumer_id, old)
        elif self.use_locks and self.session.generation != self._registered_generation:
            old = self.consumer_id
            self._register(old_id=old)
            log.warning("liveness session reconnected: liveness lock %s consumer=%s",
                        "taken back" if self.consumer_id == old else "lost, re-registered", self.consumer_id)
        if self._keeper.ident is None:  # registered: from now on the home session is kept alive
            self._keeper.start()
        now = time.monotonic()
        if now >= self._next_touch:
            self._next_touch = now + TOUCH_S
            liveness.touch_consumer(self.session, self.consumer_id, self.wakeup_mode)
        flow = self.flow_applied
        if flow != self._flow_recorded:  # a reload changed them: recorded at the next check too
            liveness.record_consumer_flow(self.session, self.consumer_id, flow)
            self._flow_recorded = flow

    def flow_record(self) -> str:
        """The flow settings this process applies, per queue it consumes (QueueConfig.flow_settings),
        as its row records them: JSON, for the console's flow pages; and whether its claims of
        each keep the per-key counters (`counts`: store/count_trust.py)."""
        return json.dumps({q: {**self.config.queue(q).flow_settings,
                               **count_trust.counts_member(FlowLimits.of(self.config.queue(q)).counts)}
                           for q in self.queues},
                          sort_keys=True, separators=(",", ":"))

    def _register(self, old_id: str | None = None) -> None:
        """Liveness lock first, then the row: a row is never visible without its lock held."""
        if self.unchecked is not None:
            try:
                schema.require_current(self.session)
            except (errors.SchemaError, errors.UnsupportedServer) as e:
                raise type(e)(f"{self.unchecked}: {e}") from None
            self.unchecked = None
        # Before any claim, retry or due job's promotion bumps them (store/slot_rows.py)
        slot_rows.make(self.config.dsn, self.queues, retry_s=self.session.retry_s,
                       retry_setting=self.session.retry_setting)
        if old_id and advisory.get_lock(self.session, self._lock_name(old_id), OLD_LOCK_WAIT_S) == 1:
            self.consumer_id = old_id
        else:
            self.consumer_id = os.urandom(16).hex()  # as random as uuid4, without its import
            old_id = None
        if self.use_locks and old_id is None:
            try:
                if advisory.get_lock(self.session, self._lock_name(), 5) != 1:
                    raise RuntimeError("could not take a fresh liveness lock")
            except DriverError as e:
                if not locks_unavailable(e):
                    raise
                self._polling(e)
        locked_on = self.session.generation
        flow = self.flow_applied
        liveness.register_consumer(self.session, self.consumer_id, self._lock_name(), os.uname().nodename,
                                   os.getpid(), self.queues, self.wakeup_mode, node=self.session.node, flow=flow)
        self._flow_recorded = flow
        if self.use_locks and self.session.generation != locked_on:
            # The session reconnected between the lock and the row (a server restart, a KILL), and
            # the row was written again without the lock: it would read as ours on the new server,
            # and our free lock as our death (a reaper's restart grace, liveness.restarted_since_s).
            self._register(old_id=self.consumer_id)
            return
        if not self.use_locks or self.session.galera:
            # On a Galera node our lock is invisible to reapers on the other nodes: they judge
            # us by heartbeat (liveness.py), so we beat too.
            self._start_heartbeat()
        self._registered_generation = self.session.generation
        self.epoch += 1
        first_second_left_s = liveness.first_second_left_s(self.session) if self.use_locks else None
        self._next_touch = time.monotonic() + (
            TOUCH_S if first_second_left_s is None else first_second_left_s + RETOUCH_AFTER_S)
        if first_second_left_s is not None:
            self._wake_keeper.set()  # it may be asleep for a whole ping interval
        log.debug("registered consumer=%s queues=%s wakeup=%s", self.consumer_id,
                  ",".join(self.queues), self.wakeup_mode)

    def _start_heartbeat(self) -> None:
        """From now on we are judged by heartbeat (the row says wakeup=polling after the first
        beat, which runs here, before the next claim)."""
        if self.heartbeat is None:
            self.heartbeat = Heartbeat(self.config.dsn, lambda: self.consumer_id, "consumer",
                                       wakeup=lambda: self.wakeup_mode)
            self.heartbeat.start()
        self.heartbeat.beat()

    def _keep(self) -> None:
        """While no worker holds the home seat, keep the home session talking."""
        while not self._closed.is_set():
            if self._wake_keeper.wait(self._keeper_wait_s()):
                self._wake_keeper.clear()  # a touch due sooner, or the close: wait anew
                continue
            if not self.home.seat(self, 0):
                continue  # a worker has the session: its own statements keep it alive
            try:
                advisory.keep_alive(self.session)
                self._check()  # a reconnect: take the old lock back at once
            except Exception as e:  # the next turn (or a worker's next claim) tries again
                log.warning("liveness session keepalive failed error=%s", e)
            finally:
                self.home.leave(self)

    def _keeper_wait_s(self) -> float:
        """A ping's interval, or less when a touch is due sooner (RETOUCH_AFTER_S): a busy process
        touches its row nowhere else but in a reaper pass's check, every reap_interval_s. (A
        touch overdue is the seat holder's to do: its next _check.)"""
        ping_s = self.session_idle_s / PINGS_PER_IDLE
        due_s = self._next_touch - time.monotonic()
        return min(ping_s, due_s + 0.01) if due_s > 0 else ping_s

    def fall_back_to_polling(self, exc: BaseException) -> None:
        """A watcher's statement was refused (a proxy may pass GET_LOCK alone): poll from now on."""
        if self.use_locks:
            self._polling(exc)
            if self.consumer_id:
                self._start_heartbeat()

    def _polling(self, exc: BaseException) -> None:
        self.use_locks = False
        log.warning("advisory locks unavailable (%s): falling back to polling the signal "
                    "row; liveness by heartbeat and lease", exc.args[0] if exc.args else exc)

    # -------------------------------------------------------- the reaper, run by consumers

    def reap_due(self) -> bool:
        """Whether maybe_reap would look now (a hint: another worker may take the turn first)."""
        return time.monotonic() >= self._next_reap

    def maybe_reap(self, holder, session: Session, check: bool = True) -> int:
        """A reaper pass at most every reap_interval_s per process; jobs that came back.

        The question whether a pass is needed goes on the home session when nobody holds its
        seat, on purpose: a busy process touches it nowhere else but in the keeper's pings, so
        a home session that died (KILL, network) would go unnoticed while its workers claim
        under an id whose lock is free. Here it reconnects, and the process takes its lock back
        (or re-registers) before the pass, and before the next claim. Else `session`, the
        caller's: a worker holding the seat talks on the home session anyway."""
        with self._reap_mutex:
            now = time.monotonic()
            if now < self._next_reap:
                return 0
            self._next_reap = now + self.config.consumer.reap_interval_s
        if check:
            if self.home.seat(holder, 0):
                try:
                    needed = self._reap_needed(self.session) or self.orphans_found(self.session)
                    self._check()
                finally:
                    self.home.leave(holder)
            else:
                needed = self._reap_needed(session) or self.orphans_found(session)
            if not needed:
                self.sweep_if_due(session)
                return 0
        result = self.reap_pass()
        return 0 if result is None else result.reclaimed + result.expired

    def reap_pass(self) -> reaper.ReapResult | None:
        """One reaper pass by this process: never judging its own consumer, and, on a server
        that has just restarted, judging nobody it has not heard from since until every live
        consumer has had the time to take its lock back: two keeper pings (a keeper pings at
        session_idle_s / 4, and the first may meet the server still starting), or three beats.
        None when another pass is running; an empty result when this one failed."""
        restart_grace_s = max(self.session_idle_s / PINGS_PER_IDLE * 2, liveness.GALERA_LOCK_GRACE_S)
        try:
            return reaper.reap_once(self.config.dsn, self.use_locks, self.may_judge_by_silence(),
                                    own_id=self.consumer_id, restart_grace_s=restart_grace_s,
                                    held=self.reaper_lock_seen, retry_s=self.config.connect_retry(oneshot=False))
        except errors.GrantMissing:
            raise  # not housekeeping's to skip: the worker ends with exit 3, as for any refused grant
        except errors.DatabaseError as e:  # unreachable, or lost past its retries
            # A pass is housekeeping on a session of its own, whose short retry budget a stop
            # of this process (SIGSTOP, a VM pause) or an outage can use up: its failure is not
            # the worker's, whose own session retries on its own budget. The next pass is due
            # in reap_interval_s; until then nothing came back.
            log.warning("reaper pass failed, the next one is due in %gs error=%s",
                        self.config.consumer.reap_interval_s, e)
            return reaper.ReapResult()

    def sweep_if_due(self, session: Session, idle: bool = False) -> None:
        """The workflow sweep (store/workflows.settle) at most every reap_interval_s per process
        (idle: every SWEEP_IDLE_S, an idle fleet's cost is a statement a second), on `session`,
        whether or not a reaper pass is needed (a pass runs it too): one read, and the sweep
        only when it finds work. Edges only it settles come with no death to set off a pass: a
        put on a caller's connection whose transaction was still open when its parent ended
        (the parent's release could not see the new edge, and never waits for it).
        Housekeeping: its failure is logged, the next one is due soon."""
        with self._reap_mutex:
            now = time.monotonic()
            if now < self._next_sweep:
                return
            self._next_sweep = now + max(self.config.consumer.reap_interval_s, SWEEP_IDLE_S if idle else 0.0)
        try:
            settled = workflows.settle(session) if workflows.sweep_needed(session) else 0
        except errors.DatabaseError as e:
            log.warning("workflow sweep failed, the next one is due in %gs error=%s",
                        self.config.consumer.reap_interval_s, e)
            return
        if settled:
            log.info("workflow parents settled by the sweep parents=%d", settled)

    def may_judge_by_silence(self) -> bool:
        """Whether our reaper passes may take others' silence for death: not until our own
        heartbeat, if we beat one, has landed steadily for SILENCE_TRUST_S (reaper.reap)."""
        return self.heartbeat is None or self.heartbeat.steady_s() >= SILENCE_TRUST_S

    def orphans_found(self, session: Session) -> bool:
        """Every ORPHAN_CHECK_S per process, in lock mode off Galera (as reaper.reap judges
        them; else False at once): whether any job is claimed by an owner with no registration."""
        now = time.monotonic()
        if not self.use_locks or session.galera or now < self._next_orphan_check:
            return False
        self._next_orphan_check = now + ORPHAN_CHECK_S
        return liveness.orphans_exist(session)

    @staticmethod
    def _reap_needed(session: Session) -> bool:
        try:
            return liveness.reap_needed(session) > 0
        except DriverError as e:  # a polling consumer's server may refuse the lock test
            if not locks_unavailable(e):
                raise
            return True

    # -------------------------------------------------------- reload and shutdown

    def reload(self, config: Config) -> None:
        self.config = self.lineup.config = config
        self.flow_applied = self.flow_record()
        for seat in self.watch_seats.values():
            seat.waiter.cfg = config.wakeup
        if self.consumer_id and self.flow_applied != self._flow_recorded:
            # The liveness check runs when a worker next takes the home seat: an idle process's
            # may be a minute away. The console promises the row within seconds, so recorded now,
            # on a session of its own; the check records them again (and on its own should this fail).
            threading.Thread(target=self._record_flow_now, name="notifyq-flow-record", daemon=True).start()

    def _record_flow_now(self) -> None:
        """The flow settings applied now, on the row of our id now: the latest reload's, whichever
        thread writes last (the writer lock)."""
        with self._flow_writer:
            if self._closed.is_set() or not self.consumer_id:
                return
            session = Session(self.config.dsn, autocommit=True, retry_s=2, name="flow-record")
            try:
                liveness.record_consumer_flow(session, self.consumer_id, self.flow_applied)
            except Exception as e:  # best effort: the next liveness check records them
                log.warning("could not record the reloaded flow settings, the next liveness check does "
                            "consumer=%s error=%s", self.consumer_id, e)
            finally:
                session.close()

    def mark_stopping(self, session: Session) -> None:
        """At stop, first: the registration says so, and should this process die before it
        settles its claims, a reaper gives them back interrupted, not charged."""
        if self.consumer_id:
            liveness.mark_stopping(session, self.consumer_id)

    def interrupt_waits(self, killer: Session) -> None:
        """At stop: wake the workers waiting for a seat, and KILL QUERY the watchers' waits
        (in GET_LOCK or SLEEP, they would notice the stop only at their timeout)."""
        for seat in self.watch_seats.values():
            seat.wake_all()
            conn_id = seat.session.connection_id
            if conn_id and seat.session.connected:  # (a shard that is down: nothing waits there)
                try:
                    advisory.kill_query(killer.conn.cursor(), conn_id)
                except Exception as e:  # best effort: the wait ends by its own timeout anyway
                    log.debug("could not interrupt watcher=%s error=%s", seat.session.name, e)

    def close(self) -> None:
        """After the workers: the row goes, then the sessions (which free every lock at once)."""
        self._closed.set()
        self._wake_keeper.set()
        self.lineup.close()  # (stopped: it hands back nothing more; a stuck worker's batch is abandon's)
        if self._keeper.is_alive():
            self._keeper.join(30)
        if self.heartbeat is not None:
            self.heartbeat.stop()  # first: a beat after the row is gone would only log
            self.heartbeat = None
        try:
            if self.consumer_id and not liveness.unregister_unclaiming(self.session, self.consumer_id):
                log.warning("exiting while holding claimed jobs: the registration stays, and the next "
                            "reaper pass takes them back consumer=%s", self.consumer_id)
        except Exception as e:  # the reaper cleans up whatever we could not
            log.warning("could not unregister consumer=%s error=%s", self.consumer_id, e)
        for seat in self.watch_seats.values():
            seat.session.close()
