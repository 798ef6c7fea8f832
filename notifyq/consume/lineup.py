"""Jobs of mixed duration: how many jobs a claim takes, and what becomes of the jobs of a claim
that wait behind one that runs long.

A claim of many jobs is what makes a drain of quick jobs cheap (one claim and one ack per
batch), but its jobs run one after another on the worker that claimed them: a job that runs
long holds the rest of its batch back while other workers, of this process or another, idle.
Two rules keep that from happening, both set by the queue's batch_target_s (0: off):

  - ClaimSizer: a claim takes about batch_target_s of work, by the queue's time per job as
    this process has seen it (a moving average over every job, learnt once per batch from its
    first start to its last end, shared by the queue's workers): batch_target_s / time per job, at least 1 (a coroutine handler's group) and at
    most batch_size. Quick jobs keep full batches; slow ones are claimed a few, or one, at a
    time. Before its first timed call a process claims batch_size; a per-batch handler always
    does (its batch is one call: no job waits behind another).
  - LineupWatch: one thread per process and server looks at the batches under way. A batch
    whose jobs are still unstarted batch_target_s after its claim, while one of its jobs runs
    and a consumer of the queue idles (its watch lock is held: looked at again every
    batch_target_s while none does), hands them back to the queue (queries.give_back: fenced
    by the claim's token, the attempt undone, the queue's count bumped) and wakes the queue's
    idle watcher as a producer does (the instant wake: KILL QUERY of its wait), which claims
    them, in this process or another.
    The batch first marks them as no longer its own to start (Batch.hand_back, under the lock
    its worker starts jobs under), so each is either started by its old worker or given back,
    never both. A batch hands back once: what its worker claims next is sized by then, and
    claimed once the give-back ended (Batch.given_back), or it would pass over the jobs still
    claimed by its own batch for lower-priority ones.

The average sees a batch only once its run ends: a slow job's first run is found by the watch,
the claims after it are sized by it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from notifyq import errors
from notifyq.config import Config
from notifyq.consume.handler import Handler
from notifyq.jobs import Job
from notifyq.wakeup.waker import InstantWake, instant_wanted
from notifyq.store import advisory, queries
from notifyq.store.db import Session
from notifyq.store.driver import DriverError
from notifyq.store.locks import QueueLocks

log = logging.getLogger("notifyq.consumer")

NEWEST_WEIGHT = 0.2  # of the newest job in the moving average: a change of pace shows within a few jobs
RECHECK_S = 0.01  # a due batch between two jobs (acking, extending) is looked at again after this


class WatchedBatch(Protocol):
    """What the watch reads of a batch under way (batch.py's Batch): declared here, so the
    worker's modules import the watch and the watch imports none of them."""

    token: int
    jobs: list[Job]
    claimed_at: float  # monotonic
    running: list[Job]  # in the handler right now
    running_since: float  # monotonic: when what runs now started

    def waiting(self) -> list[int]: ...

    def hand_back(self) -> list[int] | None: ...

    given_back: threading.Event  # cleared by hand_back() when it took jobs; set once they are back


@dataclass(frozen=True)
class HandBackRule:
    """When a queue's batch hands back what waits behind its running job (LineupWatch).

    long_only (a limited queue): only behind a job that has run batch_target_s itself. Its
    consumers idle whenever a limit holds jobs back, so a batch of quick jobs, adding up to
    batch_target_s, went back 50 ms after its claim every time: a churn of claims and
    give-backs on the keys' rows that stalled the queue for 25 s in the fault schedule. But the
    unstarted jobs of a limited key's batch hold its slots: 3 jobs of 3 s of a key limited to 3
    ran one after another on one worker while seven idled. Behind a long job they go back.
    even_if_none_idle (a fair queue): behind a long job, whether or not a consumer idles: the
    next claims, by whichever worker, take the keys in turn, where the batch would have run
    one key's backlog before a key put after its claim."""

    long_only: bool = False
    even_if_none_idle: bool = False

    @classmethod
    def of(cls, limited: bool, fair: bool) -> HandBackRule:
        return cls(long_only=limited, even_if_none_idle=fair)


class ClaimSizer:
    """One queue's time per job in this process, and the claim size it asks for."""

    def __init__(self) -> None:
        self.job_s: float | None = None  # None: no call timed yet
        self._lock = threading.Lock()  # the queue's workers observe from their own threads

    def observe(self, seconds: float, jobs: int) -> None:
        """`jobs` jobs took `seconds` (a batch's run): as many updates of the average, each with
        their mean time, in one step."""
        jobs = max(1, jobs)
        per_job = seconds / jobs
        weight = 1 - (1 - NEWEST_WEIGHT) ** jobs
        with self._lock:
            self.job_s = per_job if self.job_s is None else self.job_s + weight * (per_job - self.job_s)

    def size_for(self, handler: Handler, batch_size: int, target_s: float) -> int:
        """The next claim's size for `handler`. A per-batch handler's claims stay whole: one call
        runs them all, and smaller batches would only add calls (and a call's fixed cost, spread
        over fewer jobs, would shrink them further). A coroutine handler's take at least one
        group (`concurrency`), or its jobs would not run at once. (A rated queue's claims are
        sized the same: claiming only what starts at once made a refill start one job where the
        budget had room for more, a third of the rate with four workers.)"""
        if handler.per_batch:
            return batch_size
        group = min(batch_size, max(1, handler.concurrency))
        return max(group, self.size(batch_size, target_s))

    def size(self, batch_size: int, target_s: float) -> int:
        """Jobs for the next claim: about target_s of work, at least 1 and at most batch_size."""
        job_s = self.job_s
        if target_s <= 0 or job_s is None or job_s * batch_size <= target_s:
            return batch_size
        return max(1, min(batch_size, int(target_s / job_s)))


class LineupWatch:
    """The thread that hands back what waits behind a long job (one per Presence: per process
    and server). Idle costs nothing: the thread starts with the first batch it is given and
    waits on a condition while no batch is under way; the session opens at the first batch due."""

    def __init__(self, config: Config, stop: threading.Event):
        self.config = config  # the presence's (a reload replaces it)
        self.stop = stop
        self.handed_back = 0  # jobs given back by this watch (tests and benchmarks read it)
        self.in_flight = 0  # give-backs under way (tests read it; the watch's thread alone writes it)
        self._due: dict[WatchedBatch, tuple[float, str, float]] = {}  # batch -> (monotonic due time, queue, target)
        self._rules: dict[WatchedBatch, HandBackRule] = {}
        self._idle_here: dict[str, int] = {}  # queue -> its workers of this process that idle without watching
        self._sleeps_until = 0.0  # monotonic: the thread's wait ends then (inf: until notified)
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._session: Session | None = None
        self._wakers: dict[str, InstantWake] = {}

    def watch(self, batch: WatchedBatch, queue: str, target_s: float, rule: HandBackRule = HandBackRule()) -> None:
        """A per-job batch starts: due batch_target_s after its claim."""
        if target_s <= 0 or len(batch.jobs) < 2:
            return
        with self._cond:
            if self._closed:
                return
            due = batch.claimed_at + target_s
            self._due[batch] = (due, queue, target_s)
            self._rules[batch] = rule
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="notifyq-lineup", daemon=True)
                self._thread.start()
            elif due < self._sleeps_until:
                self._cond.notify()  # (a batch of a queue whose batch_target_s is shorter, or nothing was due)

    @contextlib.contextmanager
    def idling(self, queue: str) -> Iterator[None]:
        """A worker of `queue` idles without holding its watch lock (a cron run waiting for a
        limit's slot): a consumer the watch cannot see in the lock, but one that takes what is
        handed back."""
        with self._cond:
            self._idle_here[queue] = self._idle_here.get(queue, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                self._idle_here[queue] -= 1

    def done(self, batch: WatchedBatch) -> None:
        """The batch's run ended (its worker gives back what it did not start), or it handed back."""
        with self._cond:
            self._due.pop(batch, None)
            self._rules.pop(batch, None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(10)
        if self._session is not None:
            self._session.close()

    # -------------------------------------------------------- the thread

    def _loop(self) -> None:
        while True:
            with self._cond:
                due = self._next_due()
            if due is None:
                return
            for batch, queue, target_s, rule in due:
                try:
                    self._relieve(batch, queue, target_s, rule)
                except Exception as e:  # never let the thread die: the batches still run, in order
                    log.warning("could not hand back waiting jobs queue=%s error=%s", queue, e,
                                exc_info=not isinstance(e, errors.NotifyqError))

    def _next_due(self) -> list[tuple[WatchedBatch, str, float, HandBackRule]] | None:
        """(Under the condition) the batches due now, waiting until there are some; None: closed.
        Each is due again batch_target_s later: while no consumer idles, it is looked at that often."""
        while not self._closed:
            now = time.monotonic()
            due: list[tuple[WatchedBatch, str, float, HandBackRule]] = []
            for batch, (at, queue, target_s) in list(self._due.items()):
                if at <= now:
                    self._due[batch] = (now + target_s, queue, target_s)
                    due.append((batch, queue, target_s, self._rules.get(batch, HandBackRule())))
            if due:
                return due
            self._sleeps_until = min((at for at, _, _ in self._due.values()), default=math.inf)
            self._cond.wait(None if self._sleeps_until == math.inf else self._sleeps_until - now)
            self._sleeps_until = 0.0
        return None

    def _due_in(self, batch: WatchedBatch, seconds: float) -> None:
        with self._cond:
            if batch in self._due:
                _, queue, target_s = self._due[batch]
                self._due[batch] = (time.monotonic() + seconds, queue, target_s)

    def _relieve(self, batch: WatchedBatch, queue: str, target_s: float, rule: HandBackRule) -> None:
        """A due batch: what waits behind its running job goes back to the queue, if a consumer
        idles to take it (or as `rule` says). (Read without the batch's lock first: hand_back
        decides.)"""
        if self.stop.is_set():  # shutting down: the worker gives back what it does not start
            self.done(batch)
            return
        if not batch.running:
            self._due_in(batch, RECHECK_S)  # between two jobs: its worker starts the next one now
            return
        if not batch.waiting():
            self.done(batch)
            return
        ran_s = time.monotonic() - batch.running_since
        long_job = ran_s >= target_s
        if rule.long_only and not long_job:
            self._due_in(batch, target_s - ran_s)  # quick jobs in a row: looked at again if this one runs long
            return
        if not (rule.even_if_none_idle and long_job) and not self._someone_idles(queue):
            return  # every consumer is busy: the batch's own worker is as good as any (due again later)
        ids = batch.hand_back()
        if ids is None:
            self._due_in(batch, RECHECK_S)
            return
        self.done(batch)  # once: its worker's next claim is sized by then
        if ids:
            self.in_flight += 1
            try:
                self._give_back(batch, queue, ids)
            finally:
                self.in_flight -= 1
                batch.given_back.set()  # its worker may claim again: they are ready (or stay with their lease)

    def _someone_idles(self, queue: str) -> bool:
        """A consumer of the queue, in this process or another, waits for work: the queue's watch
        lock is held (by the watcher, idle or claiming). Polling consumers cannot be seen: then
        yes, as when the look fails."""
        with self._cond:
            if self._idle_here.get(queue, 0) > 0:
                return True
        if not self.config.wakeup.use_locks:
            return True
        try:
            return advisory.lock_holder(self._lineup_session(), self._locks(queue).watch) is not None
        except (errors.NotifyqError, DriverError) as e:
            log.debug("could not tell whether a consumer idles: handing back queue=%s error=%s", queue, e)
            return True

    def _lineup_session(self) -> Session:
        if self._session is None:
            # A give-back runs while the process's workers are busy, the moment its process may
            # be frozen (SIGSTOP, a paused VM) or its host vanish: its transaction would keep
            # the jobs' rows and a signal slot locked until the server's wait_timeout (8 h), and
            # every reaper pass waiting on them (liveness.reclaim_expired locks what it scans),
            # so not even its running job came back. Ended by the server after session_idle_s,
            # as a frozen consumer's liveness lock is: then they come back by their leases.
            self._session = Session(self.config.dsn, name="lineup", stop=self.stop,
                                    idle_in_transaction_s=math.ceil(self.config.consumer.session_idle_s),
                                    retry_s=self.config.connect_retry(oneshot=False), retry_setting="connect_retry_s",
                                    no_caller_deadline=True)
        return self._session

    def _locks(self, queue: str) -> QueueLocks:
        return QueueLocks(self.config.dsn.database, queue)

    def _give_back(self, batch: WatchedBatch, queue: str, ids: list[int]) -> None:
        try:
            n = queries.give_back(self._lineup_session(), queue, ids, batch.token)
        except errors.NotifyqError as e:
            # Marked as not ours to start, and out of the batch's lease extensions: the reaper
            # returns them when their lease runs out, as it would a dead consumer's.
            log.warning("could not hand back the jobs waiting behind a long one: they return when their "
                        "lease runs out queue=%s n=%d error=%s", queue, len(ids), e)
            return
        self.handed_back += n
        # Which jobs and whose claim: a job handed back was claimed, and unclaimable, until now
        # (the fault checker reads this line to tell that from a job left waiting)
        log.info("handed back jobs waiting behind a long one queue=%s n=%d since_claim_s=%.3f token=%d ids=%s",
                 queue, n, time.monotonic() - batch.claimed_at, batch.token, ",".join(map(str, ids)))
        if n:
            self.wake(queue, self._lineup_session())

    def wake(self, queue: str, session: Session) -> None:
        """The queue's idle watcher, in any process, claims what was given back now, not at its
        next poll (on `session`: the watch's, or the stop's give-back's)."""
        if not instant_wanted(self.config):
            return  # the watchers poll: their next look at the count finds them
        if queue not in self._wakers:
            self._wakers[queue] = InstantWake(queue, self._locks(queue))
        waker = self._wakers[queue].usable(self.config.wakeup.instant_wake)  # (a reload may have changed it)
        if waker is not None:
            waker.wake(session)
