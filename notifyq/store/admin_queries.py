"""Statements for operators and bookkeeping: `notifyq status`, metrics, `notifyq jobs`, periodic
ticks — off the hot path. queries.py keeps enqueue, claim, outcomes, wake-up and the reaper; with
it (and schema.py) this is the only user of sql.QUERIES.

Functions that take a cursor run inside a transaction someone else owns (the scheduler's, for
periodic ticks). Functions that take a Session own their transaction and retry it whole.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

from notifyq.store import dedup, flow, liveness, queries, workflows
from notifyq.store.db import Session
from notifyq.store.driver import Ids
from notifyq.store.sql import QUERIES as Q


def _rows(session: Session, name: str, params: dict[str, Any], what: str) -> list[tuple]:
    """Every row of one named read, in its own transaction."""
    return _rows_of(session, Q[name], params, what)


def _rows_of(session: Session, text: str, params: dict[str, Any], what: str) -> list[tuple]:
    def body(cur):
        cur.execute(text, params)
        return list(cur.fetchall())

    return session.run(body, what=what)


# ---------------------------------------------------------------- status

def queue_counts(session: Session) -> list[tuple]:
    return _rows(session, "queue_counts", {}, "status")


def queue_rows(session: Session) -> list[tuple]:
    return _rows(session, "queue_rows", {}, "status")


def consumers(session: Session) -> list[tuple]:
    return _rows(session, "consumers", {"stale_us": queries.microseconds(liveness.POLLING_STALE_S)},
                 "status")


def flow_key_counts(session: Session, queue: str, limit: int) -> list[tuple]:
    """(key or None, running, ready) of the queue's keys with the most ready jobs."""
    return _rows(session, "flow_key_counts", {"queue": queue, "limit": limit}, "flow key counts")


def flow_running_total(session: Session, queue: str) -> int:
    """The queue's running (claimed) jobs, every key's and those without one."""
    return int(queries.one_value(session, "flow_running_total", {"queue": queue}, "flow running total"))


def server_now(session: Session) -> dt.datetime:
    return queries.one_value(session, "server_now", {}, "server time")


# ---------------------------------------------------------------- admin: `notifyq jobs`

def get_job(session: Session, job_id: int) -> tuple | None:
    def body(cur):
        cur.execute(Q["job_get"], {"id": job_id})
        return cur.fetchone()

    return session.run(body, what="read job")


def job_result(session: Session, job_id: int) -> tuple:
    """(status or None, last_error, latest record's outcome or None, its result text or None)."""
    return _rows(session, "job_result", {"id": job_id}, "read result")[0]


def jobs_status(session: Session, job_ids: list[int]) -> dict[int, int]:
    """{id: status} of the jobs of job_ids that are still there."""
    rows = _rows(session, "jobs_status", {"ids": Ids(job_ids)}, "read job states")
    return {int(job_id): int(status) for job_id, status in rows}


def job_attempts(session: Session, job_id: int) -> list[tuple]:
    return _rows(session, "job_attempts", {"id": job_id}, "read attempts")


def list_jobs(session: Session, *, queue: str | None, status: int | None, age_s: float,
              after: int, limit: int, key: str | None = None) -> list[tuple]:
    return _rows(session, "job_list", {"queue": queue, "status": status, "after": after, "limit": limit,
                                       "age_us": queries.microseconds(age_s), "job_key": key}, "list jobs")


def job_ids(session: Session, *, status: int, queue: str | None, age_s: float, after: int,
            limit: int) -> list[tuple[int, str]]:
    def body(cur):
        cur.execute(Q["job_ids"], {"status": status, "queue": queue, "age_us": queries.microseconds(age_s),
                                   "after": after, "limit": limit})
        return [(int(r[0]), r[1]) for r in cur.fetchall()]

    return session.run(body, what="find jobs")


def retry_jobs(session: Session, jobs: list[tuple[int, str]]) -> int:
    """jobs: (id, queue). Back to ready, attempts reset (a workflow's job: waiting again for
    its parents still pending, job_retry); wakes each queue's watcher."""
    if not jobs:
        return 0

    def body(cur) -> int:
        ids = [j[0] for j in jobs]
        cur.execute(Q["keyed_jobs"], {"ids": ids})
        keyed = cur.fetchall()
        alone = {job_id for job_id, _, _ in keyed}
        plain = [job_id for job_id in ids if job_id not in alone]
        retried = list(plain)  # those that were not retriable have no failed edges to revive
        n = 0
        if plain:
            cur.execute(Q["job_retry"], {"ids": plain})
            n += cur.rowcount
        for job_id, queue, key in keyed:  # each under its key's lock, if no other job holds it
            if dedup.holder(cur, queue, key) not in (None, job_id):
                continue
            cur.execute(Q["job_retry"], {"ids": [job_id]})
            if cur.rowcount:
                dedup.take(cur, queue, key, job_id)
                retried.append(job_id)
                n += 1
        if n:
            for queue in {j[1] for j in jobs}:
                queries.bump_signal(cur, queue, n)
            # What a workflow cancelled for them waits again; not for a job whose key is taken
            # (it stays dead, and so does what it cancelled)
            workflows.revive(cur, retried)
        return n

    return session.run(body, what="retry jobs")


def purge_jobs(session: Session, ids: list[int], status: int) -> int:
    if not ids:
        return 0

    def body(cur) -> int:
        _record_gone(cur, ids, (status,), "purged", f"purged by {who()}")
        if status == 2:  # running jobs, ended without their consumer: their counters unknown
            queries.forget_counters_of_jobs(cur, ids)
        cur.execute(Q["job_purge"], {"ids": ids, "status": status})
        return cur.rowcount

    return session.run(body, what="purge jobs")


def who() -> str:
    """This process's user@host: who an operator's action is recorded as."""
    try:
        import pwd  # here: only an operator's cancel needs it

        user = pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        user = os.environ.get("USER", "?")
    return f"{user}@{queries.HOST}"


def _record_gone(cur, ids: list[int], statuses: tuple[int, ...], outcome: str, why: str) -> None:
    cur.execute(Q["job_record_gone"], {"ids": Ids(ids), "statuses": Ids(statuses), "outcome": outcome,
                                       "host": queries.HOST, "why": why})


def job_progress(session: Session, job_id: int) -> dict[str, int]:
    """A workflow job's parents counted by where they are (workflows.progress)."""
    return session.run(lambda cur: workflows.progress(cur, job_id), what="job progress")


def cancel_job(session: Session, job_id: int, by: str | None = None) -> str | None:
    """'cancelled' (a pending job of a workflow: kept, a retry brings it back), 'deleted' (any
    other pending job), 'requested' (it is running), None (neither: finished or gone).
    by: who asks (kept with the cancel; default: this process's user@host)."""
    by = by or who()

    def body(cur) -> str | None:
        cur.execute(Q["job_cancel_kept"], {"id": job_id, "by": by[:255]})
        if cur.rowcount:
            workflows.settle_failed(cur, [job_id], "cancelled")  # what waits for it, in turn
            return "cancelled"
        _record_gone(cur, [job_id], (0, 1), "cancelled", f"cancelled before it ran by {by}")
        cur.execute(Q["job_cancel_pending"], {"id": job_id})
        if cur.rowcount:
            workflows.settle_failed(cur, [job_id], "cancelled")  # what put after it since, in turn
            return "deleted"
        cur.execute(Q["job_cancel_running"], {"id": job_id, "by": by[:255]})
        return "requested" if cur.rowcount else None

    return session.run(body, what="cancel job")


# ---------------------------------------------------------------- a job on the caller's cursor

def job_with_attempts(cur, job_id: int) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The job's row (job_get's columns by name; None when it is gone) and its attempt records
    (job_attempts', oldest first), read on the caller's cursor: contrib.django's TaskResult,
    which sees a job put in the caller's own transaction before it commits."""
    cur.execute(Q["job_get"], {"id": job_id})
    row = cur.fetchone()
    job = None if row is None else dict(zip([d[0] for d in cur.description], row))
    cur.execute(Q["job_attempts"], {"id": job_id})
    names = [d[0] for d in cur.description]
    return job, [dict(zip(names, r)) for r in cur.fetchall()]


# ---------------------------------------------------------------- periodic (scheduler's cursor)

def periodic_last_tick(cur, queue: str, name: str) -> dt.datetime | None:
    cur.execute(Q["periodic_last_tick"], {"queue": queue, "name": name})
    row = cur.fetchone()
    return row[0] if row else None


def periodic_start(cur, queue: str, name: str, tick: dt.datetime) -> None:
    cur.execute(Q["periodic_start"], {"queue": queue, "name": name, "tick": tick})


def periodic_advance(cur, queue: str, name: str, tick: dt.datetime) -> bool:
    """True when this transaction owns `tick`: it must enqueue the tick's job before COMMIT."""
    cur.execute(Q["periodic_advance"], {"queue": queue, "name": name, "tick": tick})
    return cur.rowcount == 1


# ---------------------------------------------------------------- status and metrics figures

def periodic_rows(session: Session) -> list[tuple]:
    return _rows(session, "periodic_rows", {}, "status")


def claim_ages(session: Session) -> list[tuple]:
    return _rows(session, "claim_ages", {}, "status")


DEPTH_HISTORY_CAP = 10_000  # done and dead jobs are counted up to this many per queue and scrape


def queue_depth(session: Session, queue: str) -> list[tuple]:
    return _rows(session, "queue_depth", {"queue": queue, "cap": DEPTH_HISTORY_CAP}, "queue depth")


def purge_old_attempts(session: Session, queue: str, age_s: float, limit: int) -> int:
    """One chunk of a queue's attempt records older than age_s; returns how many went."""
    age_us = queries.microseconds(age_s)

    def body(cur) -> int:
        cur.execute(Q["attempts_retention_ids"], {"queue": queue, "age_us": age_us, "limit": limit})
        ids = [int(r[0]) for r in cur.fetchall()]
        if not ids:
            return 0
        cur.execute(Q["attempts_purge"], {"ids": Ids(ids), "age_us": age_us})
        purged = cur.rowcount
        cur.execute(Q["steps_purge"], {"ids": Ids(ids)})  # a job's steps go with its last record
        return purged

    return session.run(body, what="attempt retention")


GONE_ATTEMPTS_START = (dt.datetime(1000, 1, 1), 0)  # (ended_at, job_id) before every record


def purge_gone_attempts(session: Session, queue: str, age_s: float, after: tuple[dt.datetime, int],
                        limit: int) -> tuple[tuple[dt.datetime, int], int, bool]:
    """One chunk of a queue's attempt records older than age_s, after `after`: those of jobs
    that are gone are deleted. Returns (where the next chunk starts, how many went, whether
    this was the last chunk)."""
    age_us = queries.microseconds(age_s)

    def body(cur) -> tuple[tuple[dt.datetime, int], int, bool]:
        cur.execute(Q["gone_attempts_ids"], {"queue": queue, "age_us": age_us, "after_at": after[0],
                                             "after_id": after[1], "limit": limit})
        rows = cur.fetchall()
        if not rows:
            return after, 0, True
        gone = sorted({int(job_id) for job_id, _, is_gone in rows if is_gone})
        deleted = 0
        if gone:
            cur.execute(Q["attempts_purge"], {"ids": Ids(gone), "age_us": age_us})
            deleted = cur.rowcount
            cur.execute(Q["steps_purge"], {"ids": Ids(gone)})  # a job's steps go with its last record
        return (rows[-1][1], int(rows[-1][0])), deleted, len(rows) < limit

    return session.run(body, what="attempt retention")


def retention_ids(session: Session, queue: str, status: int, age_s: float, limit: int) -> list[int]:
    """Ids of `queue`'s jobs in `status` (done or dead) that finished more than age_s ago."""
    rows = _rows(session, "retention_ids", {"queue": queue, "status": status, "limit": limit,
                                            "age_us": queries.microseconds(age_s)}, "retention")
    return [int(r[0]) for r in rows]


# ---------------------------------------------------------------- the status page (notifyq web)

# A state's count stops here on the status page ("20,000+"): counting an index range costs in
# proportion to its entries, so the cap bounds a queue's overview however deep it is
# (benchmarks/web_pages.py). Retries are told from other scheduled jobs by reading rows,
# dearer still: a sample of the soonest due.
WEB_COUNT_CAP = 20_000
WEB_RETRY_SAMPLE = 1_000
WEB_RATE_MINUTES = 15


# A page's per-queue reads go to the server as one statement for this many queues at most: the
# named read once per queue (UNION ALL), each copy with its own bound queue, so a page costs a
# round trip per read, not per queue. The overview shows this many queues a page.
WEB_QUEUES_PER_STATEMENT = 100


def _per_queue(name: str, queues: list[str], params: dict[str, Any], wrap: bool = False,
               each: list[dict[str, Any]] | None = None) -> tuple[str, dict]:
    """The named read repeated for each of `queues` (UNION ALL), its %(queue)s bound per copy;
    `each`: per queue, the values of its copy's own further parameters (bound as %(queue)s is);
    `wrap`: each copy in parentheses (a read with its own ORDER BY and LIMIT)."""
    parts, bound = [], dict(params)
    for i, queue in enumerate(queues):
        text = Q[name]
        for key, value in {"queue": queue, **(each[i] if each else {})}.items():
            text = text.replace(f"%({key})s", f"%({key}_{i})s")
            bound[f"{key}_{i}"] = value
        parts.append(f"({text})" if wrap else text)
    return "\nUNION ALL\n".join(parts), bound


# The oldest ready job's time takes a probe per priority in use, each round one statement for
# every queue still open (web_oldest_after): a queue with one priority is done in web_oldest's
# round trip, one with n in n. Past this many rounds the priorities left are read whole
# (web_oldest_rest: index-only, but every ready entry of theirs).
WEB_OLDEST_ROUNDS = 16


def web_oldest(cur, queues: list[str], rounds: int = WEB_OLDEST_ROUNDS) -> dict[str, dict[str, Any]]:
    """{queue: {"ready": at | None, "scheduled": at | None}}: the earliest run_at of each queue's
    ready jobs and of its scheduled ones, on the cursor `cur` (at most
    WEB_QUEUES_PER_STATEMENT queues)."""
    out: dict[str, dict[str, Any]] = {q: {"ready": None, "scheduled": None} for q in queues}
    after: dict[str, int] = {}  # a queue still open: the last priority (prio_key) read
    last: dict[str, int] = {}
    cur.execute(*_per_queue("web_oldest", queues, {}))
    for state, prio_key, at, queue in cur.fetchall():
        if state == "last":
            last[queue] = int(prio_key)
        else:
            out[queue][state] = at
            if state == "ready":
                after[queue] = int(prio_key)
    after = {q: p for q, p in after.items() if p < last.get(q, p)}
    for n in range(rounds + 1):
        if not after:
            break
        name = "web_oldest_after" if n < rounds else "web_oldest_rest"
        cur.execute(*_per_queue(name, list(after), {}, each=[{"after": p} for p in after.values()]))
        found: dict[str, int] = {}
        for _, prio_key, at, queue in cur.fetchall():
            if at is not None and (out[queue]["ready"] is None or at < out[queue]["ready"]):
                out[queue]["ready"] = at
            if prio_key is not None and int(prio_key) < last[queue]:
                found[queue] = int(prio_key)
        after = found
    return out


def web_queue_page(session: Session, after: str, limit: int) -> list[tuple]:
    """(queue, paused) of the first `limit` queues named after `after`."""
    return _rows(session, "web_queue_page", {"after": after, "limit": limit}, "status page")


def web_queue_figures(session: Session, queues: list[str], cap: int = WEB_COUNT_CAP,
                      sample: int = WEB_RETRY_SAMPLE, minutes: int = WEB_RATE_MINUTES) -> dict[str, dict[str, Any]]:
    """Per queue, in one transaction of three statements, and one more for each further
    priority in use (web_oldest), at most WEB_QUEUES_PER_STATEMENT queues: {"depth": {state:
    n}, "oldest": {"ready"|"scheduled": at}, "rate": [(status, minutes_ago, n)]}."""
    if len(queues) > WEB_QUEUES_PER_STATEMENT:
        raise ValueError(f"{len(queues)} queues: a page reads at most {WEB_QUEUES_PER_STATEMENT}")
    out: dict[str, dict[str, Any]] = {q: {"depth": {}, "oldest": {}, "rate": []} for q in queues}
    if not queues:
        return out

    def body(cur) -> None:
        cur.execute(*_per_queue("web_depth", queues, {"cap": cap, "sample": sample}))
        for state, n, queue in cur.fetchall():
            out[queue]["depth"][state] = int(n)
        for queue, oldest in web_oldest(cur, queues).items():
            out[queue]["oldest"] = oldest
        cur.execute(*_per_queue("web_rate", queues, {"cap": cap, "minutes": minutes, "buckets": minutes + 1}))
        for status, ago, n, queue in cur.fetchall():
            out[queue]["rate"].append((int(status), int(ago), int(n)))

    session.run(body, what="status page")
    return out


def web_jobs(session: Session, *, status: int, queues: list[str], limit: int, newest: bool) -> list[tuple]:
    """The first `limit` jobs in one state of `queues`, merged in ix_state's order (the newest
    first for finished ones): one statement per WEB_QUEUES_PER_STATEMENT queues."""
    name = "web_jobs_newest" if newest else "web_jobs"
    order = "prio_key DESC, sort_at DESC, id DESC" if newest else "prio_key, sort_at, id"
    found: list[tuple] = []
    for first in range(0, len(queues), WEB_QUEUES_PER_STATEMENT):
        chunk = queues[first:first + WEB_QUEUES_PER_STATEMENT]
        text, params = _per_queue(name, chunk, {"status": status, "limit": limit}, wrap=True)
        rows = _rows_of(session, f"{text}\nORDER BY {order} LIMIT %(limit)s", params, "list jobs")
        found = sorted(found + rows, key=lambda r: (r[-2], r[-1] or dt.datetime.min, r[0]), reverse=newest)[:limit]
    return found


def web_dedup_job(session: Session, queue: str, key: str) -> int | None:
    rows = _rows(session, "web_dedup_job", {"queue": queue, "key": key}, "find dedup key")
    return int(rows[0][0]) if rows else None


def web_claims_by_owner(session: Session) -> dict[str, int]:
    return {owner: int(n) for owner, n in _rows(session, "web_claims_by_owner", {}, "claims")}


def web_lock_holder(session: Session, lock: str) -> tuple[int | None, str | None]:
    """(connection id, client host) of the session holding `lock`, or (None, None)."""
    rows = _rows(session, "web_lock_holder", {"lock": lock}, "lock holder")
    return (rows[0][0], rows[0][1]) if rows else (None, None)


# ---------------------------------------------------------------- the operations console (notifyq web)

WEB_RUNNING_MAX = 500  # claimed jobs the "running now" page shows at most
WEB_HISTORY_CAP = 20_000  # attempt records a history page reads at most (the newest of its window)
WEB_SEARCH_SCAN = 10_000  # index entries and rows a payload search reads at most
# A periodic entry switched off: a last tick no cron reaches, so the scheduler's guard
# (periodic_advance: last_tick < T) refuses every tick (web_periodic_disable).
PERIODIC_OFF = dt.datetime(9999, 12, 31)


def web_running(session: Session, limit: int = WEB_RUNNING_MAX) -> list[tuple]:
    """(id, queue, owner, claimed_at, lease_until, attempts, max_attempts, cancel_requested,
    task) of the claimed jobs, by lease end, at most `limit`."""
    return _rows(session, "web_running", {"limit": limit}, "running jobs")


def web_history(session: Session, queue: str, minutes: int, cap: int = WEB_HISTORY_CAP) -> list[tuple]:
    """(outcome, ended_at, run_us, wait_us, task) of `queue`'s attempts that ended in the last
    `minutes`, newest first, at most `cap`."""
    return _rows(session, "web_history", {"queue": queue, "minutes": minutes, "cap": cap}, "history")


def web_search(session: Session, *, queue: str, status: int, newest: bool, text: str, task: str,
               since: dt.datetime, limit: int, scan: int = WEB_SEARCH_SCAN) -> list[tuple]:
    """The jobs page's rows among the first `scan` of one queue's state (finished after `since`)
    whose payload holds `text` and whose task is `task` ('' for either: any)."""
    name = "web_search_newest" if newest else "web_search"
    return _rows(session, name, {"queue": queue, "status": status, "text": text, "task": task,
                                 "since": since, "limit": limit, "scan": scan}, "search jobs")


def web_periodic_switch(session: Session, queue: str, name: str, on: bool) -> bool:
    """Switch a periodic entry off (its ticks are refused) or on again; whether a row changed."""
    def body(cur) -> bool:
        cur.execute(Q["web_periodic_enable" if on else "web_periodic_disable"],
                    {"queue": queue, "name": name, "off": PERIODIC_OFF})
        return cur.rowcount > 0

    return session.run(body, what="periodic switch")


# ---------------------------------------------------------------- the console: flow control, workflows

WEB_FLOW_RUNNING_CAP = 5_000  # claimed jobs of a queue read for its running counts
WEB_FLOW_READY_CAP = 20_000  # a queue's ready jobs counted at most (as the overview counts them)
WEB_FLOW_KEYS = 20  # keys with ready jobs a page shows (key order; ?after=KEY: the next)
WEB_FLOW_KEY_CAP = 1_000  # a key's ready jobs counted at most
WEB_GRAPH_LIST = 50  # a job's parents and children its page lists at most
WEB_PROGRESS_CAP = 10_000  # a job's edges its progress counts at most
WEB_WORKFLOW_JOBS = 500  # jobs the workflow page walks to at most
WEB_WORKFLOW_EDGES = 5_000  # edges the workflow page's walk reads at most


def web_flow_counts(session: Session, queue: str) -> tuple[dict[str | None, int], int]:
    """({key or None: running jobs} among the queue's first WEB_FLOW_RUNNING_CAP claimed jobs,
    its ready jobs counted up to WEB_FLOW_READY_CAP), in one transaction."""
    def body(cur) -> tuple[dict[str | None, int], int]:
        cur.execute(Q["web_flow_running"], {"queue": queue, "cap": WEB_FLOW_RUNNING_CAP})
        running = {key: int(n) for key, n in cur.fetchall()}
        cur.execute(Q["web_flow_ready"], {"queue": queue, "cap": WEB_FLOW_READY_CAP})
        return running, int(cur.fetchone()[0])

    return session.run(body, what="flow page")


WEB_CONSUMERS_CAP = 1_000  # live consumers' rows the flow pages read per server at most


def web_consumer_flows(session: Session, limit: int) -> list[tuple]:
    """(id, host, pid, queues, flow JSON or None) of the first `limit` live consumers (the
    oldest first), in one statement."""
    return _rows(session, "web_consumer_flows", {"stale_us": queries.microseconds(liveness.POLLING_STALE_S),
                                                 "limit": limit}, "consumers' flow settings")


def web_flow_keys(session: Session, queue: str, after: str, limit: int) -> list[str]:
    """The queue's first `limit` keys with ready jobs after `after`, in key order: one index
    dive each (flow.ready_keys, the claim's own discovery)."""
    return session.run(lambda cur: flow.ready_keys(cur, queue, after, limit), what="flow keys")


def web_flow_key_ready(session: Session, queue: str, keys: list[str]) -> dict[str, int]:
    """{key: its ready jobs, counted up to WEB_FLOW_KEY_CAP} of `keys` (at most 100), in one
    statement."""
    if not keys:
        return {}
    if len(keys) > WEB_QUEUES_PER_STATEMENT:
        raise ValueError(f"{len(keys)} keys: a page reads at most {WEB_QUEUES_PER_STATEMENT}")
    parts, params = [], {"queue": queue, "cap": WEB_FLOW_KEY_CAP}
    for i, key in enumerate(keys):
        parts.append(Q["web_flow_key_ready"].replace("%(key)s", f"%(key_{i})s"))
        params[f"key_{i}"] = key
    return {key: int(n) for key, n in _rows_of(session, "\nUNION ALL\n".join(parts), params, "flow keys")}


def web_job_graph(session: Session, job_id: int) -> dict[str, list[tuple]]:
    """A job's place in its workflow, in one transaction: "parents" and "children" (id, edge
    state, queue, status: None when its row is gone), at most WEB_GRAPH_LIST each, and
    "progress": (edge state, parent status, count) of its first WEB_PROGRESS_CAP parents."""
    limit, cap = WEB_GRAPH_LIST, WEB_PROGRESS_CAP

    def body(cur) -> dict[str, list[tuple]]:
        out = {}
        for name, sql, params in (("parents", "web_job_parents", {"id": job_id, "limit": limit}),
                                  ("children", "web_job_children", {"id": job_id, "limit": limit}),
                                  ("progress", "web_job_progress", {"id": job_id, "cap": cap})):
            cur.execute(Q[sql], params)
            out[name] = list(cur.fetchall())
        return out

    return session.run(body, what="job graph")


def web_workflow_edges(session: Session, ids: list[int], limit: int) -> list[tuple[int, int, int]]:
    """(parent, child, state) of the edges from and to `ids`, at most `limit` each way."""
    return [(int(p), int(c), int(s)) for p, c, s in _rows(session, "web_workflow_edges",
                                                           {"ids": Ids(ids), "limit": limit}, "workflow")]


def web_workflow_jobs(session: Session, ids: list[int]) -> list[tuple]:
    """(id, queue, status, attempts, max_attempts, last error, waits_on, after_mode) of the jobs
    of `ids` still there."""
    return _rows(session, "web_workflow_jobs", {"ids": Ids(ids)}, "workflow") if ids else []
