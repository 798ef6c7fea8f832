"""The console's flow-control page (/flow): each limited, fair or rated queue's limits as this
process's config sets them, its running and ready jobs, and for one queue (?queue=NAME) its keys: the
keys running most, and the keys with ready jobs a page at a time (?after=KEY), each with its
running jobs, its ready ones and how many of those its limits or rates hold back, and why.

Every read is bounded whatever the backlog (admin_queries.WEB_FLOW_*): a queue's claimed jobs
up to 5,000, its ready ones counted up to 20,000, its keys found by one index dive each (20 a
page), each key's ready jobs counted up to 1,000; rates read the budgets' logs as a claim does.

Where the limits shown come from: each consumer applies its own config's, and records them
with its registration (nq_consumer.flow). So the page shows this process's config, names the
files it was read from, and next to it what the live consumers record (applied.py): which
apply which settings, which record none (unknown), and marks where they disagree with each
other or with this config. Held jobs, and running counts over a limit, are judged by this
config's limits, as a consumer with the same config would judge them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from notifyq import errors
from notifyq.config import QueueConfig, validate_queue_name, values
from notifyq.ops import status
from notifyq.store import admin_queries, rates
from notifyq.store.db import Session
from notifyq.web import applied

TOP_RUNNING = 20  # keys shown by running jobs, the most first


def source(config: Any) -> dict[str, Any]:
    """Where the limits shown were read from: this process's config files (none: its defaults
    and NOTIFYQ_* variables alone)."""
    return {"files": list(config.sources)}


def controlled(qc: QueueConfig) -> bool:
    """A queue the page shows: limits, fairness or rates."""
    return qc.flow_controlled or bool(qc.rate or qc.rate_per_key)


PAGE_QUEUES = 100  # queues the page lists (by name), as the overview's page


def queues(reader: Any) -> dict[str, Any]:
    """The first PAGE_QUEUES flow-controlled queues of this config or of the live consumers, on
    each server they live on: settings, what the live consumers apply, running jobs (counted up
    to the cap) and ready ones."""
    config = reader.config
    consumers, down, capped = applied.read(reader)  # once per server, for every queue of the page
    recorded = set().union(*(applied.controlled(found) for found in consumers.values()))
    names = sorted({name for name, qc in config.queues.items() if controlled(qc)} | recorded)
    rows = []
    for name in names[:PAGE_QUEUES]:
        qc = config.queue(name)
        answers, missed = reader.each(lambda session, q=name: admin_queries.web_flow_counts(session, q),
                                      reader.shards_of(name))
        down.update(missed)
        for shard, (running, ready) in sorted(answers.items()):
            total = sum(running.values())
            rows.append({"name": name, "shard": shard, **applied.shown(qc),
                         "applied": applied.of_queue(consumers.get(shard, []), name, qc), "running": total,
                         "over_limit": bool(qc.limit) and total > qc.limit,
                         "running_capped": total >= admin_queries.WEB_FLOW_RUNNING_CAP, "ready": ready,
                         "ready_capped": ready >= admin_queries.WEB_FLOW_READY_CAP})
    return {"queues": rows, "down": down, "more": len(names) > PAGE_QUEUES, "source": source(config),
            "consumers_capped": capped, "consumers_cap": admin_queries.WEB_CONSUMERS_CAP}


def parse(query: dict[str, str]) -> tuple[str | None, str]:
    """(queue or None, the key the page starts after)."""
    name = query.get("queue", "").strip() or None
    if name is not None:
        validate_queue_name(name)
    after = query.get("after", "")
    if after:
        values.job_key("after", after)
    return name, after


def queue(reader: Any, name: str, after: str = "") -> dict[str, Any]:
    """One queue's limits, what its live consumers apply (on every server it lives on) and its
    keys, per server."""
    qc = reader.config.queue(name)
    consumers, down, capped = applied.read(reader, reader.shards_of(name))
    live = [c for found in consumers.values() for c in found]
    if not controlled(qc) and name not in applied.controlled(live):
        raise errors.InputError(f"queue {name!r}: no limit, fairness or rate in this config, nor in a live "
                                "consumer's (docs/flow-control.md)")
    answers, missed = reader.each(lambda session: _keys(session, name, qc, after), reader.shards_of(name))
    down.update(missed)
    return {"queue": name, "settings": applied.shown(qc), "applied": applied.of_queue(live, name, qc),
            "after": after, "down": down, "source": source(reader.config),
            "consumers_capped": capped, "consumers_cap": admin_queries.WEB_CONSUMERS_CAP,
            "shards": [{"shard": shard, **found} for shard, found in sorted(answers.items())],
            "caps": {"running": admin_queries.WEB_FLOW_RUNNING_CAP, "ready": admin_queries.WEB_FLOW_READY_CAP,
                     "key": admin_queries.WEB_FLOW_KEY_CAP, "keys": admin_queries.WEB_FLOW_KEYS}}


def _keys(session: Session, name: str, qc: QueueConfig, after: str) -> dict[str, Any]:
    running, ready = admin_queries.web_flow_counts(session, name)
    queue_running = sum(running.values())
    page = admin_queries.web_flow_keys(session, name, after, admin_queries.WEB_FLOW_KEYS + 1)
    page, more = page[:admin_queries.WEB_FLOW_KEYS], len(page) > admin_queries.WEB_FLOW_KEYS
    busiest = sorted((k for k in running if k is not None), key=lambda k: (-running[k], k))[:TOP_RUNNING]
    counted = list(dict.fromkeys(busiest + page))
    ready_of = admin_queries.web_flow_key_ready(session, name, counted)
    limits = rates.Rates.of(qc)
    spent = rates.usage(session, name, limits, counted) if limits is not None else {}
    queue_rate = spent.get(rates.QUEUE_BUDGET)

    def row(key: str) -> dict[str, Any]:
        n_running, n_ready = running.get(key, 0), ready_of.get(key, 0)
        why = status.why_held(qc, key, n_running, n_ready, queue_running) or _rate_held(key, n_ready, spent)
        limit = status.key_limit(qc, key) or None
        return {"key": key, "running": n_running, "limit": limit, "over_limit": bool(limit) and n_running > limit,
                "ready": n_ready,
                "ready_capped": n_ready >= admin_queries.WEB_FLOW_KEY_CAP, "held": n_ready if why else 0,
                "why": why, "rate": spent.get(key)}

    unkeyed_why = status.why_held(qc, None, 0, 1, queue_running) or _rate_held(rates.QUEUE_BUDGET, 1, spent)
    return {"running": queue_running, "running_capped": queue_running >= admin_queries.WEB_FLOW_RUNNING_CAP,
            "over_limit": bool(qc.limit) and queue_running > qc.limit,
            "unkeyed_running": running.get(None, 0), "ready": ready,
            "ready_capped": ready >= admin_queries.WEB_FLOW_READY_CAP, "queue_rate": queue_rate,
            "queue_held": unkeyed_why if ready else None,
            "busiest": [row(k) for k in busiest], "keys": [row(k) for k in page],
            "next_after": page[-1] if more else None}


def _rate_held(key: str, ready: int, spent: dict[str, rates.Usage]) -> str | None:
    """A rate that holds a key's ready jobs: its own budget's, or the queue's."""
    if not ready:
        return None
    for budget, what in ((key, "key's rate"), (rates.QUEUE_BUDGET, "queue's rate")):
        u = spent.get(budget)
        if u is not None and u.frees_at is not None:
            return (f"{what} spent ({u.used} of {u.count} starts in {_period(u.period_s)}; "
                    f"next start {_time(u.frees_at)})")
    return None


def _period(seconds: float) -> str:
    return status.human_duration(seconds).replace(".0s", "s")


def _time(at: dt.datetime) -> str:
    return at.strftime("%H:%M:%S") + " UTC"
