"""What the live consumers apply: the flow settings each one records with its registration
(nq_consumer.flow, presence.flow_record), per queue, grouped by setting and set against this
process's config, for the flow pages (flow.py).

The rows are read once per page and server (admin_queries.web_consumer_flows: nq_consumer is
small, a row per live process), at most WEB_CONSUMERS_CAP of them (the page says when it reached
it). A consumer that records nothing (a row of an older version, or settings this version cannot
read) is unknown: the page counts it and never guesses. A recorded queue name that is not a
valid one is not read: one damaged row never fails a page. Grouped in one pass (by the settings
compared), and at most GROUPS_SHOWN groups shown, the others counted: bounded whatever the
number of consumers or of their distinct settings.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from notifyq import errors
from notifyq.config import QueueConfig, validate_queue_name
from notifyq.config.settings import flow_settings_value
from notifyq.store import admin_queries

NAMES_SHOWN = 10  # consumers named per group of settings (the others counted)
GROUPS_SHOWN = 10  # groups of settings shown per queue (the others counted)


@dataclasses.dataclass(frozen=True)
class Consumer:
    name: str  # host:pid, as `notifyq status` names it
    queues: tuple[str, ...]
    flow: dict[str, dict[str, Any]] | None  # queue -> its settings as recorded; None: not recorded


def read(reader: Any, shards: Any = None) -> tuple[dict[str, list[Consumer]], dict[str, str], list[str]]:
    """The live consumers of each server (every one: None), up to WEB_CONSUMERS_CAP each, the
    servers that did not answer, and those whose live consumers were more than the cap."""
    cap = admin_queries.WEB_CONSUMERS_CAP
    answers, down = reader.each(lambda session: admin_queries.web_consumer_flows(session, cap + 1), shards)
    capped = sorted(shard for shard, rows in answers.items() if len(rows) > cap)
    return {shard: [_consumer(row) for row in rows[:cap]] for shard, rows in answers.items()}, down, capped


def _consumer(row: tuple) -> Consumer:
    _id, host, pid, queues, flow = row
    return Consumer(f"{host}:{pid}", tuple(q for q in (queues or "").split(",") if q), _decode(flow))


def _decode(text: str | None) -> dict[str, dict[str, Any]] | None:
    if text is None:
        return None
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    return {queue: settings for queue, value in raw.items()
            if _valid_name(queue) and (settings := flow_settings_value(value)) is not None}


def _valid_name(queue: str) -> bool:
    try:
        validate_queue_name(queue)
    except errors.NotifyqError:
        return False
    return True


def controlled(consumers: list[Consumer]) -> set[str]:
    """The queues some live consumer limits, makes fair or rates."""
    found = set()
    for c in consumers:
        for queue, settings in (c.flow or {}).items():
            qc = QueueConfig().with_flow(settings)
            if qc.flow_controlled or qc.rate or qc.rate_per_key:
                found.add(queue)
    return found


def shown(qc: QueueConfig) -> dict[str, Any]:
    """A queue's flow settings as the pages show them (None: not set)."""
    return {"limit": qc.limit or None, "limit_per_key": qc.limit_per_key or None, "key_limits": dict(qc.key_limits),
            "rate": qc.rate or None, "rate_per_key": qc.rate_per_key or None, "fair": qc.fair}


# Each column of the pages' settings, by what it compares on (a rate as parsed: "60/1m" is "60/60s")
_COMPARED = {"limit": lambda qc: qc.limit, "limit_per_key": lambda qc: (qc.limit_per_key, qc.key_limits),
             "rate": lambda qc: qc.rates[0], "rate_per_key": lambda qc: qc.rates[1], "fair": lambda qc: qc.fair}


def of_queue(consumers: list[Consumer], queue: str, qc: QueueConfig) -> dict[str, Any]:
    """What the live consumers of `queue` apply, against `qc` (this process's): "groups" of
    consumers that apply the same settings (each with its settings, its consumers, whether they
    are this config's, "as_config", and the columns where not, "differs_in"), the "unknown"
    ones, "disagree" (two groups or more) and "differs" (a group's are not this config's)."""
    groups: dict[tuple, dict[str, Any]] = {}  # by the settings compared: one pass
    unknown: list[str] = []
    live = 0
    for c in consumers:
        if queue not in c.queues:
            continue
        live += 1
        settings = (c.flow or {}).get(queue)
        if settings is None:
            unknown.append(c.name)
            continue
        theirs = qc.with_flow(settings)
        group = groups.get(compared := theirs.flow_compared())
        if group is None:
            differs_in = [column for column, of in _COMPARED.items() if of(theirs) != of(qc)]
            group = groups[compared] = {"settings": shown(theirs), "names": [], "as_config": not differs_in,
                                        "differs_in": differs_in}
        group["names"].append(c.name)
    ordered = sorted(groups.values(), key=lambda g: (not g["as_config"], -len(g["names"])))  # ours, the most
    shown_groups, rest = ordered[:GROUPS_SHOWN], ordered[GROUPS_SHOWN:]
    for g in shown_groups:
        g["count"], g["names"] = len(g["names"]), g["names"][:NAMES_SHOWN]
    return {"live": live, "groups": shown_groups, "more_groups": len(rest),
            "more_consumers": sum(len(g["names"]) for g in rest),
            "unknown": len(unknown), "unknown_names": unknown[:NAMES_SHOWN],
            "disagree": len(groups) > 1, "differs": any(not g["as_config"] for g in ordered)}
