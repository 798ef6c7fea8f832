"""Operator actions on single jobs and on many: list, show, retry, cancel, purge.

The library behind `notifyq jobs`; the periodic scheduler uses `purge` for retention. Bulk
actions work in chunks, one short transaction each, so a purge of a million dead jobs never
holds a million row locks or bloats the undo log: it can be interrupted at any point and run
again.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from notifyq import errors
from notifyq.config import values
from notifyq.config import validate_queue_name
from notifyq.jobs import STATUS_NAMES, Status, envelope
from notifyq.store import admin_queries, advisory, queries
from notifyq.store.db import Session
from notifyq.store.driver import DriverError
from notifyq.store.locks import QueueLocks

log = logging.getLogger("notifyq.admin")

STATUS_BY_NAME = {name: value for value, name in STATUS_NAMES.items()}
CHUNK = 1000  # rows per transaction in bulk actions


_GET_FIELDS = ("id", "queue", "status", "priority", "run_at", "attempts", "max_attempts", "owner",
               "claimed_at", "lease_until", "dedup_key", "cancel_requested", "suspect", "payload",
               "last_error", "created_at", "finished_at", "cancelled_by", "cancelled_at", "key")
_LIST_FIELDS = ("id", "queue", "status", "priority", "run_at", "attempts", "max_attempts",
                "created_at", "finished_at", "cancel_requested", "last_error", "key")


def parse_age(text: str) -> float:
    """'90s', '30m', '12h', '7d', '2w' or plain seconds -> seconds."""
    seconds = values.duration_text(text)
    if seconds is None:
        raise errors.InputError(
            f"invalid age {text!r}: expected a number with s, m, h, d or w, like 30m or 7d")
    return seconds


def parse_status(text: str) -> int:
    try:
        return STATUS_BY_NAME[text.strip().lower()]
    except KeyError:
        raise errors.InputError(
            f"invalid status {text!r}: expected one of {', '.join(STATUS_BY_NAME)}") from None


def _iso(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=dt.timezone.utc).isoformat()  # the session runs in UTC
    return value


def _record(fields: tuple[str, ...], row: tuple) -> dict[str, Any]:
    out = {name: _iso(value) for name, value in zip(fields, row)}
    out["status"] = STATUS_NAMES.get(out["status"], str(out["status"]))
    out["cancel_requested"] = bool(out["cancel_requested"])
    if "suspect" in out:
        out["suspect"] = bool(out["suspect"])
    return out


# ------------------------------------------------------------------ reading

def list_jobs(session: Session, *, queue: str | None = None, status: int | None = None,
              older_than_s: float = 0.0, limit: int = 100, key: str | None = None) -> list[dict[str, Any]]:
    """Oldest first. `older_than_s` compares with created_at; `key`: only jobs of that key."""
    if queue is not None:
        validate_queue_name(queue)
    if key is not None:
        values.job_key("--key", key)
    if limit < 1:
        raise errors.InputError("--limit must be at least 1")
    rows = admin_queries.list_jobs(session, queue=queue, status=status, age_s=older_than_s, after=0,
                                 limit=limit, key=key)
    return [_record(_LIST_FIELDS, r) for r in rows]


_ATTEMPT_FIELDS = ("attempt", "outcome", "consumer", "host", "started_at", "ended_at", "error", "traceback",
                   "result")


def get_job(session: Session, job_id: int, history: bool = False, parents: bool = True) -> dict[str, Any]:
    """The job's row; with history, its attempt records too ("history", oldest first); with
    parents, a workflow's job's parents counted ("parents": every edge read; the console
    counts a bounded number its own way). A job that is gone raises InputError saying what its
    records know: done, cancelled or purged (while retention keeps them), or never existed."""
    row = admin_queries.get_job(session, job_id)
    if row is None:
        raise errors.InputError(gone(session, job_id))
    job = _record(_GET_FIELDS, row)
    job["payload"], trace = _opened(job["payload"])  # (invalid JSON: the consumer will bury it)
    if trace is not None:  # put by a traced enqueue (notifyq.contrib.otel): its trace context
        job["trace"] = trace
    counted = admin_queries.job_progress(session, job_id) if parents else {}
    if any(counted.values()):  # a workflow's job: where its parents are (a callback's: its batch's)
        job["parents"] = counted
    if history:
        job["history"] = attempts(session, job_id)
    return job


def attempts(session: Session, job_id: int) -> list[dict[str, Any]]:
    out = []
    for row in admin_queries.job_attempts(session, job_id):
        record = {name: _iso(value) for name, value in zip(_ATTEMPT_FIELDS, row)}
        if record["result"] is not None:
            record["result"] = _decoded(record["result"])
        out.append(record)
    return out


def _opened(text: str) -> tuple[Any, dict[str, str] | None]:
    """A job's stored payload: the payload as put (decoded as _decoded does) and the trace
    context stored with it (jobs/envelope.py), if any."""
    try:
        return envelope.opened(text)
    except ValueError:
        return text, None


def _decoded(text: str) -> Any:
    """Stored JSON decoded; text that is not strictly JSON (invalid, or NaN and Infinity, which a
    result kept before they were refused may hold) as stored: a string, which `--json` prints as
    valid JSON."""
    try:
        return json.loads(text, parse_constant=_not_json)
    except ValueError:
        return text


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def show_job(session: Session, job_id: int) -> dict[str, Any]:
    """`jobs show`: get_job with its history; for a job whose row is gone (done and not kept,
    cancelled before it ran, purged) while retention keeps its attempt records, what they know:
    its status by the last record, a note saying what became of the row, and the history. Only
    a job without either raises InputError."""
    try:
        return get_job(session, job_id, history=True)
    except errors.InputError:
        history = attempts(session, job_id)
        if not history:
            raise
    outcome = history[-1]["outcome"]
    return {"id": job_id, "status": outcome if outcome in ("done", "cancelled", "purged", "replaced") else "gone",
            "note": f"no row (its records remain): {_fate(history[-1])}", "history": history}


def gone(session: Session, job_id: int) -> str:
    """Why there is no row for job_id, from its last attempt record."""
    history = attempts(session, job_id)
    if not history:
        return f"no job {job_id} (it never existed, or its records are past retention)"
    return f"no job {job_id}: {_fate(history[-1])}"


def _fate(last: dict[str, Any]) -> str:
    """What became of a job whose row is gone, by its last attempt record."""
    when = last["ended_at"]
    if last["outcome"] == "done":
        kept = "" if last["result"] is None else f"; its result: {json.dumps(last['result'])[:500]}"
        return f"it was done at {when} (attempt {last['attempt']}), and not kept{kept}"
    if last["outcome"] in ("cancelled", "purged"):
        return f"it was {last['outcome']} at {when}"
    if last["outcome"] == "replaced":  # put(dedup="replace"): the error names the job in its place
        return f"it was {last['error'] or 'replaced'} at {when}"
    return f"it is gone (its last attempt ended {last['outcome']} at {when}; purged since)"


# ------------------------------------------------------------------ retry

def set_paused(session: Session, queue: str, paused: bool) -> bool:
    """Pause or resume `queue` on this server; True when the queue did not exist before (it is
    created in that state: a typo would otherwise pause nothing, in silence)."""
    created = queries.set_paused(session, validate_queue_name(queue), paused)
    if not paused:
        wake_watcher(session, queue)
    return created


def wake_watcher(session: Session, queue: str) -> None:
    """Interrupt the idle consumer's wait on `queue` (KILL QUERY of its watch statement, as a
    producer's instant wake does: wakeup/waker.py), so that it reads the signal count again
    now and starts a resumed queue's jobs at once, not at its next poll. Best effort, and silent:
    nobody watching, a proxy between us (its ids are not the server's: no KILL then), another
    database user's consumers (the server refuses) or any error leave it to the poll."""
    watch = QueueLocks(session.dsn.database, queue).watch

    def body(cur) -> None:
        holder, me = advisory.lock_holder_and_me(cur, watch)
        if holder is not None and me == session.connection_id:
            advisory.kill_query(cur, holder)

    try:
        session.run(body, what="wake the watcher")
    except (errors.NotifyqError, DriverError) as e:
        log.debug("resume: could not wake the watcher, the consumers' poll finds the jobs queue=%s error=%s",
                  queue, e)


def retry(session: Session, job_id: int) -> str:
    """Dead, done, cancelled or scheduled -> ready now, attempts reset; a workflow's job waits
    again for its parents still pending (docs/workflows.md). Returns what happened."""
    job = get_job(session, job_id, parents=False)  # (a waiting job's parents: counted by _already)
    pending = _already(session, job)
    if pending is not None:
        return pending
    if job["status"] == "claimed":
        raise errors.InputError(f"job {job_id} is running (claimed): cancel it or let it finish first")
    # The statement's own count says whether this retry did it: of two retries racing (the
    # console's and the CLI's, two bulk actions), the row's lock lets one change it, and the
    # other changes nothing and finds the job pending again, retried by the first.
    if admin_queries.retry_jobs(session, [(job_id, job["queue"])]):
        return _retried(session, job_id)
    now = get_job(session, job_id, parents=False)  # it changed under us, or its dedup key is taken
    pending = _already(session, now)
    if pending is not None:
        return pending
    if now["status"] in ("dead", "done", "cancelled", "scheduled") and now["dedup_key"] is not None:
        raise errors.InputError(f"job {job_id}: another pending job holds dedup key {now['dedup_key']!r}")
    raise errors.InputError(f"job {job_id} is {now['status']} now: not retried")


def _already(session: Session, job: dict[str, Any]) -> str | None:
    """What a retry says of a job already ready or waiting (nothing to do), else None. Its
    parents are counted only for a waiting job (every edge read: a batch's callback has up to
    100,000): a retry of any other job reads them once, after it (_retried)."""
    if job["status"] == "ready":
        return "already ready"
    if job["status"] == "waiting":
        pending = admin_queries.job_progress(session, job["id"])["pending"]
        return f"already waiting for {_parents(pending)} still pending"
    return None


def _retried(session: Session, job_id: int) -> str:
    """What a retry did: a workflow's job says what it waits for, and which parents it runs without."""
    parents = admin_queries.job_progress(session, job_id)
    notes = []
    if parents["awaited"]:
        notes.append(f"it waits for {_parents(parents['awaited'])} still pending")
    if parents["failed"]:
        notes.append(f"it runs without {_parents(parents['failed'])} that ended dead or cancelled")
    return "retried" + (f" ({'; '.join(notes)})" if notes else "")


def _parents(n: int) -> str:
    return f"{n} parent" + ("" if n == 1 else "s")


def retry_dead(session: Session, queue: str | None = None, chunk: int = CHUNK) -> tuple[int, int]:
    """Every dead job (of `queue`) back to ready, in chunks. Returns (retried, skipped):
    skipped jobs keep status dead because a pending job holds their dedup key."""
    if queue is not None:
        validate_queue_name(queue)
    retried = skipped = 0
    after = 0
    while True:
        rows = admin_queries.job_ids(session, status=Status.DEAD, queue=queue, age_s=0, after=after,
                                   limit=chunk)
        if not rows:
            return retried, skipped
        n = admin_queries.retry_jobs(session, rows)
        retried += n
        skipped += len(rows) - n
        after = rows[-1][0]


# ------------------------------------------------------------------ cancel

def cancel(session: Session, job_id: int, by: str | None = None) -> str:
    """A pending job is deleted ('deleted'), a pending job of a workflow (waiting for its
    parents, or waited for) ends cancelled with its row kept ('cancelled': `retry` brings it
    back, and what it cancelled); a running one is asked to stop ('requested':
    Job.cancel_requested(); a command is stopped) and ends cancelled. `by`: who asks (default:
    this user@host)."""
    outcome = admin_queries.cancel_job(session, job_id, by)
    if outcome is not None:
        return outcome
    row = admin_queries.get_job(session, job_id)
    if row is None:
        raise errors.InputError(gone(session, job_id))
    raise errors.InputError(f"job {job_id} is {STATUS_NAMES.get(row[2], row[2])}: nothing to cancel")


# ------------------------------------------------------------------ purge

def purge(session: Session, statuses: list[int], older_than_s: float, queue: str | None = None,
          chunk: int = CHUNK, max_chunks: int | None = None) -> tuple[int, bool]:
    """Delete dead/done jobs finished more than `older_than_s` ago, `chunk` rows per transaction.

    Returns (deleted, complete). With `max_chunks` it stops early (complete=False) so a caller
    on a loop with a watchdog, like the retention pass, can spread a big backlog over turns.
    """
    if queue is not None:
        validate_queue_name(queue)
    if older_than_s < 0:
        raise errors.InputError("--older-than must not be negative")
    deleted = chunks = 0
    for status in statuses:
        if status not in (Status.DONE, Status.DEAD, Status.CANCELLED):
            raise errors.InputError("only dead, done and cancelled jobs can be purged")
        after = 0
        while True:
            if max_chunks is not None and chunks >= max_chunks:
                return deleted, False
            rows = admin_queries.job_ids(session, status=status, queue=queue, age_s=older_than_s,
                                       after=after, limit=chunk)
            if not rows:
                break
            deleted += admin_queries.purge_jobs(session, [r[0] for r in rows], status)
            chunks += 1
            after = rows[-1][0]
            if len(rows) < chunk:
                break
    return deleted, True
