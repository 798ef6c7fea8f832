"""`notifyq status` over [shards]: every shard's one-server status (ops/status.py) in one, and its
table with a shard column and a `shards:` section saying which answered."""

from __future__ import annotations

from typing import Any

from notifyq.ops import locks as lock_view
from notifyq.config import QueueConfig
from notifyq.ops import status
from notifyq.sharding.servers import Servers


def collect(servers: Servers, queue: str | None = None,
            locks: bool = False, configs: dict[str, QueueConfig] | None = None
            ) -> tuple[dict[str, Any], dict[str, str]]:
    """The status of every server, and the shards that are down (one server: its errors raised);
    locks: each server's advisory locks too (ops/locks.py); configs: the queues' settings (their
    flow limits)."""
    answers, down = servers.each(lambda session: status.collect(session, queue, locks, configs))
    return (merge(answers, down) if servers.sharded else answers[""]), down


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
            total = out["queues"].setdefault(name, {**status.blank(), "by_shard": {}})
            total["by_shard"][shard] = figures
            for key in (*status.COLUMNS, "cancel_requested", "consumers"):
                total[key] += figures[key]
            total["paused"] = total["paused"] or figures["paused"]
            if "flow" in figures:  # a key lives on one shard: its keys are that shard's
                total.setdefault("flow", {**figures["flow"], "keys": [], "running": 0, "held_in_top_keys": 0,
                                          "queue_held": None, "unkeyed": {"running": 0, "ready": 0, "held": 0}})
                for k in ("running", "held_in_top_keys"):
                    total["flow"][k] += figures["flow"][k]
                for k in ("running", "ready", "held"):
                    total["flow"]["unkeyed"][k] += figures["flow"]["unkeyed"][k]
                # A queue's `limit` holds per shard: the first shard at its limit is named
                total["flow"]["queue_held"] = total["flow"]["queue_held"] or figures["flow"]["queue_held"]
                total["flow"]["keys"] = sorted(total["flow"]["keys"] + figures["flow"]["keys"],
                                               key=lambda k: -k["ready"])[:status.TOP_KEYS]
            for key, pick in (("oldest_ready_age_s", max), ("next_due_in_s", min), ("oldest_claim_age_s", max)):
                both = [v for v in (total[key], figures[key]) if v is not None]
                total[key] = pick(both) if both else None
        out["consumers"] += [{**c, "shard": shard} for c in data["consumers"]]
        out["periodic"] += [{**p, "shard": shard} for p in data["periodic"]]
        out["wakeup_degraded"] = sorted({*out["wakeup_degraded"], *data["wakeup_degraded"]})
        if "locks" in data:  # a lock lives on one server: each shard's own
            out.setdefault("locks", {"by_shard": {}})["by_shard"][shard] = data["locks"]
    return out


def render(data: dict[str, Any]) -> str:
    """The table of merge(): a row per queue and shard, and a queue's total over its shards as
    shard `all` when it has jobs on more than one; then which shards answered. (One server's
    status: ops/status.py's table.)"""
    if "shards" not in data:
        return status.render(data)
    rows = []
    for name, q in sorted(data["queues"].items()):
        rows += [status.row(name, figures, data["wakeup_degraded"], shard) for shard, figures in sorted(q["by_shard"].items())]
        if len(q["by_shard"]) > 1:
            rows.append(status.row(name, q, data["wakeup_degraded"], "all"))
    shards = [f"  {name}  " + ("up" if s["up"] else f"DOWN: {s['error']}") for name, s in data["shards"].items()]
    more = ["", "shards:", *shards]
    for shard, locks in sorted(data.get("locks", {}).get("by_shard", {}).items()):
        more += [line.replace("locks", f"shard {shard} locks", 1) for line in lock_view.render(locks)]
    return status.render(data, column="shard", rows=rows, more=more)
