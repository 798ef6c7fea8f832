"""Batch: one claim in a worker's hands, and its run: its jobs through the handler in claim
order, the lease of what it still holds pushed out, what finished acked about once a second,
what never started given back.

The claim's lease covers every job of the batch from the claim on. Jobs that wait behind a
long-running one would see it run out while their consumer is alive and well, and a reaper
would hand them to another consumer: the batch would run them twice. So the run pushes the
lease of the jobs it still holds out again, in one statement, at most every lease/3, before
it starts the next job; the answer says which jobs are still its own, and a job that is not
is never started. The service reads `running` and `waiting()` from its own thread at shutdown,
and at the stop gives back at once what waits behind a running job (BatchRun.give_back_waiting).

`Batch` is the claim's state (pure); `BatchRun` runs it on the worker's work session, from the
claim to the acks it leaves with its worker's pending acks (acking.py: they ride the next claim).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from notifyq import errors
from notifyq.config import QueueConfig
from notifyq.consume import timeout
from notifyq.consume.acking import PendingAcks
from notifyq.consume.effects import Completion
from notifyq.consume.lineup import HandBackRule
from notifyq.consume.outcomes import Outcomes
from notifyq.consume.presence import Presence
from notifyq.consume.stats import Stats
from notifyq.consume.timeout import HandlerCaller, Stray
from notifyq.consume.traced import Traced
from notifyq.jobs import Job, envelope, run_of, tracing
from notifyq.store import queries
from notifyq.store import results as kept
from notifyq.store.db import Session
from notifyq.store.pipeline import Pending

log = logging.getLogger("notifyq.consumer")

EXTEND_EVERY = 1 / 3  # of the lease: two more chances to extend before it would run out
ACK_FLUSH_S = 1.0  # a long per-job batch acks what is done at least this often
GRACE_EXPIRED = "interrupted: the shutdown grace expired while the handler ran"
STOPPED_WHILE_RETRYING = "interrupted: the consumer stopped while its server was unreachable"
GIVE_BACK_WAIT_S = 5.0  # the longest a worker waits, before its next claim, for jobs its batch is handing back


class Batch:
    def __init__(self, token: int, jobs: list[Job], lease_s: float, claimed_at: float,
                 commit: Pending | None = None, owner: str = "", epoch: int = 0,
                 connection: int | None = None, server_run: float | None = None):
        self.token = token
        self.owner = owner  # the consumer id claimed under
        self.epoch = epoch  # the Presence's registration it was made (or last confirmed) in
        self.commit = commit  # the claim's COMMIT, sent ahead: read at the session's next statement
        self.connection = connection  # the server's id of the connection it was sent on
        self.server_run = server_run  # and the server's run that connection was of (Session.server_run)
        self.retake_tried = False  # the claim was taken again after its COMMIT failed (or tried to be)
        self.jobs = jobs
        self.lease_s = lease_s  # the claim's own: a reload changes the next claims' lease, not this one
        self.claimed_at = claimed_at  # monotonic, taken before the claim was sent
        self.extended_at = claimed_at  # monotonic, taken before the statement was sent
        self.started = 0  # jobs[:started] have been handed to the handler
        # The span of what ran, for the claim sizer's pace (BatchRun._observe_pace): the first
        # start and the last end, and how many jobs ran between, kept as they start and finish
        self.first_start: float | None = None
        self.last_end = 0.0
        self.ran = 0
        self.running: list[Job] = []  # in the handler right now
        self.running_since = claimed_at  # monotonic: when `running` started
        # Finished, outcome not yet sent (acks go out about once a second): still claimed, so
        # still covered by every extension. A long job's extend_lease() once pushed out its own
        # lease alone, and the finished jobs before it expired and ran again elsewhere.
        self.done: list[Job] = []
        # Finished jobs whose outcomes the worker is sending (a frozen server can hold that send
        # past the grace: the shutdown then sends them too, fenced by the token)
        self.sending: list[Job] = []
        # Settled: every outcome sent and what never started given back, by its run or, at
        # shutdown, by abandon. Ended: its run is over, settled or not (a settle that met the
        # server away leaves the rest to the shutdown: Worker.abandon)
        self.settled = threading.Event()
        self.ended = threading.Event()
        # Not ours to start: taken back from us (their lease ran out), or handed back to the
        # queue while a long job ran ahead of them (lineup.py)
        self.lost: set[int] = set()
        # Held while the worker picks and starts the next jobs, and while the lineup watch
        # (another thread) picks what to hand back: a job is started or handed back, never both.
        self.start_lock = threading.Lock()
        # Set at the consumer's stop (stop_starting): no job of it starts from then on, whatever
        # its worker was doing when the stop came (it may have looked at the stop just before)
        self.stopping = False
        self.handed_back = 0  # jobs the lineup watch took to hand back (counted once the run ended)
        # Clear while the lineup watch, or the stop (BatchRun.give_back_waiting), gives jobs of
        # this batch back (set once their give-back ended): the worker's next claim waits for it, or it would find them still claimed, by
        # this batch, and take lower-priority jobs over them
        self.given_back = threading.Event()
        self.given_back.set()
        # timeout_s: helper threads whose call timed out (their extensions are refused: the work
        # session is not theirs any more), under handler_lock with every handler's extension
        self.revoked: set[int] = set()
        self.handler_lock = threading.Lock()

    def claim_lost(self) -> bool:
        """The claim's COMMIT failed (or its connection was lost) after its jobs began to run,
        and the claim was not taken again (retaken): none of them is ours to start any more
        (the rest are given back, fenced by token)."""
        return self.commit is not None and self.commit.failed

    def retaken(self, held: list[int]) -> list[int]:
        """After a failed COMMIT, the claim holds `held` now, committed (queries.retake): it is
        settled, and what waits outside it is not ours to start. Returns the waiting ids lost."""
        self.commit = None
        gone = [job_id for job_id in self.waiting() if job_id not in set(held)]
        self.lost.update(gone)
        return gone

    def waiting(self) -> list[int]:
        """Ids of the jobs not started yet that are still ours."""
        return [j.id for j in self.jobs[self.started:] if j.id not in self.lost]

    def held(self) -> list[int]:
        """What a lease extension covers: every job whose outcome is not sent yet."""
        return [j.id for j in self.done] + [j.id for j in self.running] + self.waiting()

    def extend_due(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return now - self.extended_at >= self.lease_s * EXTEND_EVERY

    def extended(self, asked: list[int], owned: list[int], sent_at: float) -> list[int]:
        """Record an extension's answer; returns the waiting ids we no longer own."""
        self.extended_at = sent_at
        started = {j.id for j in self.running} | {j.id for j in self.done}
        gone = [job_id for job_id in set(asked) - set(owned) if job_id not in started]
        self.lost.update(gone)
        return sorted(gone)

    def taken_back(self) -> list[int]:
        """The whole claim is someone else's now: none of what waits is ours to start. Returns
        the ids that waited."""
        gone = self.waiting()
        self.lost.update(gone)
        return gone

    def skip(self) -> None:
        """The next job is lost: pass over it without starting it."""
        self.started += 1

    def next_group(self, size: int) -> list[Job]:
        """The next jobs to start together: up to `size`, in claim order, ending before a job
        that is no longer ours (start() counts from `started`)."""
        if size == 1:  # a plain handler's every job: no slice, no loop
            job = self.jobs[self.started] if self.started < len(self.jobs) else None
            return [] if job is None or job.id in self.lost else [job]
        group: list[Job] = []
        for job in self.jobs[self.started:self.started + size]:
            if job.id in self.lost:
                break
            group.append(job)
        return group

    def start_next(self, size: int, stop: threading.Event | None = None) -> list[Job]:
        """The next group (next_group), started; none once the consumer stops (`stop`, looked
        at here, under the lock, as the job would start: the worker's own look came before
        statements that a frozen server can hold past the stop, the grace's end even)."""
        with self.start_lock:
            group = [] if self.stopping or (stop is not None and stop.is_set()) else self.next_group(size)
            self.start(group)
            return group

    def start_all(self, stop: threading.Event | None = None) -> bool:
        """A per-batch handler's: every job started together, unless the consumer stops (a
        claim whose reply came after the stop); False then, and none started."""
        with self.start_lock:
            if self.stopping or (stop is not None and stop.is_set()):
                return False
            self.start(self.jobs)
            return True

    def hand_back(self) -> list[int] | None:
        """The lineup watch's (another thread): while a job runs, the jobs waiting behind it
        become not ours to start, and are returned, for the queue; None: no job runs right
        now (its worker is between two jobs, and about to start the next)."""
        with self.start_lock:
            ids = self._take_waiting()
            if ids is not None:
                self.handed_back += len(ids)
            return ids

    def stop_starting(self) -> list[int] | None:
        """The consumer stops (the service's thread): the batch starts no job from now on, and
        what waits behind a running job is returned, as hand_back does, to be given back now
        rather than when that job ends. None: no job runs (its worker, between two jobs or
        before the first, gives back what waits itself as it stops; a per-batch handler's
        jobs all start together, and none waits once they run)."""
        with self.start_lock:
            self.stopping = True
            return self._take_waiting()

    def not_given_back(self, ids: list[int]) -> None:
        """Jobs stop_starting took whose give-back failed (the server away at the stop): the
        batch's again, for its settle or the shutdown's abandon to give back with the rest.
        Never started: the batch is stopping."""
        with self.start_lock:
            self.lost.difference_update(ids)

    def _take_waiting(self) -> list[int] | None:
        """(Under start_lock) what waits behind the running job, no longer ours to start; None:
        no job runs."""
        if not self.running:
            return None
        ids = self.waiting()
        self.lost.update(ids)
        if ids:
            self.given_back.clear()  # set once their give-back ended
        return ids

    def start(self, jobs: list[Job]) -> None:
        self.started += len(jobs)
        self.running = jobs
        if not jobs:
            return
        now = self.running_since = time.monotonic()
        for job in jobs:
            run_of(job).start(now)
        if self.first_start is None:
            self.first_start = now

    def finish(self, at: float | None = None) -> None:
        """The running jobs finished: now, or `at` (monotonic), when their handler's end was
        earlier (a command's exit, seen by the stop)."""
        now = time.monotonic() if at is None else at
        running = self.running
        for job in running:
            run_of(job).finish(now)
        if running:
            self.done += running
            self.ran += len(running)
            self.last_end = now
            self.running = []

    def take_done(self) -> list[Job]:
        """The finished jobs, for their outcomes to be sent: no longer the batch's to extend."""
        done, self.done = self.done, []
        return done


class Crew(Protocol):
    """What a batch's run uses of the worker that claimed it (consume/worker.py)."""

    queue: str
    stats: Stats
    outcomes: Outcomes
    acks: PendingAcks  # where the run's successes wait for the next claim
    caller: HandlerCaller
    presence: Presence  # the worker is who asks it (its seats know their holders)
    stop: threading.Event
    work: Session

    def replace_work_session(self) -> Session:
        """A new work session, the worker's from now on: a timed-out call keeps the old one."""


class BatchRun:
    """One batch's run on its worker's work session. Its successes go to the worker's pending
    acks (for its next claim's COMMIT); its handler, lease and timeout_s are the claim's (`qc`,
    `handler`): a reload applies them from the next batch (and a command that runs across a
    reload is the one killed at shutdown); the outcomes' retry backoff follows a reload at once
    (Worker.reload). The service may `abandon` it from its own thread."""

    def __init__(self, batch: Batch, worker: Crew, qc: QueueConfig, handler: Any):
        self.batch = batch
        self.worker = worker
        self.queue, self.qc, self.stats, self.outcomes = worker.queue, qc, worker.stats, worker.outcomes
        self.handler, self.caller = handler, worker.caller  # the handler when the claim was made
        self.presence, self.stop = worker.presence, worker.stop
        self.thread_id: int | None = None  # the worker's thread, once run() runs: whose call a handler knows
        self.completion: Completion | None = None  # what the jobs still to start complete through
        self._aside: Session | None = None  # extensions asked for inside a job.transaction() block

    @property
    def work(self) -> Session:
        """The worker's work session (a new one after a call timed out)."""
        return self.worker.work

    def run(self) -> None:
        batch = self.batch
        jobs, token = batch.jobs, batch.token
        self.stats.claimed += len(jobs)
        self.stats.batches += 1
        self.thread_id = threading.get_ident()
        self.stats.batch_sizes.observe(len(jobs))
        self._hand_out(jobs)
        log.debug("claimed batch queue=%s n=%d token=%d", self.queue, len(jobs), token)
        t0 = time.monotonic()
        try:
            if self.handler.per_batch:
                if batch.start_all(self.stop):  # (else the settle gives them all back)
                    ready = [j for j in jobs if j.error is None]
                    self._call(ready)
                    self._encode_results(ready)
                    batch.finish()
            else:
                # What waits behind a long job goes back to the queue (lineup.py); a limited
                # or fair queue's by rules of its own (HandBackRule)
                self.presence.lineup.watch(batch, self.queue, self.qc.batch_target_s,
                                           HandBackRule.of(self.qc.limited, self.qc.fair))
                self._run_in_order()
            self._observe_pace()
        except BaseException as e:
            # Only the worker's own failures get here (handlers.py turns every exception a handler
            # raises into its job's failure): fail what was running rather than leave it claimed.
            # Unless the consumer's stop ended a retry (a lease extension under a command that met
            # a server restart; the command was ended first): the shutdown's doing, not the job's.
            stopped = self.stop.is_set() and isinstance(e, errors.TransientDBError)
            for job in batch.running:
                if job.error is None and stopped:
                    run_of(job).interrupt(STOPPED_WHILE_RETRYING)
                elif job.error is None:
                    job.fail(f"the consumer failed while the job ran: {type(e).__name__}: {e}")
            batch.finish()
            raise
        finally:
            self.presence.lineup.done(batch)
            # Counted here, on the worker's thread, as its own give-backs are: no job runs any
            # more, so the watch cannot take more of this batch.
            self.stats.given_back += batch.handed_back
            try:
                self._settle_batch()
            finally:
                if log.isEnabledFor(logging.DEBUG):  # (its count is a pass over the batch)
                    log.debug("batch done queue=%s n=%d failed=%d seconds=%.3f", self.queue, len(jobs),
                              sum(1 for j in jobs if j.error is not None), time.monotonic() - t0)
                if self._aside is not None:
                    self._aside.close()

    def _settle_batch(self) -> None:
        """The outcomes of what ran, and what never started given back. Each step even if one
        before it raised: a worker that fails leaves nothing of its batch claimed that it could
        have settled (its process then exits, deregistered). The batch is settled once nothing
        of it is left: what a failed step left (outcomes not sent, jobs not given back) is still
        the batch's, which the shutdown settles (Worker.abandon)."""
        batch = self.batch
        try:
            self._confirm_claim()  # before the outcomes: acks land only under a claim that holds
            self._wait_for_give_back()
            self._settle(batch.take_done())
        finally:
            self._give_back_rest()
            if not batch.held():
                batch.settled.set()

    def _give_back_rest(self) -> None:
        """What never started goes back to the queue."""
        batch = self.batch
        rest = batch.waiting()
        if rest:
            n = queries.give_back(self.work, self.queue, rest, batch.token)
            batch.lost.update(rest)  # back in the queue: not the batch's to give back again
            self.stats.given_back += n
            log.info("gave back unstarted jobs queue=%s n=%d token=%d ids=%s", self.queue, n, batch.token,
                     ",".join(map(str, rest)))

    def _wait_for_give_back(self) -> None:
        """Jobs the watch is giving back are still claimed by this batch until its COMMIT: a
        claim now would pass over them for lower-priority ones, so the worker waits for it
        (bounded: a give-back stuck on the server must not stop the worker; they then return as
        before). The finished jobs' acks wait too: their lease is pushed out while it does (the
        wait is longer than a short lease)."""
        batch = self.batch
        deadline = time.monotonic() + GIVE_BACK_WAIT_S
        while True:
            now = time.monotonic()
            wait_s = deadline - now
            if batch.done:  # (nothing finished: no lease of ours to keep)
                wait_s = min(wait_s, batch.extended_at + batch.lease_s * EXTEND_EVERY - now)
            if batch.given_back.wait(max(0.0, wait_s)):
                return
            if time.monotonic() >= deadline:
                log.debug("claiming while jobs handed back are not back yet queue=%s", self.queue)
                return
            if batch.extend_due():
                self.extend()

    def _settle(self, done: list[Job]) -> None:
        """The finished jobs' outcomes: the successes' acks kept for the next claim, unless
        their lease is due an extension (the last job or the give-back took a third of it):
        then acked now, on their own, rather than left to a claim that may come late. If sending
        them fails on anything but the server (a fault of ours), they are sent again at once
        without the handlers' values (a result is all of theirs the outcomes carry), and the fault
        is raised after: the batch is settled whatever ends the worker. A stopping worker claims
        no more: its acks go now, with the batch. Not sent for want of the server, they are the
        batch's again (its `done`), for the shutdown to send (Worker.abandon)."""
        self.batch.sending = done  # on the wire: the shutdown sends them too if this hangs (abandon)
        try:
            self._send_done(done)
        except errors.DatabaseError:
            self.batch.done[:0] = done
            raise  # the server is away: the worker's outage path (the reaper takes the rest back)
        finally:
            self.batch.sending = []

    def _send_done(self, done: list[Job]) -> None:
        try:
            carry = not (self.stop.is_set() or self.batch.extend_due())
            self.worker.acks.keep(self.outcomes.send(self.work, done, self.batch.token, carry=carry))
        except errors.DatabaseError:
            raise  # (the server's: not sent again here)
        except Exception as e:
            log.error("could not send the outcomes of finished jobs: sent again without their results "
                      "queue=%s n=%d error=%s: %s", self.queue, len(done), type(e).__name__, e)
            for job in done:
                run_of(job).drop_result()
            self.outcomes.send(self.work, done, self.batch.token)
            raise

    def _hand_out(self, jobs: list[Job]) -> None:
        """What each job carries into the handler: its payload decoded, its lease extension, and
        its completion in the handler's own transaction (job.transaction(), cancel checks)."""
        batch = self.batch

        def extend() -> None:  # job.extend_lease(): at once, as the handler asks
            with batch.handler_lock:  # (a handler past its timeout_s extends nothing any more)
                if threading.get_ident() not in batch.revoked:
                    self.extend()

        completion = self.completion = self._completion()
        for job in jobs:
            run = run_of(job)
            try:  # the payload as put, and the trace context stored with it (jobs/envelope.py)
                job.payload, trace = envelope.opened(job.payload)
                if trace is not None:
                    run.carried(trace)
            except ValueError as e:
                job.fail(f"payload is not valid JSON: {e}", retry=False)
            else:
                run.named(self.handler.task_name(job))
            run.hand(extend, completion)

    def _completion(self) -> Completion:
        completion = Completion(self.work, self.batch.token, self.qc.keep_done, self.qc.keeps_results,
                                self.batch.owner)
        completion.settle_claim = self._confirm_claim
        completion.released = self.worker.release_wake.wake
        return completion

    def _run_in_order(self) -> None:
        """Per-job handlers: one job at a time in claim order; a coroutine handler with
        `concurrency` N up to N at once (a group, started and finished together)."""
        batch, jobs = self.batch, self.batch.jobs
        size = max(1, getattr(self.handler, "concurrency", 1))
        last_flush = time.monotonic()
        while batch.started < len(jobs):
            job = jobs[batch.started]
            if batch.started and batch.commit is not None and not batch.commit.settled:
                # The first job ran while the claim's COMMIT was on the wire; the second
                # starts only once it landed. A failed COMMIT unlocked the rows (on Galera,
                # another node's claim won certification): a peer may hold them already.
                self.work.pipeline.read_reply()
            if self.stop.is_set() or (batch.claim_lost() and not self._retake()):
                break
            now = time.monotonic()
            extend_due = batch.extend_due(now)
            if extend_due or now - last_flush >= ACK_FLUSH_S:
                # Acks first: then every job of the claim still held is extended at
                # once, and a stalled consumer's jobs all expire together.
                lost_before = self.stats.lost_acks
                self.outcomes.send(self.work, batch.take_done(), batch.token)
                last_flush = time.monotonic()
                # An ack fenced out: the claim was taken back; learn what is left of it.
                extend_due = extend_due or self.stats.lost_acks > lost_before
            if not self._still_ours(now):
                break
            if extend_due or batch.epoch != self.presence.epoch:
                self.extend()  # before the next start: never start a job not ours
                batch.epoch = self.presence.epoch
            if job.id in batch.lost:
                batch.skip()
                continue
            if not extend_due and batch.extend_due():
                # The process stalled since `now` (SIGSTOP, a paused VM) long enough for the
                # lease to want an extension: the checks above are stale, make them again. (A
                # stall after this line, before the handler's first, cannot be seen from here.)
                continue
            # The first job alone: it may run while the claim's COMMIT is on the wire.
            group = batch.start_next(size if batch.started else 1, self.stop)
            if not group:
                continue  # the consumer stopped since the look above: the loop's look ends it
            if len(group) == 1:  # (a plain handler's every job: no list made, Job.error's call skipped)
                ready = group if run_of(group[0]).error is None else []
            else:
                ready = [j for j in group if j.error is None]
            if ready:
                self._call(ready)
                self._encode_results(ready)
            batch.finish()

    def _confirm_claim(self) -> None:
        """The claim's COMMIT read, and the claim taken again if it failed (_retake): so that what
        ran is acked under a claim that holds it. Once no job of the batch runs any more (a batch
        of one job, or a per-batch handler's, ends before any other statement read it), and
        before a handler's first statement through its completion (a cancel check, a
        job.transaction(), complete_in)."""
        batch = self.batch
        if batch.commit is not None and not batch.commit.settled:
            self.work.pipeline.read_reply()
        if batch.claim_lost():
            self._retake()

    def _retake(self) -> bool:
        """The claim's COMMIT failed, or lost its reply, after its first jobs started: whether it
        landed is learnt, and what it did not mark is taken again if nobody took it meanwhile
        (queries.retake). A job that ran then runs only once, and the batch goes on with what
        the claim holds. False: the claim is lost (as a crash loses it; its acks are fenced)."""
        batch = self.batch
        if batch.retake_tried:  # once: a claim given up stays given up
            return False
        batch.retake_tried = True
        jobs = batch.jobs[:batch.started] + [j for j in batch.jobs[batch.started:] if j.id not in batch.lost]
        try:
            flow = self.worker.flow  # a limited queue's jobs are taken again within its limits
            held = queries.retake(self.work, jobs, batch.token, batch.owner, batch.lease_s,
                                  batch.connection, batch.claimed_at, batch.server_run,
                                  limits=flow.limits if flow is not None else None)
        except errors.NotifyqError as e:
            log.warning("could not learn whether a claim whose COMMIT failed is ours: it is given up "
                        "queue=%s error=%s", self.queue, e)
            return False
        if held is None:
            log.warning("a claim whose COMMIT failed was sent on a connection that outlived its KILL: "
                        "it is given up queue=%s", self.queue)
            return False
        gone = batch.retaken(held)
        log.warning("a claim whose COMMIT failed holds %d of its %d jobs now, committed: the batch goes on "
                    "queue=%s lost=%s", len(held), len(jobs), self.queue, ",".join(map(str, gone[:20])) or "-")
        return True

    def _still_ours(self, now: float) -> bool:
        """Before a job starts: is the claim still this process's? From what the presence knows
        at no cost; only when that is too old (the process stalled, or its liveness session
        went silent) one check, and a re-registration if it failed. Under another consumer id
        now, the old one's claims are a reaper's (it held the old lock when we asked): the rest
        of the batch is not ours to start. Under the same id in a new epoch, the caller's lease
        extension says which jobs are left."""
        if not self.presence.known_alive(now):
            try:
                self.presence.confirm_alive(self.worker, self.work)
            except errors.NotifyqError as e:  # cannot tell: start nothing more of this batch
                log.warning("could not confirm the claim is still ours: the rest of the batch is "
                            "given back queue=%s error=%s", self.queue, e)
                return False
        if self.presence.consumer_id == self.batch.owner:
            return True
        gone = self.batch.taken_back()
        log.warning("claim taken back while this process was silent: the rest of the batch is "
                    "someone else's now queue=%s n=%d jobs=%s", self.queue, len(gone),
                    ",".join(map(str, gone[:20])))
        return False

    def _observe_pace(self) -> None:
        """The queue's claim sizer learns the batch's time per job: from its first start to its
        last end, over the jobs that ran (a group of coroutines counts as its jobs). Once per
        batch, from the span the batch kept as its jobs started and finished."""
        batch = self.batch
        if batch.ran and batch.first_start is not None:
            self.presence.claim_sizers[self.queue].observe(batch.last_end - batch.first_start, batch.ran)

    def _call(self, jobs: list[Job]) -> None:
        handler = self.handler
        if tracing.HOOK is not None:  # read per call: an app may instrument after the consumer started
            handler = Traced(handler, tracing.HOOK, self.queue)
        self.caller.call(handler, jobs, self._keep_lease, self.qc.timeout_s, self._take_over)

    def _encode_results(self, jobs: list[Job]) -> None:
        """What the handler returned for `jobs`, rendered as kept (or let go: a queue that keeps
        no results) now, on the worker's thread, before the next job starts (Run.encode_result)."""
        if self.qc.keeps_results:
            max_packet = self.work.max_allowed_packet
            for job in jobs:
                run_of(job).encode_result(lambda value, job_id=job.id: kept.result_text(value, job_id, max_packet))
        else:
            for job in jobs:
                run_of(job).drop_result()

    def _take_over(self, stray: Stray) -> None:
        """A call ran past its timeout_s: its thread extends nothing any more (an extension under
        way ends first), its completion refuses what it asks from now on, and its connection is
        ended (the server rolls back a job.transaction() it has open, and its locks go: the
        job's next run never waits on them), as are those it completed a job on with
        complete_in and did not commit; the session is closed when the call returns. The
        run goes on with a new one, and the jobs still to start complete on it."""
        batch = self.batch
        with batch.handler_lock:
            batch.revoked.add(stray.ident)
        stale = {id(c): c for c in (run_of(job).completion for job in stray.jobs) if c is not None}
        for completion in stale.values():
            completion.revoked = True
        old = self.work
        self.worker.replace_work_session()
        timeout.end_connection(self.work, self.queue, old.connection_id, old.open_at, old.server_run)
        timeout.end_callers(self.work, self.queue, batch.token,
                            {job_id: conn for c in stale.values() for job_id, conn in c.caller_conns.items()})
        stray.abandon(old.close)
        fresh = self.completion = self._completion()
        for job in batch.jobs[batch.started:]:
            run_of(job).complete_through(fresh)
        log.warning("handler timed out: its job fails, its thread is left running queue=%s jobs=%s "
                    "timeout_s=%g", self.queue, ",".join(str(j.id) for j in stray.jobs[:20]), stray.timeout_s)

    def _extension_session(self) -> Session:
        """The work session, unless a job.transaction() block is open on it (a handler's
        job.extend_lease() inside its block): its COMMIT would commit the block's writes early,
        so the extension goes through a session of its own, opened then and closed with the run."""
        if self.completion is None or not self.completion.in_block:
            return self.work
        if self._aside is None:
            self._aside = Session(self.work.dsn, name=f"{self.work.name}-aside", stop=self.work.stop,
                                  retry_s=self.work.retry_s, retry_setting=self.work.retry_setting,
                                  no_caller_deadline=True)
        return self._aside

    def _keep_lease(self) -> None:
        """A command handler, every second or so while it runs."""
        if self.batch.extend_due():
            self.extend()

    def extend(self) -> None:
        """Push out the lease of what the batch still holds; what comes back lost is skipped."""
        batch = self.batch
        asked, sent_at = batch.held(), time.monotonic()
        owned = queries.extend_lease(self._extension_session(), asked, batch.token, batch.lease_s)
        gone = batch.extended(asked, owned, sent_at)
        if gone:
            log.warning("leases ran out before the jobs started: skipped, they are someone "
                        "else's now queue=%s n=%d jobs=%s", self.queue, len(gone),
                        ",".join(map(str, gone[:20])))

    def give_back_waiting(self, session: Session) -> None:
        """The consumer stops (the service's thread, on its own session, once, soon after the
        stop): what waits behind the running job goes back to the queue now, uncharged and
        fenced by the claim's token, for another consumer to run during the grace, rather than
        when the job ends or the grace does. The batch starts nothing more (Batch.stop_starting),
        and its run's settle waits for this give-back (given_back) as for the lineup watch's.
        Best effort: a give-back that fails leaves them to the batch's settle, or to abandon."""
        batch = self.batch
        ids = batch.stop_starting()
        if not ids:
            return
        try:
            n = queries.give_back(session, self.queue, ids, batch.token)
        except Exception as e:  # (whatever it was: the jobs must not stay out of the batch's hands)
            batch.not_given_back(ids)
            log.warning("could not give back the unstarted jobs at the stop: the batch gives them back as "
                        "it ends queue=%s n=%d error=%s", self.queue, len(ids), e,
                        exc_info=not isinstance(e, errors.NotifyqError))
            return
        finally:
            batch.given_back.set()  # (after not_given_back: its settle then finds them waiting)
        self.stats.given_back += n
        # Which jobs and whose claim, as the batch's own give-back says it (the fault checker reads it)
        log.info("gave back unstarted jobs at the stop queue=%s n=%d token=%d ids=%s", self.queue, n,
                 batch.token, ",".join(map(str, ids)))
        if n:
            self.presence.lineup.wake(self.queue, session)

    def abandon(self, session: Session) -> None:
        """The shutdown grace expired while the handler still ran, or the run ended without
        settling the batch (its server away as it ended): the service's thread, on its own
        session (the work session is the stuck handler's, or closed).

        What finished before it gets its outcome (its ack was still pending). What waits is given
        back uncharged. What runs was interrupted, not failed: a deploy is not the job's fault,
        and charging it pushed long jobs toward dead, one deploy at a time. It goes back to ready
        uncharged, its attempt recorded 'interrupted' (its handler thread runs on until the
        process exits; a job.transaction() it has open dies with the process's connections).
        Only this live process's own give-back is an interruption: a consumer that crashes
        while a job runs has the job charged by the reaper, so a job that kills its consumer
        every time still ends dead. Nothing is left claimed by a process that is about to exit.
        """
        batch = self.batch
        running = list(batch.running)
        if running and self.handler.ran_to_end(self.thread_id):
            # A command that exited 0 while its call still waited on the server (frozen, or
            # retried until the grace's end): done, not interrupted, ended when it exited
            batch.finish(self.handler.ended_at(self.thread_id))
            running = []
        finished = batch.take_done()
        finished += [j for j in batch.sending if j not in finished]
        self.outcomes.send(session, finished, batch.token)
        waiting = batch.waiting()
        if waiting:
            # (the count read after the give-back's reply: its worker may count its own meanwhile)
            n = queries.give_back(session, self.queue, waiting, batch.token)
            self.stats.given_back += n
        for job in running:
            if job.error is None:
                run_of(job).interrupt(GRACE_EXPIRED)
        self.outcomes.send(session, running, batch.token)
        batch.settled.set()
