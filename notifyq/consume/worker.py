"""Worker: one claim -> run -> ack loop for one queue, with its own two database sessions.

The work session runs claims and acks (short READ COMMITTED transactions). The lock session
holds the worker's liveness lock for its whole life, queues for the watch lock when idle, and
never holds row locks. A worker whose lock session had to reconnect has lost its liveness lock
(and maybe its claimed jobs to the reaper): it re-registers under a new id, and acks of the old
claims are fenced by claim token, so they can never touch a job someone else now holds.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid

from notifyq import errors
from notifyq.config import Config
from notifyq.consume import reaper
from notifyq.consume.batch import Batch
from notifyq.consume.heartbeat import Heartbeat
from notifyq.consume.keepalive import SessionKeeper
from notifyq.consume.outcomes import Outcomes
from notifyq.consume.stats import Budget, Stats
from notifyq.jobs import Job
from notifyq.store import admin_queries, liveness, locks, queries
from notifyq.store.db import DriverError, Session, locks_unavailable
from notifyq.wakeup import Waiter

log = logging.getLogger("notifyq.consumer")

ACK_FLUSH_S = 1.0  # a long per-job batch acks what is done at least this often
TOUCH_S = 60.0  # how often nq_consumer.last_seen is refreshed (information only)


class Worker:
    def __init__(self, config: Config, queue: str, handler, *, stop: threading.Event,
                 budget: Budget, batch_size: int | None = None, exit_when_empty: bool = False,
                 name: str = "worker"):
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
        wait_s = int(config.wakeup.idle_wait_s + config.wakeup.poll_max_s) + 30
        # A short server idle timeout: a vanished host's liveness lock is freed soon after it
        # (keepalive.py keeps this session talking while handlers run).
        self.lock = Session(config.dsn, autocommit=True, read_timeout_s=wait_s, name=f"{name}-lock",
                            idle_timeout_s=math.ceil(config.consumer.session_idle_s), stop=stop)
        self.keeper = SessionKeeper(self.lock, config.consumer.session_idle_s, name)
        self.queue_locks = locks.QueueLocks(config.dsn.database, queue)
        self.use_locks = config.wakeup.use_locks
        self.consumer_id = ""
        self._registered_generation = -1
        self._work_generation = -1  # the work session's generation when last checked
        self.waiter = Waiter(self.lock, queue, self.queue_locks, config.wakeup, stop,
                             on_turn=self._turned, on_reap=self._reap_soon)
        self.last_turn = time.monotonic()
        self.in_handler_since: float | None = None
        self.batch: Batch | None = None  # the claim being run; the service reads it at shutdown
        self.finished = False
        self.error: BaseException | None = None  # why run() ended early, if it did
        self._next_reap = 0.0
        self._next_touch = 0.0
        self.heartbeat: Heartbeat | None = None  # polling mode only: our liveness without a lock
        self._exit_deadline: float | None = None  # --exit-when-empty: waiting for a reaper pass

    @property
    def wakeup_mode(self) -> str:
        return "locks" if self.use_locks else "polling"

    # -------------------------------------------------------- life cycle

    def run(self) -> None:
        try:
            self._register()
            busy = True
            while not self.stop.is_set() and not self.budget.exhausted:
                self._turned()
                self._ensure_registered()
                if busy:
                    # Before the claim: a consumer that just started (a cron run, a restart)
                    # first takes back what dead peers hold, then claims in order among it.
                    self._maybe_reap()
                    got, drained = self._claim_and_run()
                    if not got and self.exit_when_empty:
                        if self._reap_before_exit():
                            continue  # a dead peer's jobs came back: they are ours to run
                        break
                    # --exit-when-empty never idles: it claims until a claim comes back empty.
                    busy = self.exit_when_empty or (got > 0 and not drained)
                else:
                    busy = self._idle()
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
            self.finished = True
            self._unregister()

    def _register(self, old_id: str | None = None) -> None:
        """Liveness lock first, then the row: a row is never visible without its lock held.

        After a lost lock session (a server restart kills every session at once) we try to take
        our old lock back without waiting. That succeeds only if no reaper holds it, and a reaper
        reclaims only while holding it, so either our claims are untouched and stay ours, or they
        were taken back and our acks are fenced off by claim token. Without this, a restart
        would make every consumer's in-flight batch run twice.
        """
        if old_id and queries.get_lock(self.lock, locks.consumer_lock(self.config.dsn.database, old_id), 0) == 1:
            self.consumer_id = old_id
        else:
            self.consumer_id = uuid.uuid4().hex
            old_id = None
        lock_name = locks.consumer_lock(self.config.dsn.database, self.consumer_id)
        if self.use_locks and old_id is None:
            try:
                if queries.get_lock(self.lock, lock_name, 5) != 1:
                    raise RuntimeError("could not take a fresh liveness lock")
            except DriverError as e:
                if not locks_unavailable(e):
                    raise
                self._fall_back_to_polling(e)
        liveness.register_consumer(self.work, self.consumer_id, lock_name, socket.gethostname(),
                                os.getpid(), [self.queue], self.wakeup_mode, node=self.lock.node)
        if not self.use_locks or self.lock.galera:
            # On a Galera node our lock is invisible to reapers on the other nodes: they judge
            # us by heartbeat (liveness.py), so we beat too.
            self._start_heartbeat()
        self._registered_generation = self.lock.generation
        self._work_generation = self.work.generation
        log.debug("worker started queue=%s consumer=%s wakeup=%s batch_size=%d",
                  self.queue, self.consumer_id, self.wakeup_mode, self.batch_size)

    def _ensure_registered(self) -> None:
        if self.heartbeat is not None and self.heartbeat.lost.is_set():
            # A reaper found our heartbeat stale (a stall longer than POLLING_STALE_S) and took
            # our claims back; our acks of them are fenced. Carry on under a new id.
            self.heartbeat.lost.clear()
            old = self.consumer_id
            self._register()
            log.warning("heartbeat was judged stale, re-registered queue=%s consumer=%s old=%s",
                        self.queue, self.consumer_id, old)
        if self.use_locks and self.work.generation != self._work_generation:
            # The work session reconnected. If the server restarted, the lock session (idle
            # while we run batches) died too, and our liveness lock with it: touch it before
            # the next claim, so a dead one reconnects now and we re-register below, instead
            # of claiming under an id the reaper already treats as dead.
            self._work_generation = self.work.generation
            queries.lock_holder(self.lock, locks.consumer_lock(self.config.dsn.database, self.consumer_id))
        if self.use_locks and self.lock.generation != self._registered_generation:
            old = self.consumer_id
            self.waiter.watching = False
            self._register(old_id=old)
            log.warning("lock session reconnected: liveness lock %s queue=%s consumer=%s",
                        "taken back" if self.consumer_id == old else "lost, re-registered",
                        self.queue, self.consumer_id)
        now = time.monotonic()
        if now >= self._next_touch:
            self._next_touch = now + TOUCH_S
            liveness.touch_consumer(self.work, self.consumer_id, self.wakeup_mode)

    def _unregister(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()  # first: a beat after the row is gone would only log
            self.heartbeat = None
        try:
            if self.consumer_id:
                liveness.unregister_consumer(self.work, self.consumer_id)
        except Exception as e:  # the reaper cleans up whatever we could not
            log.warning("could not unregister consumer=%s error=%s", self.consumer_id, e)
        self.keeper.stop()
        self.lock.close()  # frees the liveness, watch and any bell locks at once
        self.work.close()

    def _turned(self) -> None:
        self.last_turn = time.monotonic()

    # -------------------------------------------------------- idle

    def _fall_back_to_polling(self, exc: BaseException) -> None:
        self.use_locks = False
        if self.consumer_id:  # registered already (else _register starts the heartbeat)
            self._start_heartbeat()
        log.warning("advisory locks unavailable (%s): falling back to polling the signal "
                    "row; liveness by heartbeat and lease", exc.args[0] if exc.args else exc)

    def _start_heartbeat(self) -> None:
        """Polling mode: from now on we are judged by heartbeat (the row says wakeup=polling
        after the first beat, which runs here, before the next claim)."""
        if self.heartbeat is None:
            self.heartbeat = Heartbeat(self.config.dsn, lambda: self.consumer_id, self.qc.lease_s,
                                       self.name, wakeup=lambda: self.wakeup_mode)
            self.heartbeat.start()
        self.heartbeat.beat()

    def _idle(self) -> bool:
        """Wait for work without touching the jobs table; True when more work is likely."""
        if not self.use_locks:
            return self.waiter.poll_for_work()
        try:
            return self._idle_with_locks()
        except DriverError as e:  # a proxy may pass GET_LOCK alone but refuse the watch statement
            if not locks_unavailable(e):
                raise
            self._fall_back_to_polling(e)
            return True

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
            if self.waiter.watching:  # not yet handed on (no jobs, or an error)
                self.waiter.release_watch()

    # -------------------------------------------------------- claim, run, ack

    def _hand_watch_on(self) -> None:
        self.waiter.release_watch(wait=False)

    def _claim_and_run(self, before_run=None, as_watcher: bool = False) -> tuple[int, bool]:
        want = self.budget.take(self.batch_size)
        if want <= 0:
            return 0, True
        claimed_at = time.monotonic()  # before the claim: the lease is never longer than we think
        claim = queries.claim(self.work, self.queue, self.consumer_id, want, self.qc.lease_s, as_watcher)
        if self.budget.left is not None and want > len(claim.jobs):
            self.budget.take(-(want - len(claim.jobs)))  # return what we did not use
        if before_run is not None:
            before_run()
        if claim.jobs:
            self._run_batch(Batch(claim.token, claim.jobs, self.qc.lease_s, claimed_at))
        return len(claim.jobs), claim.drained

    def _run_batch(self, batch: Batch) -> None:
        jobs, token = batch.jobs, batch.token
        self.stats.claimed += len(jobs)
        self.stats.batches += 1
        self.stats.batch_sizes.observe(len(jobs))

        def extend() -> None:  # job.extend_lease(), and a command handler within its timeout
            self._extend(batch)

        for job in jobs:
            try:
                job.payload = json.loads(job.payload)
            except ValueError as e:
                job.fail(f"payload is not valid JSON: {e}", retry=False)
            job._extend = extend
            job._cancel_check = (lambda job_id=job.id:
                                 admin_queries.cancel_requested(self.work, job_id, token))
        self.batch = batch
        log.debug("claimed batch queue=%s n=%d token=%d", self.queue, len(jobs), token)
        done: list[Job] = []
        last_flush = t0 = time.monotonic()
        try:
            if self.handler.per_batch:
                batch.start(jobs)
                self._call([j for j in jobs if j.error is None], extend)
                done = jobs
                batch.finish()
            else:
                for job in jobs:
                    if self.stop.is_set():
                        break
                    now = time.monotonic()
                    extend_due = batch.extend_due(now)
                    if extend_due or now - last_flush >= ACK_FLUSH_S:
                        # Acks first: then every job of the claim still held is extended at
                        # once, and a stalled consumer's jobs all expire together.
                        self.outcomes.settle(self.work, done, token)
                        done, last_flush = [], time.monotonic()
                    if extend_due:
                        self._extend(batch)  # before the next start: never start a job not ours
                    if job.id in batch.lost:
                        batch.skip()
                        continue
                    batch.start([job])
                    if job.error is None:
                        self._call([job], extend)
                    done.append(job)
                    batch.finish()
        except BaseException as e:
            # Only the worker's own failures get here (handlers.py turns every exception a handler
            # raises into its job's failure): fail what was running rather than leave it claimed.
            for job in batch.running:
                if job.error is None:
                    job.fail(f"the consumer failed while the job ran: {type(e).__name__}: {e}")
            done.extend(batch.running)
            batch.finish()
            raise
        finally:
            try:
                self.outcomes.settle(self.work, done, token)
                log.debug("batch done queue=%s n=%d failed=%d seconds=%.3f", self.queue, len(jobs),
                          sum(1 for j in jobs if j.error is not None), time.monotonic() - t0)
                rest = batch.waiting()
                if rest:
                    n = queries.give_back(self.work, self.queue, rest, token)
                    self.stats.given_back += n
                    log.info("gave back unstarted jobs queue=%s n=%d", self.queue, n)
            finally:
                self.batch = None

    def _call(self, jobs: list[Job], extend) -> None:
        self.in_handler_since = t0 = time.monotonic()
        try:
            with self.keeper.lent():
                self.handler(jobs, extend)
        finally:
            self.in_handler_since = None
            self.stats.handler_seconds.observe(time.monotonic() - t0)
            self._turned()

    def _extend(self, batch: Batch) -> None:
        """Push out the lease of what the batch still holds; what comes back lost is skipped."""
        asked, sent_at = batch.held(), time.monotonic()
        owned = queries.extend_lease(self.work, asked, batch.token, self.qc.lease_s)
        gone = batch.extended(asked, owned, sent_at)
        if gone:
            log.warning("leases ran out before the jobs started: skipped, they are someone "
                        "else's now queue=%s n=%d jobs=%s", self.queue, len(gone),
                        ",".join(map(str, gone[:20])))

    def abandon(self, session: Session) -> None:
        """The shutdown grace expired while this worker's handler still ran (service thread)."""
        if self.batch is not None:
            self.outcomes.abandon(session, self.batch)

    # -------------------------------------------------------- the reaper, run by consumers

    def _reap_soon(self) -> None:
        self._maybe_reap(check=False)  # the watch statement already asked reap_needed

    def _maybe_reap(self, check: bool = True) -> None:
        now = time.monotonic()
        if now < self._next_reap:
            return
        self._next_reap = now + self.config.consumer.reap_interval_s
        # Asked on the lock session on purpose: a busy worker touches it nowhere else, so a
        # lock session that died (KILL, network) would go unnoticed while the worker kept
        # claiming under an id the reaper has already unregistered. Here it reconnects, and
        # the next loop turn re-registers before claiming again.
        if check and not self._reap_needed():
            return
        self._reap()

    def _reap_needed(self) -> bool:
        try:
            return liveness.reap_needed(self.lock) > 0
        except DriverError as e:  # a polling consumer's server may refuse the lock test
            if not locks_unavailable(e):
                raise
            return True

    def _reap(self) -> int:
        """A pass on a session of its own; how many jobs came back (0 when another consumer
        is running a pass right now)."""
        result = reaper.reap_once(self.config.dsn, self.use_locks)
        n = 0 if result is None else result.reclaimed + result.expired
        self.stats.reclaimed += n
        return n

    def _reap_before_exit(self) -> bool:
        """--exit-when-empty found nothing: first take back what dead peers hold (a fleet of
        such consumers never idles, so nobody else may ever run the reaper). True when jobs
        came back, or when another pass is running right now and may bring some: claim again."""
        if self._exit_deadline is None:
            self._exit_deadline = time.monotonic() + reaper.REAPER_IDLE_TIMEOUT_S + 5
        result = reaper.reap_once(self.config.dsn, self.use_locks)
        if result is None:
            # Another pass is running (or its host vanished holding the reaper lock, which the
            # server frees within REAPER_IDLE_TIMEOUT_S): try again shortly, within a bound.
            return not self.stop.wait(0.1) and time.monotonic() < self._exit_deadline
        n = result.reclaimed + result.expired
        self.stats.reclaimed += n
        if n:
            log.info("took back jobs of dead consumers before exiting queue=%s n=%d", self.queue, n)
        return n > 0

