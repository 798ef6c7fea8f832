"""What becomes of a job once its handler returned: acked, retried later, or buried; counted in
the worker's Stats and logged, one line per failed attempt.

Only outcomes the claim still owned count: an ack or a failure fenced out by the claim token
(the job was taken back: its lease ran out, or our session died) is counted and logged as a
lost ack, never as done. An outcome sent twice (by a batch's worker and by the stop) lands once
and counts once: the send it fenced out finds it landed (Acks.landed, Owned.earlier).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable
from operator import attrgetter

from notifyq import errors, logs
from notifyq.config import QueueConfig
from notifyq.consume import retry
from notifyq.consume.stats import Stats
from notifyq.jobs import Job, run_of
from notifyq.jobs.run import COMMITTED, PENDING, Run
from notifyq.store import queries
from notifyq.store import results as kept
from notifyq.store.completion import Completion
from notifyq.store.db import Session

log = logging.getLogger("notifyq.consumer")

_COMPLETED = attrgetter("completed")  # a Run's: how the handler completed its job, if it did
SHORT_ERROR_BYTES = 1000  # a job's error when the server refused its full text
LOST_IDS_SHOWN = 20  # job ids named in one "acks lost" line
CUT_NOTE = " [cut short: the server refused the full text]"
CANCEL_SEEN = "cancelled: the handler saw the cancel and returned"
COUNTED_CLAIMS = 8  # the last claims whose outcomes counted are remembered (Outcomes.first_count)


class Outcomes:
    def __init__(self, queue: str, qc: QueueConfig, stats: Stats):
        self.queue, self.qc, self.stats = queue, qc, stats
        # A limited queue's: called after each COMMIT that freed slots (consume/slots.py), with
        # whether a consumer watched as the claim that carried them read it (None: not read)
        self.freed: Callable[..., None] | None = None
        # Called with the queues of the workflow children an ack released, once it is sent
        # (wakeup/queue_wakes.py wakes their idle consumers). Every ack reports here, whoever
        # sends it: the next claim's (PendingAcks.claim), or one on its own (ack()): a flush, a
        # batch whose lease is due an extension or whose worker stops, the stop's own sends.
        self.on_release: Callable[[tuple[str, ...]], None] | None = None
        # claim token -> the ids of its outcomes counted, for the last COUNTED_CLAIMS claims: a
        # job's outcome sent twice (its worker's send held by the server past the grace's end,
        # and the stop's, of Batch.sending, on another thread) lands once, and counts once
        self._counted: dict[int, set[int]] = {}
        # (reentrant: count_acked holds it across first_count and its count, so that the stop's
        # summary, read once the stop's send returned, has every success the worker's send took)
        self._counted_lock = threading.RLock()

    def send(self, session: Session, jobs: list[Job], token: int,
             carry: bool = False) -> queries.Acks | None:
        """Retry or bury the failures, and ack the successes in one statement; or, with carry,
        send no ack: return the successes' Acks for the next claim's COMMIT (consume/acking.py)."""
        if not jobs:
            return None
        if log.isEnabledFor(logging.DEBUG):
            for job in jobs:
                log.debug("job %s queue=%s job=%d attempt=%d", "ok" if job.error is None else "failed",
                          self.queue, job.id, job.attempts)
        self._observe(jobs)
        freed = 0  # a limited queue's slots freed by jobs completed in their own transactions
        if any(map(_COMPLETED, map(run_of, jobs))):  # (COMMITTED or PENDING: a non-empty text)
            rest = self._completed(session, jobs, token)
            freed = len(jobs) - len(rest) if self.qc.limited else 0
            jobs = rest
        # Each job's outcome sorted out in one pass (a batch is up to its claim's size)
        failures: list[tuple[Job, str, bool]] = []
        snoozed: list[tuple[Job, Run]] = []
        ok: list[tuple[Job, Run]] = []
        interrupted: list[Job] = []
        for job in jobs:
            run = run_of(job)
            error, snooze_s = run.error, run.snooze_s  # (each read once: a property's call)
            if error is None and snooze_s is None and run.cancel_seen:
                # it saw its cancel, then returned: it stopped as asked, so it ends cancelled
                run.fail(CANCEL_SEEN, retry=False)
                error = run.error
            if run.interrupted:  # its consumer's shutdown stopped it: not a failure (Run.interrupt)
                interrupted.append(job)
            elif error is not None:
                failures.append((job, error, run.retry))
            elif snooze_s is not None:
                snoozed.append((job, run))
            else:
                ok.append((job, run))
        if interrupted:
            self.record_interrupted(session, token, interrupted)
        if failures:
            self.record_failures(session, token, failures)
        if snoozed:
            owned = queries.reschedule_or_bury(session, self.queue, token, [
                queries.Failure(j.id, r.snooze_s, "cancelled while snoozing", j.attempts, None, r.started,
                                r.ended, snooze=True, clock=r.clock) for j, r in snoozed], wake=self.qc.limited)
            self._report_ended(owned)
            first = set(self.first_count(token, list(owned)))  # (each once, whichever send landed it)
            self.stats.snoozed += len(first - owned.cancelled)
            for job, _ in snoozed:
                if job.id in owned.cancelled and job.id in first:
                    self._count_cancelled(job, "cancelled while snoozing")
            self._count_lost([j.id for j, _ in snoozed if j.id not in owned])
        if not ok:
            if freed:
                # Their COMMITs freed slots and bumped no signal (an ack's bump would have: it
                # moves the signal whatever its count): the watcher, whose last claim saw the
                # limit hold their keys' next jobs, would wait out its safety timeout (60 s)
                queries.slots_freed(session, self.queue, freed)
                if self.freed is not None:
                    self.freed()
            return None
        max_packet = session.max_allowed_packet
        results = [kept_text(r, j.id, max_packet) for j, r in ok] if self.qc.keeps_results else None
        acks = queries.Acks([j.id for j, _ in ok], token, self.qc.keep_done,
                            [t if (t := r.started) is not None else 0.0 for _, r in ok],
                            [t if (t := r.ended) is not None else 0.0 for _, r in ok], results,
                            [r.task for _, r in ok], wake=self.queue if self.qc.limited else None,
                            clock=ok[0][1].clock,  # (one claim's jobs: one clock)
                            keys=[j.key for j, _ in ok] if self.qc.limited else None)
        if carry:
            return acks
        self.ack(session, acks)
        if self.freed is not None:
            self.freed()
        return None

    def _observe(self, jobs: list[Job]) -> None:
        """Each finished job's run time and its wait in the queue, by task. The wait runs from
        its due time (run_at: its enqueue's, its delay's or its retry's, on the server's clock,
        UTC) to its start (this host's clock: one reading of it per call, the start's monotonic
        time taken from it; a skew between the clocks that makes it negative counts as 0)."""
        by_task = self.stats.by_task
        now_utc, now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None), time.monotonic()
        for job in jobs:
            run = run_of(job)
            started, ended = run.started, run.ended
            if started is not None and ended is not None:
                figures = by_task.of(run.task)
                figures.job_seconds.observe(ended - started)
                figures.queue_wait.observe(max(0.0, (now_utc - job.run_at).total_seconds() - (now - started)))

    def _completed(self, session: Session, jobs: list[Job], token: int) -> list[Job]:
        """Jobs the handler completed in its own transaction are done: never acked again, never
        counted lost. One completed on a caller's connection (complete_in) is done if that
        transaction committed (asked once for the batch); if not, nothing of it is stored and
        the job fails. Returns the jobs whose outcome is still to be sent."""
        pending = [j for j in jobs if run_of(j).completed == PENDING]
        landed = Completion(session, token, self.qc.keep_done).completions_landed(pending) if pending else set()
        rest, results, released = [], [], []
        for job in jobs:
            run = run_of(job)
            landed_here = run.completed == PENDING and job.id in landed
            if landed_here:
                released += run.released
            if run.completed == COMMITTED or landed_here:
                if self.first_count(token, [job.id]):
                    self.stats.succeeded += 1
                    self.stats.by_task.of(run.task).counters["succeeded"] += 1
                text = kept_text(run, job.id, session.max_allowed_packet) if self.qc.keeps_results else None
                if text is not None:
                    results.append((job.id, text))
                if job.error is not None:
                    log.warning("the handler failed after its job's completion committed: the job is done "
                                "queue=%s job=%d error=%s", self.queue, job.id, job.error[:200])
                continue
            if run.completed == PENDING:
                run.completion_missed()
            rest.append(job)
        # The caller's COMMIT released workflow children: their queues' idle consumers are woken
        # as after an ack's (job.transaction() blocks wake them at their own COMMIT)
        self._tell_released(released)
        try:  # the value returned after the completion committed: written right after it
            kept.keep_results(session, token, results)
        except errors.NotifyqError as e:
            log.warning("could not keep results of completed jobs queue=%s n=%d error=%s", self.queue, len(results), e)
        return rest

    def ack(self, session: Session, acks: queries.Acks) -> None:
        """Ack the successes `acks` on their own, now."""
        self.count_acked(acks, queries.ack(session, acks.ids, acks.token, acks.keep, acks))
        self.report_release(acks)

    def _report_ended(self, owned: queries.Owned) -> None:
        """Failures sent: the queues of the workflow children that run anyway which the jobs that
        ended dead or cancelled released are told to on_release, as an ack's are."""
        self._tell_released(owned.released)

    def report_release(self, acks: queries.Acks) -> None:
        """`acks` were sent: the queues of the workflow children they released (if any) are told
        to on_release."""
        self._tell_released(acks.released)

    def _tell_released(self, queues: Iterable[str]) -> None:
        if queues and self.on_release is not None:
            self.on_release(tuple(queues))

    def count_acked(self, acks: queries.Acks, acked: int) -> None:
        """`acked` of `acks` landed (the ack's row count, alone or in a claim's COMMIT; which
        ones, when fewer than all: acks.landed). Each counts once: one that another send of the
        same outcomes counted already (the stop's, or the worker's) counts no more."""
        if acked >= len(acks.ids) or acks.landed is not None:
            landed = acks.ids if acked >= len(acks.ids) else [i for i in acks.ids if i in acks.landed]
            with self._counted_lock:
                counted = self.first_count(acks.token, landed)
                self.stats.succeeded += len(counted)
            if acks.tasks and counted:
                by_task = self.stats.by_task
                if len(counted) == len(acks.ids):
                    tasks = acks.tasks
                else:
                    chosen = set(counted)
                    tasks = [task for job_id, task in zip(acks.ids, acks.tasks) if job_id in chosen]
                for task in tasks:
                    by_task.of(task).counters["succeeded"] += 1
        else:  # how many, not which: counted under no task (the endpoint's remainder)
            self.stats.succeeded += acked
        self._count_lost(acks.ids, len(acks.ids) - acked)

    def first_count(self, token: int, ids: list[int]) -> list[int]:
        """Of `ids`, outcomes of the claim `token` that landed (successes, failures, snoozes,
        interrupts: a job has one per claim), those not counted yet: counted from now on. Both
        threads that may send a batch's outcomes (its worker's, the stop's) ask, under a lock."""
        with self._counted_lock:
            seen = self._counted.get(token)
            if seen is None:  # (the usual case: the claim's first count)
                self._counted[token] = set(ids)
                if len(self._counted) > COUNTED_CLAIMS:
                    del self._counted[next(iter(self._counted))]  # the oldest claim's
                return ids
            first = [job_id for job_id in ids if job_id not in seen]
            seen.update(first)
            return first

    def _count_lost(self, ids: list[int], lost: int | None = None) -> None:
        """`lost` of the jobs `ids` (None: all of them) were fenced out of their outcome."""
        lost = len(ids) if lost is None else lost
        if lost:
            # The claim was taken from us (lease expired or our session died and the reaper
            # moved in): the job belongs to someone else now. Count it, touch nothing. Which
            # jobs: the operator's way to their records (`notifyq jobs show ID`).
            self.stats.lost_acks += lost
            shown = ",".join(map(str, ids[:LOST_IDS_SHOWN])) + ("..." if len(ids) > LOST_IDS_SHOWN else "")
            log.warning("acks lost: jobs were reclaimed from us queue=%s n=%d %s=%s", self.queue, lost,
                        "jobs" if lost == len(ids) else "among", shown)

    def _count_cancelled(self, job: Job, error: str) -> None:
        """Its cancel was requested while it ran (`notifyq jobs cancel`): what the operator asked
        for, so neither a failure nor dead, and said at INFO."""
        self.stats.cancelled += 1
        self.stats.by_task.of(run_of(job).task).counters["cancelled"] += 1
        log.info("job cancelled queue=%s job=%d attempt=%d/%d error=%s", job.queue, job.id, job.attempts,
                 job.max_attempts, error[:200])

    def record_interrupted(self, session: Session, token: int, jobs: list[Job]) -> None:
        """Jobs the shutdown grace ran out on (Run.interrupt): back to ready, uncharged, each
        attempt recorded 'interrupted'. Counted as given back; a job cancelled meanwhile as a
        cancel, one taken from us as lost."""
        owned = queries.reschedule_or_bury(session, self.queue, token, [
            queries.Failure(j.id, 0.0, j.error or "interrupted", j.attempts, None, run_of(j).started,
                            run_of(j).ended, interrupted=True, clock=run_of(j).clock) for j in jobs])
        self._report_ended(owned)
        first = set(self.first_count(token, list(owned)))  # (each once, whichever send landed it)
        back = [j for j in jobs if j.id in first and j.id not in owned.cancelled]
        self.stats.given_back += len(back)
        for job in jobs:
            if job.id in owned.cancelled and job.id in first:
                self._count_cancelled(job, job.error or "interrupted")
        if back:
            log.warning("interrupted by the shutdown: given back, no attempt charged queue=%s n=%d jobs=%s",
                        self.queue, len(back), ",".join(str(j.id) for j in back[:LOST_IDS_SHOWN]))
        self._count_lost([j.id for j in jobs if j.id not in owned])

    def record_failures(self, session: Session, token: int, failures: list[tuple[Job, str, bool]]) -> None:
        """Retry later (by the queue's policy) or bury each (job, error, may retry); counts and
        logs the ones this claim still owned (a job cancelled while it ran as a cancel), and
        those taken from us as lost (not those whose failure the server would not record: left
        to their lease)."""
        decided = [(job, retry.next_delay_s(job.attempts, job.max_attempts, self.qc.retry_base_s,
                                            self.qc.retry_max_s) if may_retry else None, error)
                   for job, error, may_retry in failures]
        try:
            owned = queries.reschedule_or_bury(session, self.queue, token,
                                               [_failure(j, d, e) for j, d, e in decided], wake=self.qc.limited)
            unrecorded: list[Job] = []
        except errors.DatabaseError:
            raise  # the server is away: the worker's outage path, as for any statement
        except Exception as e:  # the server refused the statement: it must not end the worker
            owned, unrecorded = self._fail_one_by_one(session, token, decided, e)
        self._report_ended(owned)
        if owned and self.freed is not None:
            self.freed()
        logged: dict[str, int] = {}  # traceback -> the job whose line showed it
        # Each counted and logged once, whichever send landed it (this one, or the other of a
        # batch whose outcomes both its worker and the stop sent: Owned.earlier)
        first = set(self.first_count(token, list(owned)))
        for job, delay, error in decided:
            if job.id not in first:
                continue
            if job.id in owned.cancelled:
                self._count_cancelled(job, error)
                continue
            self.stats.failed += 1
            counters = self.stats.by_task.of(run_of(job).task).counters
            counters["failed"] += 1
            if delay is None:
                self.stats.dead += 1
                counters["dead"] += 1
            else:
                self.stats.retried += 1
                counters["retried"] += 1
            _log_failure(job, delay, error, logged)
        left = {j.id for j in unrecorded}
        self._count_lost([j.id for j, _, _ in decided if j.id not in owned and j.id not in left])

    def _fail_one_by_one(self, session: Session, token: int, decided: list[tuple[Job, float | None, str]],
                         refused: Exception) -> tuple[queries.Owned, list[Job]]:
        """The failures' statement was refused (a trigger, a server limit, a driver that cannot
        encode the text): each job's failure on its own, with its error, then with the error cut
        short. A job whose failure is refused both times is left to its lease: the reaper takes
        it back then, and the worker goes on."""
        log.warning("could not record failures, recording them one by one queue=%s n=%d error=%s",
                    self.queue, len(decided), refused)
        owned = queries.Owned()
        unrecorded: list[Job] = []
        for job, delay, error in decided:
            texts = [error] if len(decided) > 1 else []  # one job alone: its full text was just refused
            texts.append(queries.error_text(error, SHORT_ERROR_BYTES - len(CUT_NOTE)) + CUT_NOTE)
            for text in texts:
                try:
                    alone = queries.reschedule_or_bury(session, self.queue, token, [_failure(job, delay, text)],
                                                       wake=self.qc.limited)
                    owned += alone
                    owned.cancelled |= alone.cancelled
                    owned.earlier |= alone.earlier
                    owned.released += alone.released
                    break
                except errors.DatabaseError:
                    raise
                except Exception as e:
                    refused = e
            else:
                unrecorded.append(job)
                log.error("could not record a job's failure: left to its lease queue=%s job=%d error=%s",
                          self.queue, job.id, refused)
        return owned, unrecorded


def kept_text(run: Run, job_id: int, max_packet: int) -> str | None:
    """A success's result as kept: rendered when its handler returned (Run.encode_result), or
    now if it was not (a path that hands outcomes over without the batch's run)."""
    return run.text if run.encoded else kept.result_text(run.result, job_id, max_packet)


def _failure(job: Job, delay: float | None, error: str) -> queries.Failure:
    run = run_of(job)
    return queries.Failure(job.id, delay, error, job.attempts, job.detail, run.started, run.ended,
                           clock=run.clock)


def _log_failure(job: Job, delay: float | None, error: str, logged: dict[str, int]) -> None:
    """One line per failed attempt: which job, which attempt, what happens next (retry at a UTC
    time, or dead) and why, with the handler's traceback (shown once per batch: a batch handler
    that raised fails all its jobs with the same one).

    For the app's own logging: the record carries what the handler raised as its exc_info (an
    error reporter's logging integration, Sentry's, and JSON formatters see an exception, not a
    string), with the job's fields as attributes of the record (record.queue, record.job,
    record.attempt, record.next, record.error, and record.task for a task's job). The message
    itself (logs.Line) leaves the traceback to exc_info then, so that a plain formatter prints
    it once."""
    fields: dict[str, object] = {"queue": job.queue, "job": job.id,
                                 "attempt": f"{job.attempts}/{job.max_attempts}"}
    if delay is None:
        fields["next"] = "dead" if job.retry else "dead (not retried)"
    else:
        at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=delay)
        fields["next"] = "retry at " + at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    fields["error"] = error[:2000]
    exc_info = None
    if job.detail:
        if job.detail in logged:
            fields["traceback"] = f"as for job {logged[job.detail]}"
        else:
            logged[job.detail] = job.id
            fields["traceback"] = job.detail.rstrip("\n")
            exc = job.exception
            if exc is not None:
                exc_info = (type(exc), exc, exc.__traceback__)
    shown = fields if exc_info is None else {k: v for k, v in fields.items() if k != "traceback"}
    task = run_of(job).task  # as its handler names it: "" for a plain handler's job
    # (an app's handlers have no logs.Redactor: the attributes are redacted here, as Line is)
    extra = {**logs.kv(**fields), **{k: logs.redact(v) if isinstance(v, str) else v
                                     for k, v in fields.items() if k != "traceback"}}
    if task:
        extra["task"] = task
    if delay is None:
        log.error(logs.Line("job dead", shown), extra=extra, exc_info=exc_info)
    else:
        log.warning(logs.Line("job failed, retrying", shown), extra=extra, exc_info=exc_info)
