"""`notifyq status`: per-queue depth and age, and the live consumers."""

from __future__ import annotations

import datetime as dt
from typing import Any

from notifyq import store
from notifyq.db import Session
from notifyq.jobs import Status

COLUMNS = ("ready", "delayed", "claimed", "dead", "done")


def collect(session: Session, queue: str | None = None) -> dict[str, Any]:
    now = store.server_now(session)
    queues: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        return queues.setdefault(name, {**{c: 0 for c in COLUMNS}, "oldest_ready_age_s": None,
                                        "paused": False, "consumers": 0})

    for name, paused, _watched, _total in store.queue_rows(session):
        entry(name)["paused"] = bool(paused)
    for name, status, future, count, min_run_at in store.queue_counts(session):
        e = entry(name)
        if status == Status.READY or (status == Status.SCHEDULED and not future):
            e["ready"] += count
            age = max(0.0, (now - min_run_at).total_seconds()) if min_run_at else None
            if age is not None and (e["oldest_ready_age_s"] is None or age > e["oldest_ready_age_s"]):
                e["oldest_ready_age_s"] = round(age, 3)
        elif status == Status.SCHEDULED:
            e["delayed"] += count
        elif status == Status.CLAIMED:
            e["claimed"] += count
        elif status == Status.DEAD:
            e["dead"] += count
        elif status == Status.DONE:
            e["done"] += count
    consumers = []
    for cid, host, pid, qs, started, last_seen, wakeup, alive in store.consumers(session):
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
            "wakeup_degraded": degraded}


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.replace(tzinfo=dt.timezone.utc).isoformat()


def render(data: dict[str, Any]) -> str:
    head = ("queue", *COLUMNS, "oldest_ready", "consumers", "state")
    rows = [head]
    for name, q in sorted(data["queues"].items()):
        age = q["oldest_ready_age_s"]
        rows.append((name, *(str(q[c]) for c in COLUMNS),
                     "-" if age is None else f"{age:.1f}s", str(q["consumers"]),
                     "paused" if q["paused"] else ("polling" if name in data["wakeup_degraded"] else "ok")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    if data["consumers"]:
        lines += ["", "consumers:"]
        for c in data["consumers"]:
            lines.append(f"  {c['id'][:12]}  {c['host']}:{c['pid']}  queues={','.join(c['queues'])}  "
                         f"wakeup={c['wakeup']}  {'alive' if c['alive'] else 'DEAD (reaper pending)'}")
    if data["wakeup_degraded"]:
        lines.append(f"warning: advisory-lock wake-up unavailable, polling: {', '.join(data['wakeup_degraded'])}")
    return "\n".join(lines)
