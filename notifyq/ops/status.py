"""`notifyq status`: per-queue depth and age, and the live consumers."""

from __future__ import annotations

import datetime as dt
from typing import Any

from notifyq.jobs import Status
from notifyq.store import admin_queries
from notifyq.store.db import Session

COLUMNS = ("ready", "delayed", "claimed", "dead", "done", "cancelled")


def _blank() -> dict[str, Any]:
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


def depths(session: Session, queues: list[str]) -> dict[str, dict[str, Any]]:
    """The figures of a few queues only (a consumer's metrics endpoint): one indexed read each."""
    now = admin_queries.server_now(session)
    out = {q: _blank() for q in queues}
    for name, paused, _watched, _total in admin_queries.queue_rows(session):
        if name in out:
            out[name]["paused"] = bool(paused)
    for q in queues:
        for status, future, count, min_run_at in admin_queries.queue_depth(session, q):
            _fold(out[q], now, status, future, count, min_run_at)
    return out


def collect(session: Session, queue: str | None = None) -> dict[str, Any]:
    now = admin_queries.server_now(session)
    queues: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        return queues.setdefault(name, _blank())

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
    degraded = sorted({q for c in consumers if c["wakeup"] != "locks" for q in c["queues"]})
    return {"server_time": _iso(now), "queues": queues, "consumers": consumers,
            "wakeup_degraded": degraded, "periodic": periodic}


def merge(per_shard: dict[str, dict[str, Any]], down: dict[str, str]) -> dict[str, Any]:
    """Every shard's collect() in one: a queue's counts summed over its shards (ages: the oldest,
    next due: the soonest), each shard's own figures under by_shard, consumers and periodic
    rows tagged with their shard, and every shard up or down (with its error line)."""
    out: dict[str, Any] = {"server_time": None, "queues": {}, "consumers": [], "wakeup_degraded": [],
                           "periodic": [], "shards": {}}
    for shard in sorted([*per_shard, *down]):
        out["shards"][shard] = {"up": True} if shard in per_shard else {"up": False, "error": down[shard]}
    for shard, data in sorted(per_shard.items()):
        out["server_time"] = out["server_time"] or data["server_time"]
        for name, figures in data["queues"].items():
            total = out["queues"].setdefault(name, {**_blank(), "by_shard": {}})
            total["by_shard"][shard] = figures
            for key in (*COLUMNS, "cancel_requested", "consumers"):
                total[key] += figures[key]
            total["paused"] = total["paused"] or figures["paused"]
            for key, pick in (("oldest_ready_age_s", max), ("next_due_in_s", min), ("oldest_claim_age_s", max)):
                both = [v for v in (total[key], figures[key]) if v is not None]
                total[key] = pick(both) if both else None
        out["consumers"] += [{**c, "shard": shard} for c in data["consumers"]]
        out["periodic"] += [{**p, "shard": shard} for p in data["periodic"]]
        out["wakeup_degraded"] = sorted({*out["wakeup_degraded"], *data["wakeup_degraded"]})
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


def _row(name: str, q: dict[str, Any], degraded: list[str], shard: str | None) -> tuple[str, ...]:
    return (name, *(() if shard is None else (shard,)), *(str(q[c]) for c in COLUMNS),
            *(human_duration(q[k]) for k in ("oldest_ready_age_s", "next_due_in_s", "oldest_claim_age_s")),
            str(q["consumers"]), "paused" if q["paused"] else ("polling" if name in degraded else "ok"))


def render(data: dict[str, Any]) -> str:
    """The table; with [shards] (merge()) a shard column: a row per queue and shard, and a
    queue's total over its shards as shard `all` when it has jobs on more than one."""
    sharded = "shards" in data
    head = ("queue", *(("shard",) if sharded else ()), *COLUMNS, "oldest_ready", "next_due", "oldest_claim",
            "consumers", "state")
    rows = [head]
    for name, q in sorted(data["queues"].items()):
        if not sharded:
            rows.append(_row(name, q, data["wakeup_degraded"], None))
            continue
        for shard, figures in sorted(q["by_shard"].items()):
            rows.append(_row(name, figures, data["wakeup_degraded"], shard))
        if len(q["by_shard"]) > 1:
            rows.append(_row(name, q, data["wakeup_degraded"], "all"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    if data["consumers"]:
        lines += ["", "consumers:"]
        for c in data["consumers"]:
            where = f"shard={c['shard']}  " if sharded else ""
            lines.append(f"  {c['id'][:12]}  {c['host']}:{c['pid']}  {where}queues={','.join(c['queues'])}  "
                         f"wakeup={c['wakeup']}  {'alive' if c['alive'] else 'DEAD (reaper pending)'}")
    if data.get("periodic"):
        lines += ["", "periodic (last tick, UTC):"]
        lines += [f"  {p['queue']}/{p['name']}  {p['last_tick']}" + (f"  shard={p['shard']}" if sharded else "")
                  for p in data["periodic"]]
    if sharded:
        lines += ["", "shards:"]
        lines += [f"  {name}  " + ("up" if s["up"] else f"DOWN: {s['error']}") for name, s in data["shards"].items()]
    cancels = {n: q["cancel_requested"] for n, q in data["queues"].items() if q["cancel_requested"]}
    if cancels:
        lines.append("cancel requested, handler still running: "
                     + ", ".join(f"{n}={c}" for n, c in sorted(cancels.items())))
    if data["wakeup_degraded"]:
        lines.append(f"warning: advisory-lock wake-up unavailable, polling: {', '.join(data['wakeup_degraded'])}")
    return "\n".join(lines)
