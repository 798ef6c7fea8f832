"""Retention's sweep of per-key bookkeeping: a limited or fair queue's key rows (nq_flow_key)
and a per-key rate's logs (nq_rate) of keys no longer in use.

A claim names each key it meets in nq_flow_key, and a per-key rate keeps up to N rows per key
in nq_rate; a key used once (an order id, a request id) left them for ever. The consumer's
retention pass (consume/periodic.py, every retention_every_s) deletes them in chunks, in key
order from where the last pass stopped:

  - a key row with no ready job and no claimed one: a claim that meets the key again finds it
    by discovery and names it anew, as it did the first time (the limits are counted from the
    claimed jobs, never from this row);
  - a key's rate slots once every one is more than the rate's period old: they hold no start,
    and the next claim or consume_rate of the key makes them again as never spent.

Each delete tests its condition again under the rows' locks, so a key taken meanwhile stays.
"""

from __future__ import annotations

from notifyq.store import queries
from notifyq.store.db import Session
from notifyq.store.sql import QUERIES as Q

SWEEP_CHUNK = 1000  # keys per statement
SWEEP_CHUNKS = 10  # statements per table and pass: the rest is the next pass's


def sweep_flow_keys(session: Session, queue: str, after: str = "", chunk: int = SWEEP_CHUNK,
                    max_chunks: int = SWEEP_CHUNKS) -> tuple[int, str]:
    """Delete `queue`'s key rows no job uses: (deleted, where the next pass starts; "" once
    every key was read)."""
    return _sweep(session, queue, "flow_keys_unused", "flow_keys_drop", {}, after, chunk, max_chunks)


def sweep_rate_keys(session: Session, queue: str, period_s: float, after: str = "",
                    chunk: int = SWEEP_CHUNK, max_chunks: int = SWEEP_CHUNKS) -> tuple[int, str]:
    """Delete the rate slots of `queue`'s keys whose every slot is older than `period_s` (the
    key rate's period): (deleted rows, where the next pass starts; "" once all were read)."""
    extra = {"period_us": queries.microseconds(period_s)}
    return _sweep(session, queue, "rate_keys_idle", "rate_keys_drop", extra, after, chunk, max_chunks)


def _sweep(session: Session, queue: str, find: str, drop: str, extra: dict, after: str, chunk: int,
           max_chunks: int) -> tuple[int, str]:
    deleted = 0
    for _ in range(max_chunks):
        def body(cur, after=after) -> tuple[int, str]:
            cur.execute(Q[find], {"queue": queue, "after": after, "limit": chunk, **extra})
            keys = [row[0] for row in cur.fetchall() if row[0] != ""]
            if not keys:
                return 0, ""
            cur.execute(Q[drop], {"queue": queue, "keys": keys, **extra})
            return cur.rowcount, keys[-1]

        n, last = session.run(body, what=f"sweep {find} {queue}")
        deleted += n
        if not last:
            return deleted, ""
        after = last
    return deleted, after
