"""Worker: one claim -> run -> ack loop for one queue, on its own work session.

The work session runs claims and acks (short READ COMMITTED transactions). Everything else a
worker needs from the database is its process's, shared by all its workers (presence.py): the
liveness lock and registration, whose id every claim is made under, and its queue's watcher
session, which the worker borrows while it is idle and the seat is free. A worker asks the
presence for the id before every claim: after a lost liveness session that id is either the
old one taken back or a new one, and acks of the old claims are fenced by claim token, so they
can never touch a job someone else now holds.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from notifyq import errors
from notifyq.config import Config
from notifyq.consume import handlers, reaper, timeout
from notifyq.consume.batch import Batch
from notifyq.consume.outcomes import Outcomes
from notifyq.consume.presence import Presence
from notifyq.consume.stats import Budget, Stats
from notifyq.jobs import Job
from notifyq.store import queries
from notifyq.consume.effects import Completion
from notifyq.store.db import Session
from notifyq.store.driver import DriverError, locks_unavailable
from notifyq.store.pipeline import Pending

log = logging.getLogger("notifyq.consumer")

ACK_FLUSH_S = 1.0  # a long per-job batch acks what is done at least this often
SETTLE_AFTER_STOP_S = 2.0  # how long abandon lets a worker whose command was killed settle its batch


class Worker:
    def __init__(self, config: Config, queue: str, handler, *, stop: threading.Event,
                 budget: Budget, batch_size: int | None = None, exit_when_empty: bool = False,
                 name: str = "worker", presence: Presence | None = None):
        self.config = config
        self.queue = queue
        self.qc = config.queue(queue)
        self.handler = handler
        self.stop = stop
        self.budget = budget
        self.batch_size = batch_size or self.qc.batch_size
        self.exit_when_empty = exit_when_empty
        self.name = name
        self.stats = Stats()
        self.outcomes = Outcomes(queue, self.qc, self.stats)
        self.work = Session(config.dsn, name=f"{name}-work", stop=stop)
        # Without a presence (tests, benchmarks) the worker is a process of its own.
        self._owns_presence = presence is None
        self.presence = presence if presence is not None else Presence(config, [queue], stop)
        self.watch_seat = self.presence.watch_seats[queue]
        self._work_generation = -1  # the work session's generation when last checked
        self.last_turn = time.monotonic()
        self.in_handler_since: float | None = None
        self.batch: Batch | None = None  # the claim being run; the service reads it at shutdown
        self.finished = False
        self.error: BaseException | None = None  # why run() ended early, if it did
        self._exit_deadline: float | None = None  # --exit-when-empty: waiting for a reaper pass
        # The last batch's successes ride in the next claim's COMMIT (queries.Acks): one fsync'd
        # COMMIT per busy batch instead of two. Acks waiting for that claim, then the claim's
        # COMMIT they went out with, until it is read (Outcomes.landed). A worker that does
        # anything but claim next (idles, stops, runs a reaper pass, registers again) acks them
        # on their own first (_flush_acks).
        self._acks: queries.Acks | None = None
        self._acks_sent: tuple[queries.Acks, Pending | None] | None = None
        self._runner: timeout.HandlerThread | None = None  # timeout_s: the handler's helper thread

    @property
    def waiter(self):
        """The queue's wake-up state in this process (shared by its workers of this queue)."""
        return self.watch_seat.waiter

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
                    # Before the claim: a consumer that just started (a cron run, a restart)
                    # first takes back what dead peers hold, then claims in order among it.
                    if self.presence.reap_due():
                        self._flush_acks()  # a pass can take long: what ran is acked before it
                    self._maybe_reap()
                    got, drained = self._claim_and_run()
                    if not got and self.exit_when_empty:
                        if self._reap_before_exit():
                            continue  # a dead peer's jobs came back: they are ours to run
                        break
                    # --exit-when-empty never idles: it claims until a claim comes back empty.
                    busy = self.exit_when_empty or (got > 0 and not drained)
                else:
                    self._flush_acks()  # an idle worker's jobs are acked before it waits
                    busy = self._idle()
            self._flush_acks()
        except errors.TransientDBError as e:
            if not self.stop.is_set():
                self.error = e
                log.error("worker failed queue=%s worker=%s error=%s", self.queue, self.name, e)
            else:  # asked to stop while the server was unreachable: the retry ended at once
                log.info("worker stopped while retrying queue=%s worker=%s error=%s", self.queue, self.name, e)
        except Exception as e:
            self.error = e
            log.error("worker failed queue=%s worker=%s error=%s", self.queue, self.name, e,
                      exc_info=not isinstance(e, errors.NotifyqError))
        finally:
            # After a failure of ours, what ran is acked if the server answers. Not after the
            # server's: that would only wait out another connect retry; those jobs run again.
            if not isinstance(self.error, errors.DatabaseError):
                try:
                    self._flush_acks()
                except Exception as e:
                    log.warning("could not ack finished jobs: they will run again queue=%s error=%s",
                                self.queue, e)
            self.finished = True
            if self._runner is not None:
                self._runner.close()
            handlers.close_loop()  # a coroutine handler's event loop lives as long as its thread
            self.work.close()
            if self._owns_presence:
                self.presence.close()

    def _turned(self) -> None:
        self.last_turn = time.monotonic()

    # -------------------------------------------------------- idle

    def _idle(self) -> bool:
        """Wait for work without touching the jobs table; True when more work is likely.

        One idle worker of the queue per process holds the seat and watches (or polls);
        the others wait here for the seat, turning their loop every idle_wait_s."""
        if not self.watch_seat.seat(self, self.config.wakeup.idle_wait_s):
            return False
        self.waiter.on_turn, self.waiter.on_reap = self._turned, self._reap_soon
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
        if not self.waiter.acquire_watch():
            # Timed out or interrupted: the loop turns, then we queue up again, unless work
            # waits that the watcher should have handed on by now (its host may be gone).
            return self.waiter.watch_timed_out and self.waiter.watcher_overdue()
        try:
            if not self.waiter.wait_for_work():
                return False
            # The claim records the count it saw as watched if it drains the queue; then, before
            # running the batch, the next idle consumer takes over watching.
            got, drained = self._claim_and_run(before_run=self._hand_watch_on, as_watcher=True)
            return got > 0 and not drained
        finally:
            # Not yet handed on (no jobs, or an error). Once handed on, the waiter is the next
            # seated worker's: never touched again here.
            if self.watch_seat.holds(self) and self.waiter.watching:
                self.waiter.release_watch()

    # -------------------------------------------------------- claim, run, ack

    def _hand_watch_on(self, drained: bool) -> None:
        """Before running the batch: the watch lock goes to the next idle consumer (of any
        process), and the seat to the next idle worker of ours, which queues for it."""
        self.waiter.release_watch(wait=False)
        self.watch_seat.leave(self)

    def _hand_poll_on(self, drained: bool) -> None:
        """Polling: the next idle worker of ours polls; if work is left, it claims at once."""
        if not drained:
            self.waiter.work_left()
        self.watch_seat.leave(self)

    def _claim_and_run(self, before_run=None, as_watcher: bool = False) -> tuple[int, bool]:
        want = self.budget.take(self.batch_size)
        if want <= 0:
            return 0, True
        reconnected = self.work.generation > 1 and self.work.generation != self._work_generation
        self._work_generation = self.work.generation
        if self._acks is not None and (reconnected or not self.presence.registration_current()):
            self._flush_acks()  # registering again may wait for the home seat: what ran is acked first
        owner = self.presence.ensure_registered(self, self.work if reconnected else None)
        epoch = self.presence.epoch  # the registration the claim is made in
        claimed_at = time.monotonic()  # before the claim: the lease is never longer than we think
        self._acks_landed()
        acks, self._acks = self._acks, None
        try:
            claim = queries.claim(self.work, self.queue, owner, want, self.qc.lease_s, as_watcher, acks)
        except BaseException:
            self._acks = acks  # not sent, or sent and rolled back: acked on their own at the end
            raise
        if acks is not None:
            self._acks_sent = (acks, claim.commit)
            if not claim.jobs:
                self._acks_landed()  # nothing runs next on this session to read the COMMIT
        if self.budget.left is not None and want > len(claim.jobs):
            self.budget.take(-(want - len(claim.jobs)))  # return what we did not use
        if before_run is not None:
            before_run(claim.drained)
        if claim.jobs:
            self._run_batch(Batch(claim.token, claim.jobs, self.qc.lease_s, claimed_at, claim.commit,
                                  owner=owner, epoch=epoch))
        return len(claim.jobs), claim.drained

    def _run_batch(self, batch: Batch) -> None:
        jobs, token = batch.jobs, batch.token
        self.stats.claimed += len(jobs)
        self.stats.batches += 1
        self.stats.batch_sizes.observe(len(jobs))

        def extend() -> None:  # job.extend_lease(): at once, as the handler asks
            with batch.handler_lock:  # (a handler past its timeout_s extends nothing any more)
                if threading.get_ident() not in batch.revoked:
                    self._extend(batch)

        def keep_lease() -> None:  # a command handler, every second or so while it runs
            if batch.extend_due():
                self._extend(batch)

        completion = Completion(self.work, token, self.qc.keep_done, self.qc.keeps_results, batch.owner)  # job.transaction(), cancel checks
        for job in jobs:
            try:
                job.payload = json.loads(job.payload)
            except ValueError as e:
                job.fail(f"payload is not valid JSON: {e}", retry=False)
            job._extend = extend
            job._completion = completion
        self.batch = batch
        log.debug("claimed batch queue=%s n=%d token=%d", self.queue, len(jobs), token)
        last_flush = t0 = time.monotonic()
        try:
            if self.handler.per_batch:
                batch.start(jobs)
                self._call([j for j in jobs if j.error is None], keep_lease)
                batch.finish()
            else:
                # A coroutine handler with `concurrency` N runs up to N jobs at once (a group,
                # started and finished together); any other handler one at a time.
                size = max(1, getattr(self.handler, "concurrency", 1))
                while batch.started < len(jobs):
                    job = jobs[batch.started]
                    if batch.started and batch.commit is not None and not batch.commit.settled:
                        # The first job ran while the claim's COMMIT was on the wire; the second
                        # starts only once it landed. A failed COMMIT unlocked the rows (on Galera,
                        # another node's claim won certification): a peer may hold them already.
                        self.work.pipeline.read_reply()
                    if self.stop.is_set() or batch.claim_lost():
                        break
                    now = time.monotonic()
                    extend_due = batch.extend_due(now)
                    if extend_due or now - last_flush >= ACK_FLUSH_S:
                        # Acks first: then every job of the claim still held is extended at
                        # once, and a stalled consumer's jobs all expire together.
                        lost_before = self.stats.lost_acks
                        self.outcomes.settle(self.work, batch.take_done(), token)
                        last_flush = time.monotonic()
                        # An ack fenced out: the claim was taken back; learn what is left of it.
                        extend_due = extend_due or self.stats.lost_acks > lost_before
                    if not self._still_ours(batch, now):
                        break
                    if extend_due or batch.epoch != self.presence.epoch:
                        self._extend(batch)  # before the next start: never start a job not ours
                        batch.epoch = self.presence.epoch
                    if job.id in batch.lost:
                        batch.skip()
                        continue
                    # The first job alone: it may run while the claim's COMMIT is on the wire.
                    group = batch.next_group(size if batch.started else 1)
                    batch.start(group)
                    ready = [j for j in group if j.error is None]
                    if ready:
                        self._call(ready, keep_lease)
                    batch.finish()
        except BaseException as e:
            # Only the worker's own failures get here (handlers.py turns every exception a handler
            # raises into its job's failure): fail what was running rather than leave it claimed.
            for job in batch.running:
                if job.error is None:
                    job.fail(f"the consumer failed while the job ran: {type(e).__name__}: {e}")
            batch.finish()
            raise
        finally:
            try:
                self._acks = self.outcomes.settle(self.work, batch.take_done(), token, carry=True)
                log.debug("batch done queue=%s n=%d failed=%d seconds=%.3f", self.queue, len(jobs),
                          sum(1 for j in jobs if j.error is not None), time.monotonic() - t0)
                rest = batch.waiting()
                if rest:
                    n = queries.give_back(self.work, self.queue, rest, token)
                    self.stats.given_back += n
                    log.info("gave back unstarted jobs queue=%s n=%d", self.queue, n)
            finally:
                self.batch = None
                batch.settled.set()

    def _still_ours(self, batch: Batch, now: float) -> bool:
        """Before a job starts: is the claim still this process's? From what the presence knows
        at no cost; only when that is too old (the process stalled, or its liveness session
        went silent) one check, and a re-registration if it failed. Under another consumer id
        now, the old one's claims are a reaper's (it held the old lock when we asked): the rest
        of the batch is not ours to start. Under the same id in a new epoch, the caller's lease
        extension says which jobs are left."""
        if not self.presence.known_alive(now):
            try:
                self.presence.confirm_alive(self, self.work)
            except errors.NotifyqError as e:  # cannot tell: start nothing more of this batch
                log.warning("could not confirm the claim is still ours: the rest of the batch is "
                            "given back queue=%s error=%s", self.queue, e)
                return False
        if self.presence.consumer_id == batch.owner:
            return True
        gone = batch.taken_back()
        log.warning("claim taken back while this process was silent: the rest of the batch is "
                    "someone else's now queue=%s n=%d jobs=%s", self.queue, len(gone),
                    ",".join(map(str, gone[:20])))
        return False

    def _acks_landed(self) -> None:
        """Count the acks the last claim carried, or ack them again if its COMMIT failed."""
        if self._acks_sent is not None:
            acks, commit = self._acks_sent
            self._acks_sent = None
            self.outcomes.landed(self.work, acks, commit)

    def _flush_acks(self) -> None:
        """Before anything but a claim: the acks that waited for one go out on their own."""
        self._acks_landed()
        if self._acks is not None:
            acks, self._acks = self._acks, None
            self.outcomes.landed(self.work, acks, None)

    def _call(self, jobs: list[Job], extend) -> None:
        self.in_handler_since = t0 = time.monotonic()
        try:
            limit = timeout.limit_for(self.handler, jobs, self.qc.timeout_s)
            if limit > 0:  # (a command is bounded by its own command_timeout_s)
                self._call_bounded(jobs, extend, limit)
            else:
                self.handler(jobs, extend)
        finally:
            self.in_handler_since = None
            self.stats.handler_seconds.observe(time.monotonic() - t0)
            self._turned()

    def _call_bounded(self, jobs: list[Job], extend, timeout_s: float) -> None:
        """The handler on a helper thread, waited for at most timeout_s (consume/timeout.py)."""
        if self._runner is None:
            self._runner = timeout.HandlerThread(f"{self.name}-handler")
        runner = self._runner
        if runner.run(lambda: self.handler(jobs, extend), timeout_s):
            return
        batch = self.batch
        assert batch is not None
        with batch.handler_lock:  # an extension under way ends first; then none of that thread's
            batch.revoked.add(runner.thread.ident or 0)
        old, self.work = self.work, Session(self.config.dsn, name=f"{self.name}-work", stop=self.stop)
        runner.abandon(old.close)  # the stray call keeps the old session until it returns
        self._runner = None
        fresh = Completion(self.work, batch.token, self.qc.keep_done, self.qc.keeps_results, batch.owner)
        for job in batch.jobs[batch.started:]:
            job._completion = fresh
        timeout.fail_timed_out(self.handler, jobs, timeout_s)
        log.warning("handler timed out: its job fails, its thread is left running queue=%s jobs=%s "
                    "timeout_s=%g", self.queue, ",".join(str(j.id) for j in jobs[:20]), timeout_s)

    def _extend(self, batch: Batch) -> None:
        """Push out the lease of what the batch still holds; what comes back lost is skipped."""
        asked, sent_at = batch.held(), time.monotonic()
        owned = queries.extend_lease(self.work, asked, batch.token, batch.lease_s)
        gone = batch.extended(asked, owned, sent_at)
        if gone:
            log.warning("leases ran out before the jobs started: skipped, they are someone "
                        "else's now queue=%s n=%d jobs=%s", self.queue, len(gone),
                        ",".join(map(str, gone[:20])))

    def abandon(self, session: Session) -> None:
        """The shutdown grace expired while this worker's handler still ran (service thread)."""
        batch = self.batch
        if batch is None:
            return
        stop_running = getattr(self.handler, "stop_running", None)
        if stop_running is not None:
            # A command runs in a process group of its own: it would outlive us and run on
            # while a peer ran its jobs again. Killed, it hands its worker back the batch,
            # which settles it (failed: the grace expired) and counts it before our summary.
            stop_running()
            if batch.settled.wait(SETTLE_AFTER_STOP_S):
                return
        self.outcomes.abandon(session, batch)

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
        return n > 0

