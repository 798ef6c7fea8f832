"""The operations console's reads and actions, beside data.py's status pages: what runs now,
a queue's history per minute and per task (from the attempt records), the bounded payload
search, bulk actions and the periodic entries' run-now and enable/disable. Each read is a
bounded range of an index (docs/web.md says which, and its bound)."""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

from notifyq import errors
from notifyq.config import Config, periodic_entries, validate_queue_name
from notifyq.ops import admin
from notifyq.store import admin_queries
from notifyq.store.db import Session
from notifyq.store.driver import DriverError, describe
from notifyq.web.data import FINISHED, Reader, act, age_s, consumer_rows, listed, parse_job_id, parse_whole

HISTORY_HOURS_MAX = 6  # a history page's window: 1 to this many hours
OUTCOMES = ("done", "failed", "dead", "cancelled")  # counted per minute; other records are not attempts
SEARCH_SINCE_HOURS = 24  # a search of finished jobs reads those finished in this window by default
MAX_BULK = 100  # job ids one bulk action takes; more is one clear error, nothing done


def running(reader: Reader) -> dict[str, Any]:
    """What runs now, per consumer: each claimed job, its task, since when, its lease."""
    def work(session: Session) -> dict[str, Any]:
        now = admin_queries.server_now(session)
        owners = {c["id"]: c for c in consumer_rows(session)}
        jobs = [{"id": i, "queue": q, "owner": owner, "claimed_at": at, "running_s": age_s(now, at),
                 "lease_until": lease, "lease_left_s": None if lease is None else (lease - now).total_seconds(),
                 "attempts": n, "max_attempts": most, "cancel_requested": bool(cancel), "task": task}
                for i, q, owner, at, lease, n, most, cancel, task in admin_queries.web_running(session)]
        return {"jobs": jobs, "owners": owners}

    answers, down = reader.each(work)
    groups: list[dict[str, Any]] = []
    shown = 0
    for shard, found in sorted(answers.items()):
        by_owner: dict[str, list[dict[str, Any]]] = {}
        for j in found["jobs"]:
            by_owner.setdefault(j["owner"] or "", []).append({**j, "shard": shard})
            shown += 1
        for owner, jobs_ in sorted(by_owner.items()):
            c = found["owners"].get(owner)
            groups.append({"owner": owner, "shard": shard, "consumer": c, "jobs": jobs_})
    return {"groups": groups, "down": down, "shown": shown, "limit": admin_queries.WEB_RUNNING_MAX}


def parse_history(query: dict[str, str]) -> dict[str, Any]:
    """The history page's queue, window (hours) and task, from its query string."""
    queue = query.get("queue", "").strip() or None
    if queue is not None:
        validate_queue_name(queue)
    hours = parse_whole(query, "hours", 1, 1, HISTORY_HOURS_MAX)
    task = query.get("task", "")
    if len(task) > 191:
        raise errors.InputError("a task name has at most 191 characters")
    return {"queue": queue, "hours": hours, "task": task or None}


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p90, p99 and the maximum (nearest rank), None for no value."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    ordered = sorted(values)
    at = lambda p: ordered[min(len(ordered) - 1, max(0, -(-len(ordered) * p // 100) - 1))]  # noqa: E731
    return {"p50": at(50), "p90": at(90), "p99": at(99), "max": ordered[-1]}


def _figures(rows: list[tuple], now: dt.datetime, minutes: int) -> dict[str, Any]:
    per_minute = {o: [0] * minutes for o in OUTCOMES}
    runs, waits = [], []
    for outcome, ended, run_us, wait_us, _task in rows:
        if outcome not in per_minute:
            continue
        ago = int((now - ended).total_seconds() // 60)
        if 0 <= ago < minutes:
            per_minute[outcome][ago] += 1
        if run_us is not None and outcome != "cancelled":
            runs.append(run_us / 1e6)
        if wait_us is not None and wait_us >= 0:
            waits.append(wait_us / 1e6)
    return {"per_minute": per_minute, "totals": {o: sum(n) for o, n in per_minute.items()},
            "run": percentiles(runs), "wait": percentiles(waits), "runs": len(runs), "waits": len(waits)}


def history(reader: Reader, f: dict[str, Any]) -> dict[str, Any]:
    """One queue's attempts over the last hours, per minute by outcome, and the run time and
    queue wait percentiles; per task, or for one task (f["task"]). Every server's records."""
    minutes = f["hours"] * 60
    out: dict[str, Any] = {"filters": f, "minutes": minutes, "cap": admin_queries.WEB_HISTORY_CAP,
                           "outcomes": OUTCOMES, "queues": [], "down": {}}
    names, _down = reader.each(lambda session: [r[0] for r in admin_queries.queue_rows(session)])
    out["queues"] = sorted({q for found in names.values() for q in found})
    if f["queue"] is None:
        return out

    def work(session: Session) -> tuple[dt.datetime, list[tuple]]:
        return admin_queries.server_now(session), admin_queries.web_history(session, f["queue"], minutes)

    answers, out["down"] = reader.each(work, reader.shards_of(f["queue"]))
    rows = [r for _now, found in answers.values() for r in found]
    now = max((n for n, _found in answers.values()), default=dt.datetime.now(dt.timezone.utc).replace(tzinfo=None))
    out["capped"] = any(len(found) >= admin_queries.WEB_HISTORY_CAP for _now, found in answers.values())
    by_task: dict[str, list[tuple]] = {}
    for r in rows:
        by_task.setdefault(r[4] or "", []).append(r)
    if f["task"] is not None:
        rows = by_task.get(f["task"], [])
    out["figures"] = _figures(rows, now, minutes)
    out["tasks"] = [{"task": t, **_figures(rs, now, minutes)} for t, rs in sorted(by_task.items())]
    return out


def parse_search(query: dict[str, str]) -> dict[str, Any]:
    """The jobs page's payload search: text (in the payload), task, and for finished jobs the
    hours back it reads; both empty: no search."""
    text, task = query.get("q", ""), query.get("task", "")
    if len(text) > 200 or len(task) > 191:
        raise errors.InputError("a search holds at most 200 characters, a task name 191")
    hours = parse_whole(query, "since_hours", SEARCH_SINCE_HOURS, 1, 24 * 90)
    return {"text": text, "task": task, "since_hours": hours}


def search(reader: Reader, f: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    """The jobs of one queue and state whose payload holds s["text"] or whose task is
    s["task"], among the first WEB_SEARCH_SCAN of the state's index range (bounded)."""
    if f["queue"] is None:
        raise errors.InputError("a search reads one queue: choose the queue")
    status = admin.parse_status(f["state"])
    newest = f["state"] in FINISHED

    def work(session: Session) -> list[dict[str, Any]]:
        since = (admin_queries.server_now(session) - dt.timedelta(hours=s["since_hours"]) if newest
                 else dt.datetime(1000, 1, 1))
        return [listed(r) for r in admin_queries.web_search(
            session, queue=f["queue"], status=status, newest=newest, text=s["text"], task=s["task"],
            since=since, limit=f["limit"])]

    answers, down = reader.each(work, [f["shard"]] if f["shard"] else reader.shards_of(f["queue"]))
    rows = [{**j, "shard": shard} for shard, found in answers.items() for j in found]
    rows.sort(key=lambda j: (j["finished_at"] or j["created_at"], j["id"]), reverse=newest)
    return {"jobs": rows[:f["limit"]], "down": down, "filters": f, "more": len(rows) > f["limit"],
            "finished": FINISHED, "search": s, "scan": admin_queries.WEB_SEARCH_SCAN}


def parse_ids(values: list[str]) -> list[int]:
    """A bulk action's job ids: 1 to MAX_BULK job ids (ASCII digits), else one InputError;
    sorted, each once (the caller counts the duplicates collapsed)."""
    if not values:
        raise errors.InputError("select at least one job")
    if len(values) > MAX_BULK:
        raise errors.InputError(f"{len(values)} jobs selected: a bulk action takes at most {MAX_BULK}; "
                                "nothing was done")
    try:
        return sorted({parse_job_id(v) for v in values})
    except errors.InputError as e:
        raise errors.InputError(f"{e}; nothing was done") from None


class BulkOutcome(NamedTuple):
    """What a bulk action did (text), and whether it stopped on a database failure midway
    (complete False: the text says how many were done before it)."""
    text: str
    complete: bool


def act_bulk(reader: Reader, verb: str, *, shard: str, ids: list[int], by: str, duplicates: int = 0) -> BulkOutcome:
    """retry / cancel / purge each job of `ids` (checked by parse_ids) on one server, each in
    its own transaction: how many were done, already so (a retry of a job still waiting or
    ready), refused and why, duplicates collapsed. A database failure stops it there: the
    outcome says how many were done before (they stay done) and what failed."""
    done, already, refused = 0, 0, []
    failed = None
    for job_id in ids:
        try:
            if verb == "retry":  # admin.retry's own words tell a retry from a job already pending
                said = reader.one(shard, lambda session, j=job_id: admin.retry(session, j))
                if said.startswith("already"):
                    already += 1
                    continue
            else:
                act(reader, verb, shard=shard, job_id=job_id, queue=None, by=by)
            done += 1
        except errors.InputError as e:
            refused.append(f"{job_id} ({e})")
        except (errors.NotifyqError, DriverError) as e:
            failed = describe(e) if isinstance(e, DriverError) else str(e)
            break
    past = {"retry": "retried", "cancel": "cancelled", "purge": "purged"}[verb]
    parts = [f"{past} {done} of {len(ids)} jobs"]
    if already:
        parts.append(f"{already} already waiting or ready")
    if refused:
        parts.append(f"{len(refused)} refused: " + ", ".join(refused[:10]) + (" …" if len(refused) > 10 else ""))
    if duplicates:
        parts.append(f"{duplicates} duplicate id{'' if duplicates == 1 else 's'} collapsed")
    if failed is not None:
        untried = len(ids) - done - already - len(refused)
        parts.append(f"then failed: {failed}; {untried} not tried")
    return BulkOutcome("; ".join(parts), failed is None)


def _entry(config: Config, queue: str, name: str) -> dict[str, Any]:
    for e in periodic_entries(queue, config.periodic.get(queue, ()), config.producer.max_payload_bytes):
        if e["name"] == name:
            return e
    raise errors.InputError(f"no periodic entry {name!r} on queue {queue!r} in this config")


def periodic_act(reader: Reader, verb: str, *, queue: str, name: str) -> str:
    """run-now (enqueue the entry's job at once, its schedule untouched), enable or disable."""
    validate_queue_name(queue or "")
    entry = _entry(reader.config, queue, name)
    if verb == "periodic-run":
        from notifyq.sharding.producer import Producer  # only this action puts a job

        now = reader.one(reader.shards_of(queue)[0], admin_queries.server_now).replace(tzinfo=dt.timezone.utc)
        payload = {**entry.get("payload", {}), "periodic": name, "tick": now.isoformat()}
        producer = Producer(queue, reader.config)
        try:
            job_id = producer.put(payload, priority=entry.get("priority", 0))
        finally:
            producer.close()
        return f"periodic {queue}/{name}: job {job_id} enqueued now"
    on = verb == "periodic-enable"
    answers, down = reader.each(lambda session: admin_queries.web_periodic_switch(session, queue, name, on),
                                reader.shards_of(queue))
    if down:
        raise errors.DatabaseError("not every shard of the queue answered: " + "; ".join(
            f"{s or 'server'}: {e}" for s, e in sorted(down.items())))
    if on and not any(answers.values()):
        return f"periodic {queue}/{name}: was not disabled"
    return f"periodic {queue}/{name}: {'enabled' if on else 'disabled'}"
