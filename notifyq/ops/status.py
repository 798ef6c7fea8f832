"""`notifyq status` of one server: per-queue depth and age, and the live consumers (over
[shards]: sharding/status.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from notifyq.config import QueueConfig
from notifyq.jobs import Status
from notifyq.ops import locks as lock_view
from notifyq.store import admin_queries
from notifyq.store.db import Session
from notifyq.store.flow import FlowLimits

COLUMNS = ("ready", "delayed", "waiting", "claimed", "dead", "done", "cancelled")


def blank() -> dict[str, Any]:
    return {**{c: 0 for c in COLUMNS}, "oldest_ready_age_s": None, "next_due_in_s": None,
            "oldest_claim_age_s": None, "cancel_requested": 0, "paused": False, "consumers": 0}


def _fold(e: dict[str, Any], now: dt.datetime, status: int, future: int, count: int,
          min_run_at: dt.datetime | None) -> None:
    """One (status, future) count row into a queue's figures."""
    if status == Status.READY or (status == Status.SCHEDULED and not future):
        e["ready"] += count
        age = max(0.0, (now - min_run_at).total_seconds()) if min_run_at else None
        if age is not None and (e["oldest_ready_age_s"] is None or age > e["oldest_ready_age_s"]):
            e["oldest_ready_age_s"] = round(age, 3)
    elif status == Status.SCHEDULED:
        e["delayed"] += count
        if min_run_at is not None:
            e["next_due_in_s"] = round(max(0.0, (min_run_at - now).total_seconds()), 3)
    elif status == Status.CLAIMED:
        e["claimed"] += count
    elif status == Status.DEAD:
        e["dead"] += count
    elif status == Status.DONE:
        e["done"] += count
    elif status == Status.CANCELLED:
        e["cancelled"] += count
    elif status == Status.WAITING:  # a workflow's job, waiting for its parents: not ready
        e["waiting"] += count


def depths(session: Session, queues: list[str]) -> dict[str, dict[str, Any]]:
    """The figures of a few queues only (a consumer's metrics endpoint): one indexed read each."""
    now = admin_queries.server_now(session)
    out = {q: blank() for q in queues}
    for name, paused, _watched, _total in admin_queries.queue_rows(session):
        if name in out:
            out[name]["paused"] = bool(paused)
    for q in queues:
        for status, future, count, min_run_at in admin_queries.queue_depth(session, q):
            _fold(out[q], now, status, future, count, min_run_at)
    return out


TOP_KEYS = 10  # keys shown per limited queue, by ready jobs


def flow(session: Session, queue: str, qc: QueueConfig) -> dict[str, Any]:
    """A limited or fair queue's limits, its running jobs, the jobs its limits hold back, and its
    top keys by ready jobs, each with why its jobs wait (docs/flow-control.md)."""
    counts = admin_queries.flow_key_counts(session, queue, TOP_KEYS + 1)
    # Every running job of the queue, not the top keys' only (the queue's `limit` counts them all)
    running = admin_queries.flow_running_total(session, queue)
    queue_held = why_held(qc, None, 0, 1, running)  # the queue at its `limit`, or None
    keys, held = [], 0
    unkeyed = {"running": 0, "ready": 0, "held": 0}
    for key, n_running, n_ready in counts:
        n_running, n_ready = int(n_running), int(n_ready)
        if key is None:
            # Jobs without a key count under the queue's `limit` only: held when it is reached
            unkeyed = {"running": n_running, "ready": n_ready, "held": n_ready if queue_held else 0}
            held += unkeyed["held"]
            continue
        lim = key_limit(qc, key)
        why = why_held(qc, key, n_running, n_ready, running)
        held += n_ready if why else 0
        keys.append({"key": key, "running": n_running, "ready": n_ready, "limit": lim or None,
                     "held": n_ready if why else 0, "why": why})
    return {"limit_per_key": qc.limit_per_key or None, "limit": qc.limit or None, "fair": qc.fair,
            "key_limits": dict(qc.key_limits), "running": running, "held_in_top_keys": held,
            "queue_held": queue_held, "unkeyed": unkeyed, "keys": keys[:TOP_KEYS]}


def why_held(qc: QueueConfig, key: str | None, running: int, ready: int, queue_running: int) -> str | None:
    """Why a key's ready jobs wait, by the queue's limits (None: they do not): the key's
    running jobs at its limit, or the queue's at its own (`notifyq status`, the console)."""
    lim = key_limit(qc, key) if key is not None else 0
    if ready and lim and running >= lim:
        return f"key at its limit ({running} of {lim} running)"
    if ready and qc.limit and queue_running >= qc.limit:
        return f"queue at its limit ({queue_running} of {qc.limit} running)"
    return None


def key_limit(qc: QueueConfig, key: str) -> int:
    return FlowLimits.of(qc).limit_for(key)  # the one place the override rules live


def collect(session: Session, queue: str | None = None, locks: bool = False,
            configs: dict[str, QueueConfig] | None = None) -> dict[str, Any]:
    """locks: also who holds and waits on each queue's advisory locks (ops/locks.py), read from
    performance_schema on demand only. configs: the queues' settings; a limited or fair queue's
    entry gets its `flow` figures."""
    now = admin_queries.server_now(session)
    queues: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        return queues.setdefault(name, blank())

    for name, paused, _watched, _total in admin_queries.queue_rows(session):
        entry(name)["paused"] = bool(paused)
    for name, status, future, count, min_run_at in admin_queries.queue_counts(session):
        _fold(entry(name), now, status, future, count, min_run_at)
    for name, oldest_claim, cancels in admin_queries.claim_ages(session):
        e = entry(name)
        if oldest_claim is not None:
            e["oldest_claim_age_s"] = round(max(0.0, (now - oldest_claim).total_seconds()), 3)
        e["cancel_requested"] = int(cancels or 0)
    periodic = [{"queue": q, "name": n, "last_tick": _iso(t)}
                for q, n, t in admin_queries.periodic_rows(session) if queue is None or q == queue]
    consumers = []
    for cid, host, pid, qs, started, last_seen, wakeup, alive in admin_queries.consumers(session):
        consumers.append({"id": cid, "host": host, "pid": pid, "queues": qs.split(","),
                          "started_at": _iso(started), "last_seen": _iso(last_seen),
                          "wakeup": wakeup, "alive": bool(alive)})
        for q in qs.split(","):
            if q in queues and alive:
                queues[q]["consumers"] += 1
    if queue is not None:
        queues = {queue: queues.get(queue) or entry(queue)}
        consumers = [c for c in consumers if queue in c["queues"]]
    for name, qc in (configs or {}).items():
        if name in queues and qc.flow_controlled:
            queues[name]["flow"] = flow(session, name, qc)
    degraded = sorted({q for c in consumers if c["wakeup"] != "locks" for q in c["queues"]})
    data = {"server_time": _iso(now), "queues": queues, "consumers": consumers,
            "wakeup_degraded": degraded, "periodic": periodic}
    if locks:
        data["locks"] = lock_view.read(session, sorted(queues), consumers)
    return data


def flow_lines(queues: dict[str, dict[str, Any]]) -> list[str]:
    """The flow-control section: each limited or fair queue's limits and its top keys."""
    out: list[str] = []
    for name, q in sorted(queues.items()):
        f = q.get("flow")
        if not f:
            continue
        if not out:
            out += ["", "flow control (top keys by ready jobs):"]
        limits = "  ".join(f"{k}={f[k]}" for k in ("limit_per_key", "limit") if f[k]) or "no limit"
        queue_why = f"  held: {f['queue_held']}" if f.get("queue_held") else ""
        out.append(f"  {name}  {limits}{'  fair' if f['fair'] else ''}  running={f['running']}  "
                   f"held={f['held_in_top_keys']}{queue_why}")
        unkeyed = f.get("unkeyed") or {}
        if unkeyed.get("running") or unkeyed.get("ready"):
            why = f"  held: {f['queue_held']}" if unkeyed["held"] else ""
            out.append(f"    (no key)  running={unkeyed['running']}  ready={unkeyed['ready']}{why}")
        for k in f["keys"]:
            lim = f"/{k['limit']}" if k["limit"] else ""
            why = f"  held: {k['why']}" if k["why"] else ""
            out.append(f"    {k['key']}  running={k['running']}{lim}  ready={k['ready']}{why}")
    return out


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.replace(tzinfo=dt.timezone.utc).isoformat()


def human_duration(seconds: float | None) -> str:
    """The table's ages: 0.4s, 42s, 3m20s, 2h05m, 3d04h (the exact seconds are in --json)."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if whole >= size:
            return f"{whole // size}{unit}{(whole % size) // sub_size:02d}{sub}"
    return f"{whole}s"


def row(name: str, q: dict[str, Any], degraded: list[str], *where: str) -> tuple[str, ...]:
    """A queue's row of the table; `where`: the cells of a column added after its name."""
    return (name, *where, *(str(q[c]) for c in COLUMNS),
            *(human_duration(q[k]) for k in ("oldest_ready_age_s", "next_due_in_s", "oldest_claim_age_s")),
            str(q["consumers"]), "paused" if q["paused"] else ("polling" if name in degraded else "ok"))


def render(data: dict[str, Any], column: str | None = None, rows: list[tuple[str, ...]] | None = None,
           more: list[str] | None = None) -> str:
    """The table, a row per queue, then the consumers and periodic entries. A composer of several
    servers (sharding/status.py) adds a `column` after the queue's name: its `rows` carry it, and
    each consumer and periodic entry its value under that key; `more`: lines after the entries."""
    head = ("queue", *((column,) if column else ()), *COLUMNS, "oldest_ready", "next_due", "oldest_claim",
            "consumers", "state")
    if rows is None:
        rows = [row(name, q, data["wakeup_degraded"]) for name, q in sorted(data["queues"].items())]
    rows = [head, *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    if data["consumers"]:
        lines += ["", "consumers:"]
        for c in data["consumers"]:
            where = f"{column}={c[column]}  " if column else ""
            lines.append(f"  {c['id'][:12]}  {c['host']}:{c['pid']}  {where}queues={','.join(c['queues'])}  "
                         f"wakeup={c['wakeup']}  {'alive' if c['alive'] else 'DEAD (reaper pending)'}")
    if data.get("periodic"):
        lines += ["", "periodic (last tick, UTC):"]
        lines += [f"  {p['queue']}/{p['name']}  {p['last_tick']}" + (f"  {column}={p[column]}" if column else "")
                  for p in data["periodic"]]
    lines += flow_lines(data["queues"])
    if "locks" in data and "by_shard" not in data["locks"]:  # (over [shards]: in `more`)
        lines += lock_view.render(data["locks"])
    lines += more or []
    cancels = {n: q["cancel_requested"] for n, q in data["queues"].items() if q["cancel_requested"]}
    if cancels:
        lines.append("cancel requested, handler still running: "
                     + ", ".join(f"{n}={c}" for n, c in sorted(cancels.items())))
    if data["wakeup_degraded"]:
        lines.append(f"warning: advisory-lock wake-up unavailable, polling: {', '.join(data['wakeup_degraded'])}")
    return "\n".join(lines)
