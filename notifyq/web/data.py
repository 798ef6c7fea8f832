"""What the status pages show, read from every server through the store's admin reads (the
console's own pages and bulk and periodic actions: console.py).

One Reader per server process: a few sessions per server (SESSIONS, in place of the one of
sharding/servers.py), each used by one request at a time, so a slow page holds one of them and
the others still answer; a request that finds none free within SESSION_WAIT_S is told the
pages are busy (503) rather than waiting behind the others. A server that cannot be reached
is reported on the page, never raised: the others still answer. The reads of one page share
its deadline (Reader.page, deadline.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from notifyq import errors
from notifyq.config import Config, validate_queue_name
from notifyq.jobs import STATUS_NAMES, Status
from notifyq.ops import admin
from notifyq.ops import locks as lock_view
from notifyq.sharding.servers import DOWN, Servers
from notifyq.store import admin_queries
from notifyq.store.db import Session, address
from notifyq.store.driver import DriverError, describe
from notifyq.store.locks import QueueLocks
from notifyq.web import deadline, workflow

log = logging.getLogger("notifyq.web")
T = TypeVar("T")

PAYLOAD_SHOWN_BYTES = 64 * 1024  # a job's page shows this much of its payload
LIST_LIMIT = 50
LIST_LIMIT_MAX = 500
PAGE_QUEUES = admin_queries.WEB_QUEUES_PER_STATEMENT  # the overview's queues a page (?after=NAME: the next)
STATES = ("ready", "scheduled", "claimed", "done", "dead", "cancelled")  # the jobs list's filter
FINISHED = ("done", "dead", "cancelled")  # listed newest first, by when they finished
DEPTH_COLUMNS = ("ready", "scheduled", "retrying", "claimed", "dead", "cancelled", "done")
_LIST_FIELDS = ("id", "queue", "status", "priority", "run_at", "attempts", "max_attempts", "created_at",
                "finished_at", "cancel_requested", "last_error", "dedup_key")


SESSIONS = 3  # database sessions per server; fewer than the requests served at once (bounds.HANDLERS)
SESSION_WAIT_S = 5.0  # a request waits this long for a free session, then its page is a 503
READ_TIMEOUT_S = 15  # a statement's answer is awaited this long (the session's read timeout)


class Busy(errors.NotifyqError):
    """Every session of a server stayed in use for SESSION_WAIT_S: the page says so (503)."""


class Reader(Servers):
    """SESSIONS sessions per server (each connects when first used), in place of the one of
    sharding/servers.py; a server that does not answer is logged."""

    def __init__(self, config: Config, sessions: int = SESSIONS):
        # As a one-shot command: a server that is down costs a page connect_retry_s (5 s) at
        # most, once (Reader.page), and the retries are logged at DEBUG only (the page, or the
        # start's one line, says it).
        super().__init__(config, "web", config.connect_retry(oneshot=True), retry_setting="connect_retry_s")
        self._pools: dict[str, queue.LifoQueue[Session]] = {}
        self._made: dict[str, list[Session]] = {}
        for shard, (first, lock) in self._sessions.items():
            made = [Session(first.dsn, retry_s=first.retry_s, name="web", retry_log_level=logging.DEBUG,
                            read_timeout_s=READ_TIMEOUT_S, retry_setting=first.retry_setting)
                    for _ in range(sessions)]
            self._sessions[shard] = (made[0], lock)  # where() names the first one's node
            # Last in, first out: the sessions in use stay few and warm when requests come one at a time.
            self._pools[shard] = pool = queue.LifoQueue()
            for session in reversed(made):
                pool.put(session)
            self._made[shard] = made
        self._page = threading.local()  # .time: the PageTime of the GET this thread answers, if any
        self._cutter = deadline.Cutter()

    @contextlib.contextmanager
    def page(self, budget_s: float = deadline.PAGE_S, started: float | None = None) -> Iterator[None]:
        """The reads of this thread's page share one deadline, `budget_s` from `started` (its
        connection's accept; None: now) (deadline.py): the page answers within it whatever the
        servers do."""
        self._page.time = deadline.PageTime(budget_s, started)
        try:
            yield
        finally:
            self._page.time = None

    def one(self, name: str, work: Callable[[Session], T]) -> T:
        """`work(session)` on a free session of one server; its errors are the caller's. Inside
        page(): within the page's time, and a server that failed this page fails it again at once."""
        pool = self._pools.get(name)
        if pool is None:
            raise errors.InputError(f"no shard {name!r}")
        page: deadline.PageTime | None = getattr(self._page, "time", None)
        if page is None:
            return self._on_session(name, pool, work, SESSION_WAIT_S, None)
        if name in page.down:
            raise errors.DatabaseError(page.down[name])
        try:
            return self._on_session(name, pool, work, min(SESSION_WAIT_S, page.left()), page)
        except DOWN as e:
            page.down[name] = describe(e) if isinstance(e, DriverError) else str(e)
            raise

    def _on_session(self, name: str, pool: queue.LifoQueue[Session], work: Callable[[Session], T],
                    wait_s: float, page: deadline.PageTime | None) -> T:
        try:
            session = pool.get(timeout=max(0.0, wait_s))
        except queue.Empty:
            raise Busy(f"busy: the {len(self._made[name])} sessions of {('shard ' + name) if name else 'the server'} "
                       f"stayed in use for {wait_s:.3g} s; try again") from None
        if page is None:
            try:
                return work(session)
            finally:
                pool.put(session)
        retry_s = session.retry_s
        try:
            left = page.left()
            if left <= 0 or (not session.connected and left < deadline.CONNECT_FLOOR_S):
                raise errors.DatabaseError(self._late(session, page))
            # Its connect retries end in time for their last attempt's own timeout to end within
            # the page's time (deadline.py)
            session.retry_s = max(0.0, min(retry_s, left - deadline.CONNECT_FLOOR_S))
            self._cutter.arm(session, page.deadline)
            try:
                return work(session)
            except (errors.DatabaseError, DriverError) as e:
                if page.left() <= 0:  # cut at the deadline, or its retries ran out with it
                    raise errors.DatabaseError(self._late(session, page)) from e
                raise
            finally:
                if self._cutter.disarm(session):
                    session.discard()  # its socket was cut: the next read reconnects
        finally:
            session.retry_s = retry_s
            pool.put(session)

    @staticmethod
    def _late(session: Session, page: deadline.PageTime) -> str:
        return (f"the database server at {address(session.dsn)} did not answer within the page's "
                f"{page.budget_s:g} s")

    def check(self) -> dict[str, str]:
        down = super().check()
        for name, error in down.items():
            log.warning("web: shard %r is down at start: %s", name, error)
        return down

    def each(self, work: Callable[[Session], T], names: Iterable[str] | None = None) -> tuple[dict[str, T], dict[str, str]]:
        answers, down = super().each(work, names)
        for name, error in down.items():
            log.warning("web: shard %r did not answer: %s", name, error)
        return answers, down

    def close(self) -> None:
        """Close each session as it comes back (one still in use after SESSION_WAIT_S is left
        to its request, whose thread ends with the process)."""
        self._cutter.close()
        for name, pool in self._pools.items():
            for _ in self._made[name]:
                try:
                    pool.get(timeout=SESSION_WAIT_S).close()
                except queue.Empty:
                    break


def age_s(now: dt.datetime, then: dt.datetime | None) -> float | None:
    return None if then is None else max(0.0, (now - then).total_seconds())


def _queue_figures(session: Session, after: str) -> dict[str, Any]:
    """One page of queues (named after `after`) with their figures; one more name than the
    page holds, if there is one, says that a next page exists."""
    now = admin_queries.server_now(session)
    rows = admin_queries.web_queue_page(session, after, PAGE_QUEUES + 1)
    names = [name for name, _paused in rows[:PAGE_QUEUES]]
    figures = admin_queries.web_queue_figures(session, names)
    alive: dict[str, int] = {}
    for _cid, _host, _pid, qs, _started, _seen, _wakeup, is_alive in admin_queries.consumers(session):
        for q in qs.split(","):
            alive[q] = alive.get(q, 0) + int(bool(is_alive))
    cap, sample = admin_queries.WEB_COUNT_CAP, admin_queries.WEB_RETRY_SAMPLE
    out = {}
    for name, paused in rows[:PAGE_QUEUES]:
        f = figures[name]
        d = f["depth"]
        retrying, estimated = d["retrying"], d["scheduled"] > sample
        if estimated:  # the share of retries among the soonest due, over every scheduled job
            retrying = round(retrying / sample * d["scheduled"])
        depth = {"ready": d["ready"] + d["due"], "scheduled": d["scheduled"] - retrying,
                 "retrying": retrying, "claimed": d["claimed"], "dead": d["dead"], "cancelled": d["cancelled"],
                 "done": d["done"]}
        capped = {"ready": cap in (d["ready"], d["due"]), "scheduled": d["scheduled"] == cap,
                  "retrying": d["scheduled"] == cap, "claimed": d["claimed"] == cap,
                  "dead": d["dead"] == cap, "cancelled": d["cancelled"] == cap, "done": d["done"] == cap}
        approx = {state: estimated and state in ("scheduled", "retrying") for state in depth}
        due = f["oldest"].get("scheduled")
        firsts = [t for t in (f["oldest"].get("ready"), due if due is not None and due <= now else None) if t]
        minutes = admin_queries.WEB_RATE_MINUTES
        rate = {"done": [0] * minutes, "dead": [0] * minutes}
        for status, ago, n in f["rate"]:
            if 0 <= ago < minutes:
                rate["done" if status == Status.DONE else "dead"][ago] += n
        out[name] = {"paused": bool(paused), "depth": depth, "capped": capped, "approx": approx,
                     "consumers": alive.get(name, 0),
                     "oldest_ready_age_s": age_s(now, min(firsts)) if firsts else None, "rate": rate}
    return {"now": now, "queues": out, "more": [name for name, _paused in rows[PAGE_QUEUES:]]}


def overview(reader: Reader, after: str = "") -> dict[str, Any]:
    """A page of the queues: the first PAGE_QUEUES names after `after` over every server (a
    queue on several shards has a row for each), and the name the next page starts after."""
    answers, down = reader.each(lambda session: _queue_figures(session, after))
    names = sorted({name for data in answers.values() for name in [*data["queues"], *data["more"]]})
    shown = set(names[:PAGE_QUEUES])  # each server sent its first PAGE_QUEUES + 1: these are whole
    rows = [{"name": name, "shard": shard, **q} for shard, data in answers.items()
            for name, q in data["queues"].items() if name in shown]
    rows.sort(key=lambda r: (r["name"], r["shard"]))
    return {"queues": rows, "down": down, "where": reader.where(), "columns": DEPTH_COLUMNS,
            "after": after, "next_after": max(shown) if len(names) > PAGE_QUEUES else None,
            "cap": admin_queries.WEB_COUNT_CAP,
            "sample": admin_queries.WEB_RETRY_SAMPLE, "minutes": admin_queries.WEB_RATE_MINUTES}


def consumer_rows(session: Session) -> list[dict[str, Any]]:
    now = admin_queries.server_now(session)
    held = admin_queries.web_claims_by_owner(session)
    return [{"id": cid, "host": host, "pid": pid, "queues": qs.split(","), "started_at": started,
             "last_seen": seen, "last_seen_age_s": age_s(now, seen), "wakeup": wakeup, "alive": bool(alive),
             "in_hand": held.get(cid, 0)}
            for cid, host, pid, qs, started, seen, wakeup, alive in admin_queries.consumers(session)]


def consumers(reader: Reader, locks: bool = False) -> dict[str, Any]:
    """locks: also each server's advisory locks, who holds and who waits (ops/locks.py): asked
    for on the page (?locks=1), read from performance_schema only then."""
    def read(session: Session) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        rows = consumer_rows(session)
        if not locks:
            return rows, None
        queues = sorted({name for name, _paused, _watched, _total in admin_queries.queue_rows(session)})
        return rows, lock_view.read(session, queues, rows)

    answers, down = reader.each(read)
    rows = [{**c, "shard": shard} for shard, (found, _) in sorted(answers.items()) for c in found]
    held = {shard: shown for shard, (_, shown) in sorted(answers.items()) if shown is not None}
    return {"consumers": rows, "down": down, "locks": held if locks else None}


def parse_after(query: dict[str, str]) -> str:
    """The overview's page: the queue name it starts after ("" for the first page)."""
    after = query.get("after", "").strip()
    return validate_queue_name(after) if after else ""


def parse_filters(query: dict[str, str], shards: tuple[str, ...]) -> dict[str, Any]:
    """The jobs page's filters from its query string; a bad one is an InputError naming it."""
    queue = query.get("queue", "").strip() or None
    if queue is not None:
        validate_queue_name(queue)
    state = query.get("state", "").strip() or "ready"
    if state not in STATES:
        raise errors.InputError(f"state {state!r}: expected one of {', '.join(STATES)}")
    dedup = query.get("dedup", "") or None
    if dedup is not None and queue is None:
        raise errors.InputError("a dedup key is looked up within a queue: choose the queue too")
    if dedup is not None and len(dedup) > 191:
        raise errors.InputError("a dedup key has at most 191 characters")
    limit = parse_whole(query, "limit", LIST_LIMIT, 1, LIST_LIMIT_MAX)
    shard = query.get("shard", "") or None
    if shard is not None and shard not in shards:
        raise errors.InputError(f"no shard {shard!r}")
    return {"queue": queue, "state": state, "dedup": dedup, "limit": limit, "shard": shard}


def parse_whole(query: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    """A whole number of a query string, `default` when absent or empty: ASCII digits only
    (int() would take any script's digits, '٣' as 3, and '1_0', '-5' or 5,000 digits), from
    `low` to `high`; else one InputError naming it."""
    text = query.get(name, "").strip()
    if not text:
        return default
    if not (text.isascii() and text.isdigit()):
        raise errors.InputError(f"{name} {text[:40]!r}: expected a whole number from {low} to {high}")
    if len(text) > len(str(high)) or not low <= int(text) <= high:
        raise errors.InputError(f"{name} {text[:20]}{'…' if len(text) > 20 else ''}: expected {low} to {high}")
    return int(text)


def listed(row: tuple) -> dict[str, Any]:
    job = dict(zip(_LIST_FIELDS, row))
    job["status"] = STATUS_NAMES.get(job["status"], str(job["status"]))
    return job


def jobs(reader: Reader, f: dict[str, Any]) -> dict[str, Any]:
    """One state's jobs, of one queue or of every queue (each queue's first `limit`, merged)."""
    status = admin.parse_status(f["state"])
    newest = f["state"] in FINISHED

    def work(session: Session) -> list[dict[str, Any]]:
        if f["dedup"] is not None:
            job_id = admin_queries.web_dedup_job(session, f["queue"], f["dedup"])
            row = None if job_id is None else admin_queries.get_job(session, job_id)
            return [] if row is None else [admin.get_job(session, job_id, parents=False)]  # (not listed)
        names = [f["queue"]] if f["queue"] else [r[0] for r in admin_queries.queue_rows(session)]
        return [listed(r) for r in admin_queries.web_jobs(session, status=status, queues=names,
                                                           limit=f["limit"], newest=newest)]

    answers, down = reader.each(work, None if f["shard"] is None else [f["shard"]])
    rows = [{**j, "shard": shard} for shard, found in answers.items() for j in found]
    if newest:
        rows.sort(key=lambda j: (j["finished_at"] or j["created_at"], j["id"]), reverse=True)
    else:
        rows.sort(key=lambda j: (-j["priority"] if status == Status.READY else 0, j["run_at"], j["id"]))
    return {"jobs": rows[:f["limit"]], "down": down, "filters": f, "more": len(rows) > f["limit"],
            "finished": FINISHED}


def job(reader: Reader, shard: str, job_id: int) -> dict[str, Any]:
    """Every field of one job, and its attempts' records (newest first: start, end, consumer,
    host, outcome, error, traceback, result), its place in a workflow (workflow.job_graph); the
    payload pretty-printed and cut at PAYLOAD_SHOWN_BYTES."""
    def read(session: Session) -> dict[str, Any]:
        found = admin.get_job(session, job_id, history=True, parents=False)
        found["graph"] = workflow.job_graph(session, job_id, found["status"] == "waiting")  # None: no workflow's
        return found

    found = reader.one(shard, read)
    payload = found.pop("payload")
    text = payload if isinstance(payload, str) else json.dumps(payload, indent=2, ensure_ascii=False)
    raw = text.encode()
    found["payload_text"] = raw[:PAYLOAD_SHOWN_BYTES].decode(errors="ignore")
    found["payload_cut"] = max(0, len(raw) - PAYLOAD_SHOWN_BYTES)
    found["shard"] = shard
    found["history"] = list(reversed(found.get("history") or []))
    return found


def _periodic(session: Session, config: Config) -> list[dict[str, Any]]:
    from croniter import croniter  # only this page needs it (~20 ms)

    now = admin_queries.server_now(session).replace(tzinfo=dt.timezone.utc)
    last = {(q, n): t for q, n, t in admin_queries.periodic_rows(session)}
    entries = {(q, e["name"]): e["cron"] for q, es in config.periodic.items() for e in es}
    out, leaders = [], {}
    for queue, name in sorted({*last, *entries}):
        if queue not in leaders:
            lock = QueueLocks(session.dsn.database, queue).periodic
            leaders[queue] = admin_queries.web_lock_holder(session, lock)
        cron = entries.get((queue, name))
        holder, host = leaders[queue]
        tick = last.get((queue, name))
        off = tick == admin_queries.PERIODIC_OFF
        out.append({"queue": queue, "name": name, "cron": cron, "last_tick": None if off else tick, "disabled": off,
                    "next_run": croniter(cron, now).get_next(dt.datetime) if cron and not off else None,
                    "leader": None if holder is None else f"session {holder}" + (f" from {host}" if host else "")})
    return out


def periodic(reader: Reader) -> dict[str, Any]:
    answers, down = reader.each(lambda session: _periodic(session, reader.config))
    return {"entries": [{**e, "shard": shard} for shard, found in sorted(answers.items()) for e in found],
            "down": down}


# ------------------------------------------------------------------ actions

def parse_job_id(text: str) -> int:
    """A job id from a request (form, query string, path): ASCII digits only (int() would take
    any script's digits, '٣' as 3), 1 to 2**63 - 1; else InputError."""
    # At most 19 digits before int(): 5,000 digits would be a ValueError (a 500), not this one line
    if not (text.isascii() and text.isdigit() and len(text) <= 19) or not 0 < int(text) < 2**63:
        raise errors.InputError(f"job {text[:40]!r}{'…' if len(text) > 40 else ''}: expected a job id")
    return int(text)


def act(reader: Reader, verb: str, *, shard: str, job_id: int | None, queue: str | None,
        by: str | None = None) -> str:
    """One operator action; returns what happened in a few words (InputError: why not)."""
    if verb in ("pause", "resume"):
        if queue is None:
            raise errors.InputError(f"{verb}: which queue?")
        validate_queue_name(queue)
        _answers, down = reader.each(lambda session: admin.set_paused(session, queue, verb == "pause"),
                                     reader.shards_of(queue))
        if down:
            raise errors.DatabaseError("not every shard of the queue answered: " + "; ".join(
                f"{s or 'server'}: {e}" for s, e in sorted(down.items())))
        return f"queue {queue} {'paused' if verb == 'pause' else 'resumed'}"
    if verb == "retry-dead":
        if queue is None:
            raise errors.InputError("retry-dead: which queue?")
        validate_queue_name(queue)
        retried, skipped = reader.one(shard, lambda session: admin.retry_dead(session, queue))
        return f"retried {retried} dead jobs of {queue}" + (f", skipped {skipped} (dedup key taken)" if skipped else "")
    if job_id is None:
        raise errors.InputError(f"{verb}: which job?")
    if verb == "retry":
        return f"job {job_id}: " + reader.one(shard, lambda session: admin.retry(session, job_id))
    if verb == "cancel":
        outcome = reader.one(shard, lambda session: admin.cancel(session, job_id, by=by))
        return f"job {job_id}: " + {"deleted": "deleted", "cancelled": "cancelled (kept: a retry brings it back)"}.get(
            outcome, "cancel requested")
    if verb == "purge":
        return reader.one(shard, lambda session: _purge_one(session, job_id))
    raise errors.InputError(f"no action {verb!r}")


def _purge_one(session: Session, job_id: int) -> str:
    status = admin.get_job(session, job_id, parents=False)["status"]  # (its parents: not needed, up to 100,000)
    if status not in FINISHED:
        raise errors.InputError(f"job {job_id} is {status}: only dead, done and cancelled jobs are purged")
    deleted = admin_queries.purge_jobs(session, [job_id], admin.parse_status(status))
    return f"job {job_id}: " + ("purged" if deleted else "changed meanwhile, not purged")
