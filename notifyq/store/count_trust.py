"""Whether a worker's claims of a queue limited per key only may trust the queue's counters at
all (nq_flow_key.running, store/flow.py): only while every registered consumer of the queue
keeps them.

A counter holds the jobs of the claims that count (FlowLimits.counts, COUNTED_BIT) and no
others. A consumer whose claims of the queue do not count starts jobs no counter holds: one of
an older version still running through the upgrade to schema 10 (it checked the schema when it
started; its claims lock the key rows and count the claimed rows, and never touch a counter),
or one of this version whose config for the queue does not count (a `limit` or `fair` too, a
per-key rate, no per-key limit). A claim that trusted a counter recounted within the trust
bound would take its key past its limit while such jobs run.

So each consumer records, per queue, whether its claims keep the counters (`counts` in its
nq_consumer row's flow settings, presence.flow_record); an older version records no such member
(or no flow settings at all). A worker reads the registrations of its queue at most every
CHECK_S (consumers_flow) and trusts counters only while every one says `counts`; until its
first read says so, and whenever one does not, its claims trust no counter: each key they take
is recounted under its row's lock and counted again after the mark, as for an unknown counter.
Those claims are exact whatever the other consumers do: every claim of a key, of any version,
holds the key's row until its COMMIT, and the recount reads the claimed rows.

A registration is conservative: a dead consumer not yet reaped still reads as registered, and
one that re-registered after a lost connection records what it did before. Consumers of other
queues are not read. A consumer of an older version cannot register anew after the upgrade (it
refuses a schema it was not written for at start, schema.require_current); one that re-registers
after its row was reaped (a lost connection, a stall) writes its row before its next claim, and
a worker whose read fell between the two trusts the counters until its next read at most.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from notifyq.store.sql import QUERIES as Q

CHECK_S = 2.0  # how often a worker reads its queue's registrations (seconds)
UNTRUSTED_S = -1  # the trust bound a claim passes while it trusts no counter: none is that fresh


def counts_member(counts: bool) -> dict[str, Any]:
    """The member a consumer's recorded flow settings of a queue carry: whether its claims of the
    queue keep the counters."""
    return {"counts": counts}


def keeps_counters(flow: str | None, queue: str) -> bool:
    """Whether a registration's flow settings (nq_consumer.flow) say its claims of `queue` keep
    the counters. NULL, damaged or without the member (an older version): no."""
    if flow is None:
        return False
    try:
        value = json.loads(flow)
    except ValueError:
        return False
    settings = value.get(queue) if isinstance(value, dict) else None
    return isinstance(settings, dict) and settings.get("counts") is True


class CountTrust:
    """One worker's view of whether its queue's consumers all keep the counters (a cache of
    consumers_flow, read at most every CHECK_S)."""

    def __init__(self) -> None:
        self.all_count = False  # until the first read says so: trust no counter
        self.next_check = -math.inf  # monotonic: when the next claim reads the registrations

    def refresh(self, session, queue: str) -> None:
        """Before a claim's transaction: the registrations read again if CHECK_S has passed."""
        now = time.monotonic()
        if now < self.next_check:
            return

        def body(cur) -> list[tuple]:
            cur.execute(Q["consumers_flow"], {"queue": queue})
            return list(cur.fetchall())

        rows = session.run(body, what=f"consumers' counters {queue}")
        self.all_count = all(keeps_counters(flow, queue) for (flow,) in rows)
        self.next_check = now + CHECK_S

    def bound(self, trust_s: float) -> float:
        """The trust bound a claim's reads pass: `trust_s` while every consumer counts."""
        return trust_s if self.all_count else UNTRUSTED_S
