"""Worker: one queue's idle -> claim -> run loop, on its own work session. It waits for work,
claims a batch, and hands it to its run (batch.py), whose successes it acks with its next claim
(acking.py).

The work session runs claims and acks (short READ COMMITTED transactions). Everything else a
worker needs from the database is its process's, shared by all its workers (presence.py): the
liveness lock and registration, whose id every claim is made under, and its queue's watcher
session, which the worker borrows while it is idle and the seat is free. A worker asks the
presence for the id before every claim: after a lost liveness session that id is either the
old one taken back or a new one, and acks of the old claims are fenced by claim token, so they
can never touch a job someone else now holds.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from notifyq import errors
from notifyq.config import Config, QueueConfig
from notifyq.consume import handlers, reaper
from notifyq.consume.acking import PendingAcks
from notifyq.consume.batch import Batch, BatchRun
from notifyq.consume.claim_backoff import ClaimBackoff
from notifyq.consume.fair_order import round_robin_by_key
from notifyq.consume.handler import Handler, declared
from notifyq.consume.outcomes import Outcomes
from notifyq.consume.presence import Presence
from notifyq.consume.slots import SlotWake
from notifyq.consume.stats import Budget, Stats
from notifyq.consume.timeout import HandlerCaller
from notifyq.store import advisory, liveness, queries
from notifyq.store.db import Session
from notifyq.store.driver import DriverError, locks_unavailable
from notifyq.store.rates import Rates
from notifyq.store.flow import FlowClaims
from notifyq.wakeup.nap import NapLock
from notifyq.wakeup.queue_wakes import QueueWakes

log = logging.getLogger("notifyq.consumer")

SETTLE_AFTER_STOP_S = 2.0  # how long abandon lets a worker whose command was killed settle its batch
GONE_LEASE_MARGIN_S = 0.05  # past a gone owner's lease end (the server's clock), so the next pass finds it expired
# --exit-when-empty, a claim that a limit left empty: claim again after this, doubling up to the
# most (a slot freed by another process has no wake a cron run's worker waits on)
LIMIT_HELD_FIRST_S = 0.01
LIMIT_HELD_MAX_S = 0.25
# A limited claim that came back empty because peers' claims held the rows of its jobs' keys
# claims again at once, this many times in a row at most, before it waits for a wake: those
# claims hold the rows only until their COMMIT, a few milliseconds (store/key_gate.py), and
# the slots their jobs leave are this claim's to take; idle, it waited for the next wake (one
# of two consumers idle for a batch's run, a claim in three under load)
CONTENDED_AGAIN = 2


class Worker:
    def __init__(self, config: Config, queue: str, handler: Handler, *, stop: threading.Event,
                 budget: Budget, batch_size: int | None = None, exit_when_empty: bool = False,
                 name: str = "worker", presence: Presence | None = None,
                 grace_over: threading.Event | None = None):
        self.config = config
        self.queue = queue
        self.qc = config.queue(queue)
        self.handler = declared(handler)
        self.stop = stop
        # Set at the shutdown grace's end (the service's; without one, the stop itself). The
        # work sessions' connect retries end then while a batch runs (RetryStop), not at the
        # stop: a server that restarts during the grace would end a running command's lease
        # extension at once, and with it the job, which needed only the grace to finish.
        self.grace_over = grace_over if grace_over is not None else stop
        # The code version it claims for (consumer.version, --version): fixed for the process's
        # life, as its code is; jobs put with a higher min_version are not its to claim.
        self.version = config.consumer.version
        self.budget = budget
        self.batch_size = batch_size or self.qc.batch_size
        self.exit_when_empty = exit_when_empty
        self._held_s: float | None = None  # the last claim's: a rate held jobs back this long
        self._limit_wait_s = LIMIT_HELD_FIRST_S  # --exit-when-empty: the next wait after a limit held jobs
        self._contended = 0  # empty claims in a row that peers' key locks left empty (CONTENDED_AGAIN)
        # The watcher's last claim came back empty, yet ready jobs are left that no limit or rate
        # holds: another session holds their rows (_locked_out). It keeps the watch and claims
        # again when the queue's Waiter says (Waiter.locked_out).
        self._locked_out = False
        self.name = name
        self.stats = Stats()
        self.outcomes = Outcomes(queue, self.qc, self.stats)
        self.work = self._new_work_session()
        # Without a presence (tests, benchmarks) the worker is a process of its own.
        self._owns_presence = presence is None
        self.presence = presence if presence is not None else Presence(config, [queue], stop)
        self.watch_seat = self.presence.watch_seats[queue]
        self._work_generation = -1  # the work session's generation when last checked
        self.last_turn = time.monotonic()
        self.caller = HandlerCaller(name, self.stats, self._turned)
        self.current_run: BatchRun | None = None  # the claim being run; the service may abandon it at shutdown
        # The last run that ended without settling its batch (its ack or give-back met the server
        # away, as at the shutdown grace's end): the shutdown settles it (abandon)
        self.unsettled: BatchRun | None = None
        self.finished = False
        self.error: BaseException | None = None  # why run() ended early, if it did
        self._exit_deadline: float | None = None  # --exit-when-empty: waiting for a reaper pass
        # The last batch's successes, which ride the next claim unless the worker does
        # anything else first (then they are flushed: acked on their own)
        self.acks = PendingAcks(self.outcomes)
        # Workflow children its acks release on other queues: their idle consumers woken
        self.release_wake = QueueWakes(config, queue)  # the queues its outcomes release children on
        self.outcomes.on_release = self.release_wake.wake
        self.flow = FlowClaims.for_queue(self.qc)  # limits and fairness (None: a plain claim)
        self.claim_backoff = ClaimBackoff(queue, name)  # claims that gave up on lock conflicts
        self.slot_wake: SlotWake | None = None  # a limited queue's wake when a slot frees
        self.watch_waits_ended = 0  # _end_watch_wait's KILLs (tests read it)
        self.nap = NapLock(config.dsn.database)  # what its watch waits in without a bell, held on its work session
        self._arm_slot_wake()

    @property
    def waiter(self):
        """The queue's wake-up state in this process (shared by its workers of this queue)."""
        return self.watch_seat.waiter

    @property
    def in_handler_since(self) -> float | None:
        return self.caller.in_handler_since

    @property
    def use_locks(self) -> bool:
        return self.presence.use_locks

    @property
    def consumer_id(self) -> str:
        return self.presence.consumer_id

    # -------------------------------------------------------- life cycle

    def run(self) -> None:
        try:
            self.presence.ensure_registered(self)  # registered before anything else
            busy = True
            while not self.stop.is_set() and not self.budget.exhausted:
                self._turned()
                if busy:
                    self.claim_backoff.wait(self.stop)  # (a claim or ack that lost conflicts: its turn)
                    # Before the claim: a consumer that just started (a cron run, a restart)
                    # first takes back what dead peers hold, then claims in order among it.
                    # A pass can take long: what ran is acked before it.
                    if self.presence.reap_due() and not self._flush_acks():
                        continue
                    self._maybe_reap()
                    got, drained = self._claim_and_run()
                    if self.claim_backoff.failing:
                        continue  # claim again: the jobs are there, a lock holder kept them
                    if not got and self.exit_when_empty:
                        if self.acks.released_children():
                            # The acks riding this claim released workflow children after its
                            # read: they are ready now, and this run's to take (the chain's next job)
                            continue
                        if self._held_s is not None:
                            # A rate held ready jobs back: they are not gone, they wait for its
                            # refill; a cron run waits for it too, instead of leaving them.
                            self.stop.wait(self._held_s)
                            continue
                        if self._held_by_limits():
                            # A limit held ready jobs back: the running jobs that hold their
                            # slots (another worker's, another process's) free them as they end;
                            # a cron run waits for that and claims again, as it waits for a
                            # rate's refill, instead of leaving them (its other workers exited
                            # at their first empty claim, and one worker ran the queue alone)
                            with self.presence.lineup.idling(self.queue):  # it takes what a batch hands back
                                self.stop.wait(self._limit_wait_s)
                            self._limit_wait_s = min(2 * self._limit_wait_s, LIMIT_HELD_MAX_S)
                            continue
                        if self._reap_before_exit():
                            continue  # a dead peer's jobs came back: they are ours to run
                        break
                    self._limit_wait_s = LIMIT_HELD_FIRST_S
                    # --exit-when-empty never idles: it claims until a claim comes back empty.
                    # Children its acks released (workflows) are claimed at once, not at the wake-up
                    contended = not got and not drained and self._contended_claim()
                    if got:
                        self._contended = 0
                    busy = (self.exit_when_empty or (got > 0 and not drained) or contended
                            or self.acks.released_children())
                else:
                    if not self._flush_acks():  # an idle worker's jobs are acked before it waits
                        busy = True
                        continue
                    busy = self.acks.released_children() or self._idle() or self.claim_backoff.failing
            self.acks.flush(self.work)
        except errors.TransientDBError as e:
            if not self.stop.is_set():
                self.error = e
                log.error("worker failed queue=%s worker=%s error=%s", self.queue, self.name, e)
            else:  # asked to stop while the server was unreachable: the retry ended at once
                log.info("worker stopped while retrying queue=%s worker=%s error=%s", self.queue, self.name, e)
        except BaseException as e:  # (not only Exception: whatever ends the loop is the worker's failure)
            self.error = e
            log.error("worker failed queue=%s worker=%s error=%s", self.queue, self.name, e,
                      exc_info=not isinstance(e, errors.NotifyqError))
        finally:
            # After a failure of ours, what ran is acked if the server answers. Not after the
            # server's: that would only wait out another connect retry; those jobs run again.
            # (After a missing grant, a claim refused with acks on it left them here: given back.)
            if isinstance(self.error, errors.GrantMissing):
                with contextlib.suppress(errors.NotifyqError):
                    self.acks.flush(self.work)
            if not isinstance(self.error, errors.DatabaseError):
                try:
                    self.acks.flush(self.work)
                except Exception as e:
                    log.warning("could not ack finished jobs: a stopping consumer acks them as it exits if "
                                "the server answers, else they run again queue=%s error=%s", self.queue, e)
            self.finished = True
            self.caller.close()
            handlers.close_loop()  # a coroutine handler's event loop lives as long as its thread
            self.work.close()
            if self.slot_wake is not None:
                self.slot_wake.close()
            self.release_wake.close()
            if self._owns_presence:
                self.presence.close()

    def reload(self, config: Config, batch_size: int | None = None) -> None:
        """A reload's config: claims from the next on (the batch under way keeps its lease and
        handler), and the retry backoff of every failure recorded from now on."""
        self.config = config
        self.qc = self.outcomes.qc = config.queue(self.queue)
        self.batch_size = batch_size or self.qc.batch_size
        self.flow = FlowClaims.for_queue(self.qc)
        # Their wakers keep the config they were made with, until told (wakeup.instant_wake)
        self.release_wake.reload(config)
        if self.slot_wake is not None:
            self.slot_wake.reload(config)
        self._arm_slot_wake()

    def _arm_slot_wake(self) -> None:
        """A limited queue's outcomes wake the watcher for the jobs a limit held back."""
        if self.qc.limited and self.slot_wake is None:
            self.slot_wake = SlotWake(self.config, self.queue, self.waiter.locks)
        self.outcomes.freed = self.slot_wake.freed if self.qc.limited and self.slot_wake else None

    def _held_by_limits(self) -> bool:
        """After an empty claim of a limited queue: ready jobs are left that a limit held back
        (running jobs hold their slots) or a peer's claim was taking (its keys' rows locked).
        Asked of the queue, not of the claim's read: that read is a page of the keys, and it
        may not have seen the key a limit holds."""
        if self.flow is None or not self.flow.limits.limited or self.flow.last is None:
            return False  # (no flow read: a paused queue's claim makes none)
        return queries.ready_left(self.work, self.queue, self.version)

    def _held_by_other_locks(self, claim: queries.Claim) -> bool:
        """After an empty idle claim: ready jobs (or due ones) are left that neither a pause, a
        rate nor a limit held back, so another session holds their rows (the claim skipped them,
        or its promotion of due jobs did: the due_ids statement). One
        plain read, after empty claims only. A peer's claim under way looks the same for a few
        milliseconds: then the next claim, after the shortest wait, finds them taken."""
        if claim.paused or claim.held_s is not None or self.stop.is_set():
            return False  # (the watch statement wakes for a resume, and for a rate's refill)
        last = self.flow.last if self.flow is not None else None
        if last is not None and (last.held_keys or last.queue_full):
            return False  # a limit holds them: their slots' ends wake the watcher (SlotWake)
        return queries.claimable_left(self.work, self.queue, self.version)

    def _contended_claim(self) -> bool:
        """After an empty claim that did not drain the queue: whether to claim again at once,
        since only peers' claims under way held its keys' rows (CONTENDED_AGAIN)."""
        if self.flow is None or self.flow.last is None or not self.flow.last.contended:
            self._contended = 0
            return False
        self._contended += 1
        if self._contended > CONTENDED_AGAIN:
            self._contended = 0
            return False
        return True

    def _turned(self) -> None:
        self.last_turn = time.monotonic()

    def _idle_turn(self) -> None:
        """Each turn of an idle wait: the watch statement tells of dead peers and expired
        leases, not of claims whose owner has no registration; those are asked on the idle
        work session now and then (Presence.orphans_found)."""
        self._turned()
        if self.presence.orphans_found(self.work):
            self._maybe_reap(check=False)
        else:  # an idle process settles what only the sweep can (Presence.sweep_if_due)
            self.presence.sweep_if_due(self.work, idle=True)

    # -------------------------------------------------------- idle

    def _idle(self) -> bool:
        """Wait for work without touching the jobs table; True when more work is likely.

        One idle worker of the queue per process holds the seat and watches (or polls);
        the others wait here for the seat, turning their loop every idle_wait_s."""
        if not self.watch_seat.seat(self, self.waiter.until_claim_again(self.config.wakeup.idle_wait_s)):
            # The seat's worker may be queued for the watch lock behind another process's
            # watcher until idle_wait_s, its wait begun before a claim of ours held jobs back
            # (counters whose trust has ended now, Waiter.recount_after; others' locks,
            # Waiter.locked_out): the claim is made here
            return self.waiter.claim_again_due()
        self.waiter.on_turn, self.waiter.on_reap = self._idle_turn, self._reap_soon
        try:
            # The home session (our first queue's watcher) holds the liveness lock: if it
            # reconnected, the lock is taken back or renewed here, before we wait or claim.
            self.presence.ensure_registered(self)
            if not self.presence.use_locks:
                if not self.waiter.poll_for_work():
                    return False
                got, drained = self._claim_and_run(before_run=self._hand_poll_on)
                return got > 0 and not drained
            try:
                return self._idle_with_locks()
            except DriverError as e:  # a proxy may pass GET_LOCK alone but refuse the watch statement
                if not locks_unavailable(e):
                    raise
                self.presence.fall_back_to_polling(e)
                return True
        finally:
            self.watch_seat.leave(self)  # (already left when the watch was handed on)

    def _idle_with_locks(self) -> bool:
        self.waiter.nap = self.nap.held(self.work)  # (taken once per connection of the work session)
        if not self.waiter.acquire_watch():
            # Timed out or interrupted: the loop turns, then we queue up again, unless work
            # waits that the watcher should have handed on by now (its host may be gone), or
            # a claim of ours held jobs back (counters whose trust has ended now, others' locks):
            # the watcher, another process's, knows nothing of it (Waiter.recount_after, locked_out)
            if self.waiter.watch_timed_out and self.waiter.claim_again_due():
                return True
            if self.waiter.watch_timed_out and self.waiter.watcher_overdue():
                log.warning("stalled: jobs are ready and the watcher has not handed them on for %g s "
                            "(its host may be gone, or its session stuck): claiming them here queue=%s",
                            self.config.wakeup.idle_wait_s, self.queue)
                return True
            return False
        try:
            while True:
                if not self.waiter.wait_for_work():
                    return False
                # The claim records the count it saw as watched if it drains the queue; then, before
                # running the batch, the next idle consumer takes over watching.
                self._locked_out = False
                got, drained = self._claim_and_run(before_run=self._hand_watch_on, as_watcher=True)
                if not self._locked_out or self.claim_backoff.failing:
                    return got > 0 and not drained
                # Empty, and ready jobs are left that another session holds locked (an
                # application's SELECT ... FOR UPDATE, a stuck transaction): the watcher keeps
                # the watch (a put still wakes it at once), and its wait ends at the claim again
                # the Waiter set (Waiter.locked_out: bounded, growing waits).
        finally:
            # Not yet handed on (no jobs, or an error). Once handed on, the waiter is the next
            # seated worker's: never touched again here.
            if self.watch_seat.holds(self) and self.waiter.watching:
                self.waiter.release_watch()

    # -------------------------------------------------------- claim, run, ack

    def _hand_watch_on(self, claim: queries.Claim) -> None:
        """Before running the batch: the watch lock goes to the next idle consumer (of any
        process), and the seat to the next idle worker of ours, which queues for it. Kept after
        an empty claim that left jobs others' locks hold (_idle_with_locks claims again)."""
        if not claim.jobs and self._locked_left(claim):
            self._locked_out = True
            return
        self.waiter.release_watch(wait=False, claimed=claim.jobs[0].id if claim.jobs else None)
        self.watch_seat.leave(self)

    def _hand_poll_on(self, claim: queries.Claim) -> None:
        """Polling: the next idle worker of ours polls; if work is left, it claims at once. An
        empty claim that left jobs others' locks hold: this worker polls again as the watcher
        does (_idle_with_locks), and claims again after its wait."""
        if not claim.drained:
            self.waiter.work_left()
        if not claim.jobs:
            self._locked_left(claim)
        self.watch_seat.leave(self)

    def _locked_left(self, claim: queries.Claim) -> bool:
        """After an empty idle claim: whether jobs others' locks hold are left, told to the
        queue's Waiter, which arms (or ends) the claim again for them (Waiter.locked_out)."""
        held = self._held_by_other_locks(claim)
        self.waiter.locked_out(held)
        if held:
            self._end_watch_wait()
        return held

    def _end_watch_wait(self) -> None:
        """After this worker's claim set the claim for held jobs (Waiter.recount_after,
        locked_out): a worker of ours queued for the watch lock behind another consumer's
        watcher, in a GET_LOCK begun before and ending long after that claim's time, is the one to
        make it (Waiter.watch_wait_outlasts_claim_again). Its wait is ended (KILL QUERY, on our
        work session): it queues again, its wait now ending at the claim again. Not when it holds
        the watch lock by now (the watcher's waits end at the claim again themselves), nor
        through a proxy (its ids are not the server's). Best effort: the wait ends at its own
        timeout anyway. Rare: only a claim that held jobs back, while a peer watches."""
        if not self.waiter.watch_wait_outlasts_claim_again():
            return
        queued = self.waiter.session.connection_id

        def end(cur) -> str:
            holder, me = advisory.lock_holder_and_me(cur, self.waiter.locks.watch)
            if int(me) != self.work.connection_id or not queued or holder == queued:
                return "not sent"
            return advisory.kill_query(cur, queued)

        try:
            outcome = self.work.run(end, what="end the wait for the watch")
        except (errors.NotifyqError, DriverError) as e:
            log.debug("could not end the wait for the watch queue=%s error=%s", self.queue, e)
            return
        self.watch_waits_ended += outcome == "sent"

    def _claim_and_run(self, before_run=None, as_watcher: bool = False) -> tuple[int, bool]:
        # The settings the claim is made with, read once: a reload (the service's thread) may
        # replace them while the claim is on the wire, and the batch must track the lease it holds.
        qc, handler = self.qc, self.handler
        self._held_s = None
        rates = Rates.of(qc)
        want = self.budget.take(self.presence.claim_sizers[self.queue].size_for(handler, self.batch_size, qc.batch_target_s))
        if want <= 0:
            return 0, True
        reconnected = self.work.generation > 1 and self.work.generation != self._work_generation
        self._work_generation = self.work.generation
        if self.acks.waiting and (reconnected or not self.presence.registration_current()):
            if not self._flush_acks():  # registering again may wait for the home seat: what ran is acked first
                self.budget.take(-want)
                return 0, False
        owner = self.presence.ensure_registered(self, self.work if reconnected else None)
        epoch = self.presence.epoch  # the registration the claim is made in
        claimed_at = time.monotonic()  # before the claim: the lease is never longer than we think
        if self.flow is not None:
            self.flow.last = None  # this claim's read, once it made one (_held_by_limits)
        # The watch lock whose holder a limited claim reads with its mark, where the slot wake
        # would look for it (a process that polls holds no lock, and may be on a server without)
        watch = (self.slot_wake.watch_lock() if self.slot_wake is not None and self.presence.use_locks
                 else None)
        try:
            claim = self.acks.claim(self.work, self.queue, owner, want, qc.lease_s, as_watcher, rates,
                                    version=self.version, flow=self.flow, watch=watch)
        except errors.TransientDBError as e:
            # A claim is safe to run again: one that lost lock conflicts on every retry ends no
            # worker, it claims again after a while (claim_backoff.py); a lost server still does.
            if self.stop.is_set() or not self.claim_backoff.absorbed(e):
                raise
            self.budget.take(-want)  # nothing taken
            return 0, False
        self.claim_backoff.claimed()
        if self.flow is not None and self.flow.limits.counts and (claim.drained or claim.recount_s is not None):
            # Before the run: while it runs, the queue's idle worker makes the claim for what the
            # counters held back (or, if this claim drained holding nothing, makes none). One that
            # held jobs and did not drain says so too: empty and outside the watch (the claim made
            # at a trust's end, whose recount held every job back), nothing claims after it
            self.waiter.recount_after(claim.recount_s)
        claim_connection = self.work.connection_id  # its COMMIT's, still on the wire (Batch.connection)
        claim_run = self.work.server_run  # that connection's server run: a KILL of its id after a restart is none of ours
        if claim.recount_s is not None:
            self._end_watch_wait()  # (after the claim's connection is noted: this may reconnect)
        if self.budget.left is not None and want > len(claim.jobs):
            self.budget.take(-(want - len(claim.jobs)))  # return what we did not use
        if before_run is not None:
            before_run(claim)
        elif not claim.jobs and self.waiter.locked_at is not None:
            # An empty claim outside the watch (one the claim again for locked jobs made, or a
            # busy loop's last) tells the Waiter too, as the watcher's does: else nothing ended
            # the claim again once the lock went, and nothing grew its wait after a put
            self._locked_left(claim)
        if claim.jobs:
            # A fair queue's batch starts its keys in turn (fair_order.py), not in claim order
            jobs = round_robin_by_key(claim.jobs) if qc.fair else claim.jobs
            try:
                self._run(Batch(claim.token, jobs, qc.lease_s, claimed_at, claim.commit,
                                owner=owner, epoch=epoch, connection=claim_connection, server_run=claim_run),
                          qc, handler)
            except errors.TransientDBError as e:
                # The batch's outcomes (an ack, a retry, the give-back of what never started)
                # lost lock conflicts on every retry: what they left claimed comes back when its
                # lease ends (the batch no longer extends it), and runs again; the worker goes on,
                # as after a claim that lost them. A lost server still ends it.
                if self.stop.is_set() or not self.claim_backoff.absorbed(e):
                    raise
                log.warning("the outcomes of a batch lost lock conflicts after retrying: its jobs not "
                            "recorded come back when their lease ends, and run again queue=%s worker=%s "
                            "n=%d error=%s", self.queue, self.name, len(jobs), e)
        self._held_s = claim.held_s
        return len(claim.jobs), claim.drained

    def _flush_acks(self) -> bool:
        """Ack what ran (acks.flush); False when the ack lost lock conflicts on every retry: its
        jobs wait for the next try, after the backoff (an ack is fenced by its claim's token,
        safe to run again), and the worker goes on. Anything else ends the worker, as before."""
        try:
            self.acks.flush(self.work)
        except errors.TransientDBError as e:
            if self.stop.is_set() or not self.claim_backoff.absorbed(e):
                raise
            return False
        return True

    def _run(self, batch: Batch, qc: QueueConfig, handler: Handler) -> None:
        """Run the claim (consume/batch.py); its successes wait for the next claim's COMMIT."""
        run = self.current_run = self.make_run(batch, qc, handler)
        try:
            run.run()
        finally:
            if not batch.settled.is_set():
                self.unsettled = run  # (before current_run goes: the service sees one or the other)
            self.current_run = None
            batch.ended.set()

    def make_run(self, batch: Batch, qc: QueueConfig, handler: Handler) -> BatchRun:
        """The batch's run with the settings and handler the claim was made with."""
        return BatchRun(batch, self, qc, handler)

    def _new_work_session(self) -> Session:
        return Session(self.config.dsn, name=f"{self.name}-work", stop=RetryStop(self),
                       retry_s=self.config.connect_retry(oneshot=False), retry_setting="connect_retry_s",
                       no_caller_deadline=True)

    def replace_work_session(self) -> Session:
        """A handler's call timed out holding the work session (its batch's run asks): the
        worker's is a new one from now on."""
        self.work = self._new_work_session()
        return self.work

    def stop_handler(self) -> bool:
        """The shutdown grace expired while this worker's handler still ran (service thread): a
        command runs in a process group of its own, which would outlive us and run on while a
        peer ran its jobs again. It is ended now, whatever the server does (stop_running needs
        none). True when the handler stopped what it ran (a command's handler)."""
        run = self.current_run
        return run is not None and run.handler.stop_running()

    def give_back_waiting(self, session: Session) -> None:
        """At the stop (service thread): what waits in this worker's batch behind its running job
        goes back to the queue now (BatchRun.give_back_waiting)."""
        run = self.current_run
        if run is not None:
            run.give_back_waiting(session)

    def holds_unsettled(self) -> bool:
        """A batch of this worker's is not settled: the one it runs, or one its run left; or
        successes its batches handed over are not known acked (PendingAcks.unlanded: waiting for
        a claim, or on the wire to a server that did not answer)."""
        return (any(run is not None and not run.batch.settled.is_set() for run in (self.current_run, self.unsettled))
                or self.acks.unlanded())

    def abandon(self, session: Session, stopped: bool) -> None:
        """At shutdown, after stop_handler (service thread): what of this worker's batches is not
        settled is settled here, on `session` (BatchRun.abandon). A worker settling its batch
        itself gets SETTLE_AFTER_STOP_S first: a command killed hands its worker back the batch,
        which settles it (interrupted, not charged: the grace expired) and counts it before our
        summary; a handler that returned left its worker retrying an ack or give-back, which
        ended with the grace. A Python handler still running is not waited for (it cannot be
        stopped). A batch whose run ended unsettled (unsettled) is settled here too, and so are
        the successes of settled batches whose ack the worker could not land (its acks waited
        for a claim, or were on the wire to a server that answered only after the grace):
        PendingAcks.send_at_exit."""
        run = self.current_run
        if run is not None and (stopped or self.in_handler_since is None):
            run.batch.ended.wait(SETTLE_AFTER_STOP_S)
        for run in dict.fromkeys((self.current_run, self.unsettled)):
            if run is not None and not run.batch.settled.is_set():
                run.abandon(session)
        self.acks.send_at_exit(session)

    # -------------------------------------------------------- the reaper, run by consumers

    def _reap_soon(self) -> None:
        self._maybe_reap(check=False)  # the watch statement already asked reap_needed

    def _maybe_reap(self, check: bool = True) -> None:
        self.stats.reclaimed += self.presence.maybe_reap(self, self.work, check)

    def _reap_before_exit(self) -> bool:
        """--exit-when-empty found nothing: first take back what dead peers hold (a fleet of
        such consumers never idles, so nobody else may ever run the reaper). True when jobs
        came back, or when another pass is running right now and may bring some: claim again."""
        if self._exit_deadline is None:
            self._exit_deadline = time.monotonic() + reaper.REAPER_IDLE_TIMEOUT_S + 5
        result = self.presence.reap_pass()
        if result is None:
            # Another pass is running (or its host vanished holding the reaper lock, which the
            # server frees within REAPER_IDLE_TIMEOUT_S): try again shortly, within a bound.
            return not self.stop.wait(0.1) and time.monotonic() < self._exit_deadline
        n = result.reclaimed + result.expired
        self.stats.reclaimed += n
        if n:
            log.info("took back jobs of dead consumers before exiting queue=%s n=%d", self.queue, n)
            return True
        return self._wait_for_gone_claims()

    def _wait_for_gone_claims(self) -> bool:
        """The pass took nothing back, yet jobs of the queue may still be held by a consumer that
        is gone and that no pass can judge yet (the server restarted within the grace: it may be
        alive, about to take its lock back): their lease brings them back. If it runs out before
        the exit deadline, wait for it and claim again (True) rather than leave them to the next
        run, which may be a cron period away."""
        due_s = liveness.gone_claims_due_s(self.work, self.queue)
        assert self._exit_deadline is not None
        if due_s is None or time.monotonic() + due_s > self._exit_deadline:
            return False
        log.info("jobs of a consumer that is gone wait for their lease before exiting queue=%s seconds=%.1f",
                 self.queue, due_s)
        return not self.stop.wait(due_s + GONE_LEASE_MARGIN_S)


class RetryStop:
    """When a worker's work sessions stop retrying an unreachable server (Session.stop): at the
    consumer's stop while the worker holds no batch (nothing of ours waits for the server: a
    SIGTERM is not made to wait for it), at the grace's end while one runs (its jobs may still
    finish and be acked if the server comes back within the grace)."""

    def __init__(self, worker: "Worker"):
        self.worker = worker

    def is_set(self) -> bool:
        worker = self.worker
        return worker.grace_over.is_set() or (worker.stop.is_set() and getattr(worker, "current_run", None) is None)

    def wait(self, timeout: float | None = None) -> bool:
        """A retry's backoff sleep: it ends as soon as is_set() does."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self.worker.stop.wait(RETRY_STOP_POLL_S if left is None else min(RETRY_STOP_POLL_S, left))
        return True


RETRY_STOP_POLL_S = 0.1  # how often a backoff sleep looks whether its worker's retries should end

