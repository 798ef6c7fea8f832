"""KeyGate: a limited claim's locks on the rows of the keys it takes (nq_flow_key) and of its
queue (the empty key, for the queue's `limit`), and the running counts read under them, which
decide how many of each key's locked jobs the claim keeps.

A claim's candidates are read plain (store/flow.py), within the free slots that the committed
running jobs leave. Only then are keys locked: with each window of the locking read
(queries.lock_window), in the same round trip, the rows of the keys of that window's jobs
(flow_lock, FOR UPDATE SKIP LOCKED), then the running jobs counted again (flow_running), then
the jobs locked (claim_lock). A claim used to lock every key with a free slot before reading
its candidates: two consumers claiming at once then wanted the same rows, and the second found
every key locked and came back empty (about a third of the claims of two consumers on 100 keys
of limit 2). Now each locks only the keys of the jobs it is about to take, for the rest of its
transaction only.

The guarantee is the one the earlier order gave: a job of a limited key is kept (marked) only
if this claim holds its key's row, and only as far as the count read under that lock (every
claim of the key commits before it lets go of that row, and a READ COMMITTED statement sees
what committed before it) plus what this claim kept already leaves a free slot; a job of a
queue with a `limit` only under the queue row's lock, the same way. A job whose key row another
claim holds is left for that claim (`contended`: the claim did not drain the queue); a job
over its key's count is held back by the limit, as the candidate read would have held it.
queries.claim counts once more after its mark (FlowClaims.verify_marked): a count cut short by
a KILL QUERY must not let a key run more than its limit.

A queue limited per key only (FlowLimits.counts) reads each locked key's counter with its lock
(flow_lock) instead of counting the claimed rows; a counter it may not trust (unknown, or
counted more than COUNT_TRUST_S ago) is counted again under the lock first (flow_recount), and
that claim then counts once more after its mark as the others do. No counter is trusted while
a consumer of the queue does not keep them (store/count_trust.py). A limited claim that does not
count gives up, with its mark, the known counters of the keys it takes (`known`): its jobs are in
no counter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from notifyq.store.flow import COUNT_TRUST_S, QUEUE_ROW, FlowLimits, _Read, run_steps
from notifyq.store.sql import QUERIES as Q


class KeyGate:
    """One claim's key locks and counts (see the module's docstring)."""

    def __init__(self, queue: str, limits: FlowLimits, plan: _Read, key_of: dict[int, str | None],
                 freed: dict[str, int] | None = None, trust_s: float = COUNT_TRUST_S):
        self.queue, self.limits, self.plan = queue, limits, plan
        # The trust bound of the counters it reads (FlowClaims.trust_s: none is trusted while a
        # consumer of the queue does not keep them, store/count_trust.py)
        self.trust_s = trust_s
        # A netted ack's jobs per key (FlowClaims.freed): gone, still in the counters it reads
        self.freed = freed if freed is not None else {}
        self.key_of = dict(key_of)  # each candidate id's key, from the candidate read
        self.asked: set[str] = set()  # rows asked for: locked, or held by another claim
        self.locked: set[str] = set()
        self.kept: dict[str | None, int] = {}  # rows kept per key, over every window
        self.held: list[str] = []  # keys whose locked jobs the count under the lock held back
        self.contended = False  # locked jobs left for another claim that holds their key's row
        self.recounted = False  # a counter recounted under its lock (flow_recount)
        # A claim that does not count: the locked keys whose counters are known (a counting
        # consumer's), given up with its mark (its jobs are in no counter)
        self.known: set[str] = set()

    @property
    def closed(self) -> bool:
        """Nothing more can be kept: another claim holds the queue's row, or its `limit` is
        reached (the locking read's further windows would only lock jobs to let them go)."""
        if not self.limits.limit or QUEUE_ROW not in self.asked:
            return False
        if QUEUE_ROW not in self.locked:
            return True
        return sum(self.plan.running.values()) + sum(self.kept.values()) >= self.limits.limit

    def learn(self, key_of: dict[int, str | None]) -> None:
        """More candidates' keys (a claim that read again past jobs too new for it)."""
        self.key_of.update(key_of)

    def lock(self, cur, ids: list[int], claim_lock: tuple[str, dict[str, Any]]) -> list[tuple]:
        """One window's locking read (`claim_lock`, for `ids`), after the locks of the keys of
        those ids that no earlier window asked for and the count under them, in one round trip:
        claim_lock's rows."""
        key_of, limit_for = self.key_of, self.limits.limit_for
        want = sorted({key_of.get(i) for i in ids} - {None} - self.asked)  # (keys: text)
        want = [k for k in want if limit_for(k)]
        if self.limits.limit and QUEUE_ROW not in self.asked:
            want.insert(0, QUEUE_ROW)
        if not want:
            [rows] = run_steps(cur, [claim_lock])
            return rows
        self.asked.update(want)
        lock = (Q["flow_lock"], {"queue": self.queue, "keys": tuple(want), "trust_s": self.trust_s})
        if self.limits.counts:
            # A counting queue: the locked keys' counters, read by the lock itself (a locking
            # read: the latest, and nobody else's to change until our COMMIT); the other keys'
            # as last read. A counter not to be trusted (unknown, or not recounted within
            # COUNT_TRUST_S) is recounted first, under the lock (flow_recount): a round trip more.
            got, rows = run_steps(cur, [lock, claim_lock])
            self.locked.update(r[0] for r in got)
            self.plan.skipped.update(set(want) - self.locked)
            trusted = {r[0]: int(r[1]) - self.freed.get(r[0], 0) for r in got if r[2]}
            untrusted = [r[0] for r in got if not r[2]]
            if untrusted:
                params = {"queue": self.queue, "keys": tuple(untrusted)}
                [recounted] = run_steps(cur, [(Q["flow_recount"], params), (Q["flow_recounted"], params)])
                trusted.update((r[0], int(r[1])) for r in recounted)
                for k in untrusted:  # recounted from the rows: the ack's deleted ones not in it
                    self.freed.pop(k, None)
                # A key whose count did not come back (a read cut short) keeps no job: as if
                # another claim held its row
                self.locked.difference_update(k for k in untrusted if k not in trusted)
                self.recounted = True
            self.plan.running.update(trusted)
            # A key whose count under its lock leaves no slot holds this window's jobs of it back,
            # whoever holds their rows (a peer's claim that could not lock the key's row keeps
            # none of them): held, not taken, though no row of theirs came back to admit(). The
            # claim then says when the counter's trust ends (queries.Claim.recount_s); without
            # this it drained holding nothing, and ended its process's claim at that end
            for k in want:
                if k in self.locked and k not in self.held and trusted.get(k, 0) >= limit_for(k):
                    self.held.append(k)
            return rows
        got, running, rows = run_steps(cur, [lock,
                                             (Q["flow_running"], {"queue": self.queue}), claim_lock])
        self.locked.update(r[0] for r in got)
        self.known.update(r[0] for r in got if r[1] is not None and r[0] != QUEUE_ROW)
        self.plan.skipped.update(set(want) - self.locked)
        self.plan.running.clear()
        self.plan.running.update((r[0], int(r[1])) for r in running)
        if self.limits.limit:
            self.plan.room = self.limits.limit - sum(self.plan.running.values())
        return rows

    def admit(self, rows: Iterable[tuple], key: Callable[[tuple], str | None]) -> list[tuple]:
        """Of a window's locked rows, in claim order, the ones this claim may keep: their key's
        row (and the queue's) held, and a slot free under the count read with the lock."""
        kept: list[tuple] = []
        running, limits = self.plan.running, self.limits
        # (looked up once: asked for each row the claim locked)
        queue_limit, limit_for, locked, per_key, held = limits.limit, limits.limit_for, self.locked, self.kept, self.held
        for row in rows:
            k = key(row)
            if queue_limit:
                if QUEUE_ROW not in locked:
                    self.contended = True
                    continue
                if sum(running.values()) + sum(per_key.values()) >= queue_limit:
                    continue  # held back by the queue's limit
            lim = limit_for(k)
            if lim:
                if k not in locked:
                    self.contended = True
                    continue
                if running.get(k, 0) + per_key.get(k, 0) >= lim:
                    if k not in held:
                        held.append(k)
                    continue
            per_key[k] = per_key.get(k, 0) + 1
            kept.append(row)
        return kept
