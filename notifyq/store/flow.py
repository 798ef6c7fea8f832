"""Concurrency limits and fairness inside the claim: which keys have free slots, and how many of
their ready jobs a claim may take (queries.claim calls FlowClaims.candidates at one place).

The limits (the queue's `limit_per_key`, its per-key overrides, its `limit`) are counted, not
kept in a counter, but for the queue limited per key only (below): a claim reads its candidates
within the free slots the committed running jobs leave, then locks the rows of the keys of the
jobs it takes (nq_flow_key, FOR UPDATE SKIP LOCKED: a key another consumer is claiming right
now is skipped, not waited on) and, under those locks, counts each key's running jobs from the
queue's claimed rows (status 2) again, with the locking read of those jobs (store/key_gate.py).
Only a claim starts a job, and every claim of a key holds that key's row until its COMMIT, so
the count it reads there is exact and what it keeps is bounded by the free slots. A finished,
failed, given back or taken back job leaves status 2 in its own transaction, which frees its
slot at once; a dead consumer's rows stay claimed until a reaper takes them back, so its slots
come back then, never earlier. The queue's `limit` is the same with the queue's own row (the
empty key: no job's key is empty).

A queue limited per key only (FlowLimits.counts) keeps each key's running jobs in a counter on
the key's row instead (nq_flow_key.running, schema 10): counting the claimed rows in every claim
was the larger part of its cost. Its claims add what they take under the row's lock, in their
transaction; the ack, failure, give-back or completion of a job a counting claim took (its
token has COUNTED_BIT, store/queries.py) takes it off, under the fence, in its transaction
(flow_count_release). Every other path out of status 2 leaves the counter high, never low; a
counter that is unknown (NULL) or was counted more than COUNT_TRUST_S ago is counted again from
the claimed rows under the row's lock before a claim trusts it (KeyGate), which bounds how long
a counter left high holds its key; and none is trusted while a consumer of the queue does not
keep them (store/count_trust.py). The candidates come from the head of the ready jobs, read
with the counters (flow_head_keys; ix_state holds the key), where it holds them.

The candidates come through ix_key, one read per key (flow_key_firsts' dives, or
flow_key_ready for a key it may take more than a few of), so a key with 50,000 ready jobs costs
a claim the few rows it may take, not the other keys their turn. The keys are the ones
nq_flow_key names, read round-robin; keys not named yet are found by a few dives into ix_key
per claim (discovery: more while each dive finds a new key) and named in a transaction of
their own, before the claim takes their jobs (UnnamedKeys, name_keys: naming a key can wait on a
peer's lock of its row, and nothing a claim carries may wait with it). With `fair`, a claim
takes its keys round-robin: each key's first job, then each key's second, and so on (priority
and age order inside each round); without, in claim order (priority, run_at, id), except that
a limited claim takes a key's free slots together (the keys in the order of their first jobs,
within a priority), so that consumers claiming at once take different keys; and it reads a few
of a key's jobs past its free slots, spares it locks only where a peer's claim took the first
ones meanwhile (spare_cap). A queue with
a per-key rate (rate_per_key) reads its candidates here too, each key's capped at N + 1 (a claim
starts at most N of a key): a key's backlog then never fills the claim's read, and the rates
(store/rates.py) pick among the keys with room.

A job held back by a limit stays ready: it is not claimed, not charged an attempt, and counts
as taken for the watcher (a claim that only held jobs back drained the queue): the transaction
that frees its slot bumps the queue's signal (queries.Acks.wake and the outcomes'), which wakes
the watcher through the hand-off. A slot a counter left high frees in no transaction: it frees
when a claim recounts the counter, so a counting claim whose counters held jobs back (drained
or not) says when that counter's trust ends (queries.Claim.recount_s, Grant.held_ready), and the
queue's idle worker claims again then (wakeup/waiter.py, Waiter.recount_after).
"""

from __future__ import annotations

import fnmatch
import functools
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from notifyq.config import QueueConfig
from notifyq.store.count_trust import CountTrust
from notifyq.store.driver import cut_short
from notifyq.store.sql import QUERIES as Q

QUEUE_ROW = ""  # nq_flow_key's row for the queue's `limit` (a job's key is 1-191 characters)
DISCOVERY_STEPS = 4  # flow_next_key dives per claim, while they find keys already named
# ... doubled after a claim whose dives all found new keys, up to this many: a queue of 100 keys
# was found four keys a claim, and its first 25 claims took a few jobs each
DISCOVERY_MAX_STEPS = 64
KEYS_PER_CLAIM = 3  # keys a claim reads from nq_flow_key, as a multiple of the batch size
# The fewest ready jobs a claim reads as candidates (this read of unkeyed ones, and queries.claim's
# plain one, which read 3 x the batch size). A claim sized down to a job or two (lineup.ClaimSizer,
# for slower jobs) read 3 to 6, and as many peers claiming at once had often locked them all
# (SKIP LOCKED): under a fault-schedule run of 16 consumers half the claims came back empty with
# thousands of jobs ready, and an empty claim sends its worker to queue for the watch lock, where
# the idle ones pass one claim at a time. 32 ids of an index-only read cost no more to read.
MIN_CANDIDATES = 32
# The most jobs of a key a claim reads by flow_key_firsts' dives (a dive per job); a key it may
# take more of is read by flow_key_ready, a statement part of its own
FIRSTS_MAX = 4
# How deep a flow claim reads for unkeyed jobs (flow_unkeyed_deep) when the head it read had
# fewer than it wants: ids of an index-only read and their rows' keys, about a millisecond.
UNKEYED_DEPTH = 1000
# A claim whose grant has jobs, and whose consumer's last read of unkeyed jobs found none,
# skips the deep read (and, on a limited queue, the head's: flow_unkeyed_ready) this many
# claims in a row at most, saying it left jobs behind. On 100 keys of limit 2 with no unkeyed
# job, every claim read the head's 300 rows, and the consumer holding 48 keys' slots (a grant
# of 96 jobs, short of its batch) 1,000 entries and their rows more (a round trip, 3 ms of the
# server's time): half the rows a limited claim read. Unkeyed jobs wait at most this many
# claims of each consumer; a claim that would take nothing always reads them.
DEEP_SKIPS = 8
# A lean claim's head grows to this many times unkeyed_limit at most (FlowClaims.lean_head)
HEAD_GROWTH = 8
# How long a counting queue's claim trusts a key's counter after its last recount (seconds). A
# counter is never low while every consumer of the queue counts (docs/flow-control.md), but it can
# be high: a job taken out of status 2 by a path that does not release it (a reaper, an expired
# lease, an operator's cancel) leaves its slot taken. Recounted once it is older than this, under
# its row's lock, a key is held by such a slot at most this long (the idle consumer whose claim it
# held jobs back claims again then: queries.Claim.recount_s). No counter is trusted at all
# while a registered consumer of the queue does not count (an older version through an upgrade,
# another config: store/count_trust.py), and a limited claim that does not count gives up the
# counters of the keys it takes.
COUNT_TRUST_S = 5


@dataclass(frozen=True)
class FlowLimits:
    """A queue's flow settings as a claim applies them (config: limit_per_key, limit, fair,
    key_limits)."""

    limit_per_key: int = 0  # 0: no per-key limit
    limit: int = 0  # 0: no limit on the queue's running jobs
    fair: bool = False
    # Per-key overrides in the order given: an exact key, or a pattern with * ? [...]
    # (fnmatch, case-sensitive); an exact key wins over patterns, the first pattern that
    # matches over later ones.
    key_limits: tuple[tuple[str, int], ...] = ()
    # rate_per_key's N (0: none): a key starts at most N jobs per claim, so a claim reads at most
    # N + 1 of its jobs (the one more tells it that the rest waits for the key's refill)
    rate_cap: int = 0

    @classmethod
    def of(cls, qc: QueueConfig) -> FlowLimits:
        per_key = qc.rates[1]
        return cls(qc.limit_per_key, qc.limit, qc.fair, qc.key_limits, per_key.count if per_key else 0)

    @property
    def limited(self) -> bool:
        """Some running job counts against a limit (fairness alone counts none)."""
        return bool(self.limit_per_key or self.limit or self.key_limits)

    @property
    def counts(self) -> bool:
        """Limited per key only (`limit_per_key`, per-key overrides; no `limit`, not `fair`, no
        per-key rate): its claims keep each key's running jobs in the key's counter row
        (nq_flow_key.running) and read their candidates from the head of the ready jobs. Every
        other configuration counts the claimed rows (flow_running) as before."""
        return bool(self.limit_per_key or self.key_limits) and not self.limit and not self.fair and not self.rate_cap

    def verify_within(self, running_rows: list[tuple], keys: Collection[str | None], what: str) -> None:
        """Raise cut_short unless each of `keys`, and the queue, runs within its limit by
        `running_rows` (flow_running's, read after a mark: a claim's, a retake's)."""
        running = {r[0]: int(r[1]) for r in running_rows}
        for key in set(keys):
            lim = self.limit_for(key)
            if lim and running.get(key, 0) > lim:
                raise cut_short(f"{what}: key {key!r} would run {running[key]} of {lim}")
        if self.limit and sum(running.values()) > self.limit:
            raise cut_short(f"{what}: would run {sum(running.values())} of {self.limit}")

    def limit_for(self, key: str | None) -> int:
        """The most running jobs of `key` (0: no limit); a job without a key has none."""
        if key is None:
            return 0
        if not self.key_limits:
            return self.limit_per_key  # (asked for each job a limited claim locks)
        for pattern, n in self.key_limits:
            if pattern == key:
                return n
        for pattern, n in self.key_limits:
            if is_pattern(pattern) and fnmatch.fnmatchcase(key, pattern):
                return n
        return self.limit_per_key


def spare_cap(lim: int, free: int) -> int:
    """How many of a limited key's first ready jobs a claim reads when `free` of its `lim` slots
    are free as last committed: twice that, within the limit (and within flow_key_firsts' dives
    where the free ones are). Consumers that claim at once read the same committed counts and
    the same first jobs: the first claim in took them, and the next one, its window locking
    none of them (they are claimed), came back empty (of 10,000 jobs on 100 keys of limit 2,
    two consumers ran by turns, half the claims empty, each waiting for the other's wake). The
    jobs past the free ones go last in the grant (Grant.spares), locked only once the free
    ones are gone; the count under the key's lock (KeyGate) still decides what is kept."""
    if free <= 0:
        return 0
    cap = min(lim, 2 * free)
    return max(free, min(cap, FIRSTS_MAX)) if free <= FIRSTS_MAX else free


def unkeyed_limit(batch_size: int) -> int:
    """How many ready jobs a flow claim reads for its unkeyed candidates."""
    return max(batch_size * KEYS_PER_CLAIM, MIN_CANDIDATES)


def is_pattern(text: str) -> bool:
    return any(c in text for c in "*?[")


@dataclass
class Grant:
    """What one claim's flow read allows: the candidate ids in the order to lock them, whether
    every key with free slots was seen whole (`complete`: nothing grantable left behind), and
    what was held back (for `notifyq status`' why)."""

    ids: list[int]
    complete: bool
    held_keys: list[str] = field(default_factory=list)  # keys whose ready jobs a limit holds
    queue_full: bool = False  # the queue's `limit` held every job back
    keys: dict[int, str | None] = field(default_factory=dict)  # each id's key (the rates' budgets)
    active_keys: int = 0  # keys it found ready jobs of
    contended: bool = False  # jobs left for peers' claims that held their keys' rows (KeyGate)
    # The last `spares` ids: jobs of keys past their free slots as last committed (spare_cap),
    # kept only where a peer's claim took the jobs before them: none of them is left behind
    spares: int = 0
    # Ready jobs it read were held back by a key's limit (held_keys also names keys at their
    # limit whose ready jobs, if any, it did not read): a counting queue's claim that held them
    # claims again once the counters' trust ends (queries.Claim.recount_s)
    held_ready: bool = False


class UnnamedKeys(Exception):
    """Raised in a claim's transaction by candidates(): discovery found keys no row names yet
    (`keys`). queries.claim rolls the claim back, names them in a transaction of their own
    (FlowClaims.name_keys) and runs the claim again: naming a key can wait on a lock, and a
    limited claim carries the last batch's acks, which must never wait with it."""

    def __init__(self, keys: list[str]):
        super().__init__(f"keys to name first: {len(keys)}")
        self.keys = keys


class FlowClaims:
    """One worker's flow state for its queue: the limits and the claims' round-robin cursors."""

    def __init__(self, limits: FlowLimits):
        self.limits = limits
        self.after = ""  # the last key of the last claim's truncated key read
        self.discover_after = ""  # where the next discovery dives start
        self.discovery_steps = DISCOVERY_STEPS  # how many dives the next claim makes
        self.active_keys: int | None = None  # keys the last claim found ready jobs of
        self.last: Grant | None = None
        self.read: _Read | None = None  # the last candidates()' settled keys, for for_version
        self.turn: str | None = None  # a fair claim's last key of its first round (None: none yet)
        self._first: tuple[tuple[str, int, bool], list[list[tuple]]] | None = None  # looks()' key reads
        # This claim reads the lean way (lean_steps; queries.claim sets it): a queue limited per
        # key only, by its counters and the head alone, the full read only where those cannot
        # decide (lean_grant)
        self.lean_now = False
        # Jobs per key a netted ack of this claim ended (queries.Acks.net): still in their keys'
        # counters until its mark's net change, so every count this claim reads is less these
        self.freed: dict[str, int] = {}
        self.lean_stats: dict[str, int] = {}  # lean claims, and full ones by why
        self.lean_claims = 0  # lean reads so far (the clock of lean_looked)
        # Free keys absent from a full head that a full read looked for (it dives for them):
        # key -> the lean read before which their absence sends no claim to the full read again
        # (None: any key, of a queue of many keys)
        self.lean_looked: dict[str | None, int] = {}
        # The queue has more key rows than this, as a lean read of every key's counter found: a
        # lean claim whose head holds no more jobs looks up its head's keys' counters instead
        # (flow_lean_head_counted, lean_steps)
        self.lean_keys_over = 0
        self.lean_read_many = False  # this claim's lean read looked them up (lean_steps)
        # The lean head's length (its jobs read), when grown past unkeyed_limit: a head whose
        # grantable jobs did not fill the batch doubles it, up to HEAD_GROWTH times (lean_grant)
        self.lean_head = 0
        self.lean_head_now = 0  # this claim's (lean_steps)
        self.deep_skips = 0  # reads of unkeyed jobs skipped since the last one (DEEP_SKIPS)
        self.deep_found = True  # whether the last read of unkeyed jobs found any
        # Keys the last claim found unnamed after it had named some already (name_keys): the
        # next claim names them before its own transaction
        self.unnamed: list[str] = []
        self.named_now = False  # this claim named keys already (queries.claim sets it)
        # The jobs per key that this claim's own acks end (key affinity: the grant takes these
        # keys first; the acks' release runs first in the claim, so its counts leave them out)
        self.own_acked: dict[str, int] = {}
        # A counting queue's counters are given up (flow_count_forget) before this worker's first
        # claim of it: jobs it claimed before, while its config did not count, are in no counter
        self.forget = limits.counts
        # The claim's KeyGate recounted a key (flow_recount): its mark is followed by the
        # queue's recount (verify_marked), as a claim of a queue that does not count is
        self.recounted = False
        # Whether every consumer of the queue keeps the counters (store/count_trust.py): until
        # this worker's read says so, and while one does not, no counter is trusted
        self.trust = CountTrust()

    @classmethod
    def for_queue(cls, qc: QueueConfig) -> FlowClaims | None:
        """A worker's flow state, or None for a queue without limits, fairness or per-key rate:
        its claim is the plain one, and pays nothing. A per-key rate reads its candidates here,
        each key's apart (flow_key_ready): the plain read's first jobs in claim order may all be
        one key's, whose spent budget then held every other key back until its refill."""
        return cls(FlowLimits.of(qc)) if qc.flow_controlled or qc.rates[1] is not None else None

    def looks(self, cur, queue: str, batch_size: int, lead: list[tuple[str, dict[str, Any]]],
              writes: list[tuple[str, dict[str, Any]]] = ()) -> tuple[list[int], list[list[tuple]]]:
        """The claim's first round trip: its `writes` (a limited claim's acks: statements that
        return no rows), its own looks (`lead`: the due job, the pause, a watcher's count;
        statements that return rows) and, after them, this claim's key reads. The writes' row
        counts and the looks' rows, in order; candidates() then goes on from the key reads (a
        claim that promotes due jobs after its looks drops them, and candidates() reads the
        keys again)."""
        first = self.lean_steps(queue, batch_size) if self.lean_now else self._first_steps(queue, batch_size)
        counts: list[int] = []
        results = run_steps(cur, list(writes) + list(lead) + first, counts=counts)
        self._first = ((queue, batch_size, self.lean_now), results[len(lead):])
        return counts[:len(writes)], results[:len(lead)]

    def drop_looks(self) -> None:
        self._first = None

    def candidates(self, cur, queue: str, batch_size: int) -> Grant:
        """In the claim's transaction, before its locking read: the ids it may lock."""
        grant = self._candidates(cur, queue, batch_size)
        if self.unnamed:
            grant.contended = True  # their jobs left: the next claim, at once, names them first
        self.last = grant
        return grant

    def verify_marked(self, running_rows: list[tuple], queue: str, keys: list[str | None]) -> None:
        """In the claim's transaction, its mark's reply read and its COMMIT not yet sent: raise
        cut_short (the claim runs again) if a key it took, or the queue, now runs more than its
        limit: the decisive count was cut short (a KILL QUERY can end a read with an OK reply and
        rows missing). `running_rows`: flow_running's, read in the mark's query right after it
        (a plain read of the claimed rows: these keys' rows are still ours)."""
        if not self.limits.limited:
            return  # nothing counted (fairness, a per-key rate): nothing to verify
        self.limits.verify_within(running_rows, keys, f"claim {queue}")

    def name_keys(self, session, queue: str, keys: list[str]) -> None:
        """Name `keys` (flow_add_keys) in a transaction of their own, committed in the statement's
        round trip: outside any claim, so that the acks a claim carries never wait on a key row's
        lock (an INSERT IGNORE of a row a peer's claim holds waits for that claim's COMMIT)."""
        sql = _add_keys(len(keys))
        params = {"queue": queue, **{f"key{i}": k for i, k in enumerate(keys)}}

        def body(cur) -> None:
            cur.execute(cur.mogrify(sql, params) + ";\nCOMMIT")
            while cur.nextset():
                pass

        session.run(body, what=f"name keys {queue}")
        self.unnamed = [k for k in self.unnamed if k not in set(keys)]

    def _first_steps(self, queue: str, batch_size: int) -> list[tuple[str, dict[str, Any]]]:
        """Round trip 1 (plain reads): discovery and which of its keys are named, the named keys,
        and the running counts."""
        n = self.discovery_steps
        found = ", ".join(f"@nq_k{i}" for i in range(1, n + 1))
        named = Q["flow_discovered_named"].replace("@nq_k1, @nq_k2, @nq_k3, @nq_k4", found)
        window = {"queue": queue, "after": self.after, "limit": batch_size * KEYS_PER_CLAIM}
        return _discovery(queue, self.discover_after, n) + [
            (named, {"queue": queue}),
            (Q["flow_keys"], window),
            # a counting queue reads the counter rows of those keys, the others their claimed rows
            (Q["flow_counts"].replace("@nq_k1, @nq_k2, @nq_k3, @nq_k4", found),
             {**window, "trust_s": self.trust_s}) if self.by_head else
            (Q["flow_running"], {"queue": queue})] + (
            # and the head (ready jobs in claim order with their keys), read with the counters:
            # the free keys' candidates where it holds them
            [(Q["flow_head_keys"], {"queue": queue, "limit": unkeyed_limit(batch_size)})] if self.by_head else [])

    @property
    def lean(self) -> bool:
        """Whether this worker's next claim may read the lean way: `limit_per_key` alone (no
        overrides, no `limit`, not fair, no per-key rate), its counters given up already, no key
        waiting to be named, every consumer of the queue keeping the counters (CountTrust).
        queries.claim adds: no queue rate."""
        limits = self.limits
        return (limits.counts and bool(limits.limit_per_key) and not limits.key_limits
                and not self.forget and not self.unnamed and not self.named_now and self.trust.all_count)

    @property
    def trust_s(self) -> float:
        """The trust bound this claim's counter reads pass: COUNT_TRUST_S while every consumer of
        the queue keeps the counters, else one no counter meets (store/count_trust.py)."""
        return self.trust.bound(COUNT_TRUST_S)

    def lean_steps(self, queue: str, batch_size: int) -> list[tuple[str, dict[str, Any]]]:
        """A lean claim's reads in its first round trip, key rows bounded by its head whatever
        the queue's number of keys: for a queue of a few keys, every key's counter (one more than
        its head holds keys at most: a range read, cheaper than a lookup a key) and the head;
        for one of more (lean_keys_over), the head with its keys' counters (a lookup a job) and
        whether a key it does not hold may be free (one row at most)."""
        limit = unkeyed_limit(batch_size)
        head = self.lean_head_now = min(max(limit, self.lean_head), limit * HEAD_GROWTH)
        self.lean_read_many = limit <= self.lean_keys_over
        if not self.lean_read_many:
            return [(Q["flow_lean_counters"], {"queue": queue, "trust_s": self.trust_s, "most": limit + 1}),
                    (Q["flow_lean_head"], {"queue": queue, "limit": head})]
        return [(Q["flow_lean_head_counted"], {"queue": queue, "limit": head, "trust_s": self.trust_s}),
                (Q["flow_lean_absent"], {"queue": queue, "limit": head, "lim": self.limits.limit_per_key})]

    def _lean_count(self, why: str) -> None:
        self.lean_stats[why] = self.lean_stats.get(why, 0) + 1

    def lean_grant(self, queue: str, batch_size: int, first: list[tuple], second: list[tuple]) -> Grant | None:
        """A lean claim's grant from its counters and head alone, or None where those cannot
        decide (the full read then runs): a full head whose grantable jobs do not fill the batch
        (free keys, or unkeyed jobs, behind it). Keys of the head without a row raise
        UnnamedKeys (every one of them, named before the claim runs again); a key whose counter
        it may not trust is granted up to the limit, its KeyGate recounting it under its lock.
        The head's jobs of each free key
        up to its free slots, and its unkeyed ones; in claim order by groups: within a
        priority, first the keys of the jobs this claim's acks end, then keys with every slot
        free, then the rest (unkeyed jobs with the second), each by its first job.

        One pass over the head (300 rows a claim: it was the lean claim's largest share of its
        Python): each key is judged at its first job, in the head's order, as a pass per key
        judged it, and each job is granted or not as it comes."""
        lim = self.limits.limit_per_key
        limit = unkeyed_limit(batch_size)
        head_limit = self.lean_head_now or limit
        many = self.lean_read_many
        if many:
            # (flow_lean_head_counted, flow_lean_absent): each head job with its key's counter
            # (id, prio, key, running, trusted), and whether some key outside the head may be free
            head, counters, at = first, None, 3
        else:
            # (flow_lean_counters, flow_lean_head): every key's counter (key, running, trusted),
            # if it read them all
            if len(first) > limit:
                # more keys than its head holds jobs: looked up from now on, by heads this size
                self.lean_keys_over = max(self.lean_keys_over, limit)
                self._lean_count("many_keys")
                return None
            head, counters, at = second, {r[0]: r for r in first}, 1
        freed, own = self.freed, self.own_acked
        # key -> [free slots not granted yet, its tier, its first job's place, more jobs than free slots]
        seen: dict[str, list] = {}
        running: dict[str | None, int] = {}
        ordered: list[tuple] = []  # (prio, tier, the key's first place, place, id, key)
        unkeyed = False
        recount = False  # a key of the head whose counter its KeyGate recounts
        unnamed: list[str] = []  # keys of the head that no row names
        filled = head_limit  # the head's place where its grantable jobs filled the batch
        for pos, row in enumerate(head):
            key = row[2]
            if key is None:
                unkeyed = True
                ordered.append((row[1], 1, pos, pos, row[0], None))
                continue
            st = seen.get(key)
            if st is None:
                known = row if counters is None else counters.get(key)
                trusted = None if known is None else known[at + 1]
                if trusted is None:
                    # A key no row names: collected, and named with the head's other such keys
                    # before the claim runs again (UnnamedKeys). The full read named only the
                    # few keys its discovery met, claim after claim (a fresh queue of 100 keys
                    # ramped up over its first claims, of 8, 24, 56 jobs)
                    unnamed.append(key)
                    running[key] = lim
                    st = seen[key] = [0, 2, pos, False]
                elif trusted:
                    n = running[key] = int(known[at]) - freed.get(key, 0)
                    st = seen[key] = [lim - n, 0 if key in own else 1 if n <= 0 else 2, pos, False]
                else:
                    # A counter it may not trust (unknown, or not recounted within the trust
                    # bound): granted up to the limit, with the keys known free (placed after
                    # them, such a key was never locked, so never recounted: its jobs waited
                    # for the queue's end). Its KeyGate
                    # recounts it under the key's lock (flow_recount) and keeps only what the
                    # count leaves room for, as a full read's claim does: the lean read need not
                    # give way to the full one (it did, and a consumer whose key affinity kept
                    # it on the same keys read fully on every claim while the others' counters
                    # stayed unknown)
                    recount = True
                    running[key] = 0
                    st = seen[key] = [lim, 0 if key in own else 1, pos, False]
            if st[0] > 0:
                st[0] -= 1
                ordered.append((row[1], st[1], st[2], pos, row[0], key))
                if len(ordered) == batch_size:
                    filled = pos
            else:
                st[3] = True
        if unnamed:
            self._lean_count("unnamed")
            raise UnnamedKeys(unnamed)
        held: list[str] = []
        caps: dict[str, int] = {}
        for key, st in seen.items():
            free = lim - running[key]
            if free <= 0:
                held.append(key)
                continue
            caps[key] = free
            if st[3]:
                held.append(key)
        full = len(head) >= head_limit
        self.lean_claims += 1
        # The head's length for the next claim: doubled where this one's grantable jobs did not
        # fill the batch, halved (to unkeyed_limit at least) where half of it did. The keys'
        # progress drifts apart (each consumer takes the keys its acks free first): the keys of
        # one consumer's slots then ran ahead of the others', out of a head of fixed length,
        # and its claims took half a batch
        if full and len(ordered) < batch_size:
            self.lean_head = head_limit * 2
        elif filled < head_limit // 2:
            self.lean_head = head_limit // 2
        # Free keys (or keys of unknown count) the head does not hold: their jobs, if any, lie
        # behind it. (None stands for any key of a queue of many keys: flow_lean_absent found one)
        outside = [] if not full else ([None] if second else []) if counters is None else [
            k for k, r in counters.items() if k not in seen and k != QUEUE_ROW and (r[1] is None or r[1] < lim)]
        if full and len(ordered) < batch_size:
            # Grantable jobs may lie behind the head: of free keys it does not hold (their jobs
            # later in claim order, or none: a key drained), or unkeyed ones. The full read looks
            # for both; a free key it looked for sends no claim to it again for DEEP_SKIPS lean
            # reads (of a queue of many keys, where the claim knows only that there is one, any
            # such key), and unkeyed jobs, while the last deep read found none, wait DEEP_SKIPS
            # claims at most (as the full read's skips). Keys in the head with fewer jobs there
            # than free slots take what the head holds (their next jobs come into it).
            # (None stands for any key of a queue of many keys: flow_lean_absent found one)
            absent = [k for k in outside if self.lean_looked.get(k, 0) <= self.lean_claims]
            if absent or self.deep_found or self.deep_skips >= DEEP_SKIPS:
                for k in absent:
                    self.lean_looked[k] = self.lean_claims + DEEP_SKIPS
                self._lean_count("short_head_keys" if absent else "short_head_unkeyed")
                return None
            self.deep_skips += 1
            self._lean_count("lean_short")
        ordered.sort()
        self._lean_count("lean_recount" if recount else "lean")
        keys = list(caps)
        # Every key with a free slot seen: the head held them all, or is the whole queue (the
        # read again past jobs too new for the consumer, for_version, says drained by it)
        self.read = _Read(queue, batch_size, keys, caps, set(), running, None, held, not full or not outside,
                          dict(own))
        grant = Grant([r[4] for r in ordered], not full, held, False, {r[4]: r[5] for r in ordered},
                      len(caps) + unkeyed, held_ready=bool(held))  # (the head's keys: ready jobs)
        self.active_keys = grant.active_keys
        return grant

    @property
    def by_head(self) -> bool:
        """A queue that counts (FlowLimits.counts): counters + head candidates."""
        return self.limits.counts

    def count_add(self, queue: str, counts: dict[str, int]) -> tuple[str, dict[str, Any]] | None:
        """The statement that adds `counts` (key -> the jobs the claim marked) to the keys'
        counter rows (one row each, key order)."""
        order = sorted(k for k, n in counts.items() if n)
        if not order:
            return None
        params: dict[str, Any] = {"queue": queue, "keys": tuple(order)}
        for i, k in enumerate(order):
            params[f"key{i}"], params[f"n{i}"] = k, counts[k]
        return _count_add(len(order)), params

    def _candidates(self, cur, queue: str, batch_size: int) -> Grant:
        limits = self.limits
        want_keys = batch_size * KEYS_PER_CLAIM
        self.read = None  # until this claim's keys are settled
        first, self._first = self._first, None
        if first is not None and first[0] == (queue, batch_size, True):
            grant = self.lean_grant(queue, batch_size, *first[1])
            if grant is not None:
                return grant
            first = None  # the lean read cannot decide: the full one, in the same transaction
        if first is None or first[0] != (queue, batch_size, False):
            first = (None, run_steps(cur, self._first_steps(queue, batch_size)))
        discovered_row, existing_rows, named_rows, running_rows = first[1][:4]  # (read with the claim's looks)
        head0 = first[1][4] if self.by_head else None  # (id, prio, run_at, key) in claim order
        dives = len(discovered_row[0])
        discovered = [k for k in discovered_row[0] if k is not None]
        self.discover_after = discovered[-1] if len(discovered) == dives else ""
        named = [r[0] for r in named_rows]
        has_queue_row = QUEUE_ROW in named
        named = [k for k in named if k != QUEUE_ROW][:want_keys]
        complete = len(discovered) < dives
        if len(named) >= want_keys:
            self.after, complete = named[-1], False
        else:
            self.after = ""
        known = set(named)
        unread = [k for k in discovered if k not in known]  # found by discovery, not by the named read
        if len(unread) == dives:
            self.discovery_steps = min(2 * dives, DISCOVERY_MAX_STEPS)  # more keys than named: faster
        elif not unread:
            self.discovery_steps = DISCOVERY_STEPS  # every key it met is named: a few dives suffice
        # Keys without a row are named outside the claim (name_keys) before it takes their jobs:
        # once in a claim (UnnamedKeys: it runs again), later ones by the next claim
        existing = {r[0] for r in existing_rows}
        new = [k for k in unread if k not in existing] + [QUEUE_ROW] * bool(limits.limit and not has_queue_row)
        if new and not self.named_now:
            raise UnnamedKeys(new)
        self.unnamed = new
        if QUEUE_ROW in new:
            return Grant([], False, [], contended=True)  # (the queue's row to lock first)
        complete = complete and not new
        own = self.own_acked if self.by_head else {}
        running = {r[0]: int(r[1]) - self.freed.get(r[0], 0) for r in running_rows}

        keys, held = [], []
        for key in named + [k for k in unread if k in existing]:
            lim = limits.limit_for(key)
            if lim and running.get(key, 0) >= lim:
                held.append(key)
            else:
                keys.append(key)
        if limits.limit and sum(running.values()) >= limits.limit:
            return Grant([], complete, held, queue_full=True)

        # Round trip 2: each key's first ready jobs (plain reads).
        # The keys are locked later, only those of the jobs the claim takes (KeyGate), with
        # the locking read of those jobs.
        caps = {}
        # A fair claim reads each key's share of the batch: shared among the keys the last claim
        # found jobs of (all of them the first time), so that one key left alone gets the batch
        active = self.active_keys if self.active_keys is not None else len(keys)
        share = max(1, math.ceil(batch_size / max(1, min(active, len(keys))))) if limits.fair else batch_size
        spares = not limits.fair and not limits.rate_cap
        for key in keys:
            lim = limits.limit_for(key)
            free = lim - running.get(key, 0)
            caps[key] = min(share, free) if lim else share
            if lim and spares:
                caps[key] = spare_cap(lim, min(share, free))
            if limits.rate_cap:
                caps[key] = min(caps[key], limits.rate_cap + 1)
        steps = []
        from_head: list[tuple] = []
        dive_keys = keys
        if head0 is not None:
            # A key's first jobs from the head where it holds caps[key] of them (or the
            # head is the whole ready queue); the other keys by their dives
            whole = len(head0) < unkeyed_limit(batch_size)
            in_head: dict[str, list[tuple]] = {}
            for job_id, prio, run_at, key in head0:
                if key is not None:
                    in_head.setdefault(key, []).append((job_id, key, prio, run_at))
            dive_keys = []
            for key in keys:
                rows = in_head.get(key, [])
                if whole or len(rows) >= caps[key]:
                    from_head += rows[:caps[key]]
                else:
                    dive_keys.append(key)
        # Each key's first jobs: a few of each in one statement of dives, more by flow_key_ready
        few = [k for k in dive_keys if caps[k] <= FIRSTS_MAX]
        many = [k for k in dive_keys if caps[k] > FIRSTS_MAX]
        if few:
            steps.append(_firsts(queue, few, max(caps[k] for k in few)))
        if many:
            steps.append((Q["flow_key_ready"], None))
        # A limited queue's claim reads no unkeyed jobs while its last reads found none (DEEP_SKIPS)
        head_read = not limits.limited or self.deep_found or self.deep_skips >= DEEP_SKIPS
        if head0 is not None:
            head_read = True  # (read already)
        elif head_read:
            steps.append(self._head_step(queue, batch_size))
        per_key = [{"queue": queue, "key": k, "limit": caps[k]} for k in many]
        results = run_steps(cur, steps, per_key) if steps else []
        ready = _capped(results.pop(0), caps) if few else []
        ready += results.pop(0) if many else []
        ready += from_head

        # The queue's room as last committed (its `limit`): KeyGate counts it again under the
        # queue row's lock
        room = limits.limit - sum(running.values()) if limits.limit else None
        # Whether ready jobs of the keys at their limit were read: the head holds one, or is full
        # (more lie behind it); without a head (a queue that does not count), as if it did
        held_ready = bool(held) and (head0 is None or len(head0) >= unkeyed_limit(batch_size)
                                     or not set(held).isdisjoint(row[3] for row in head0))
        self.read = _Read(queue, batch_size, keys, caps, set(), running, room, list(held), complete, own,
                          held_ready)
        if not head_read:
            grant = self._grant(self.read, ready, [])
            if grant.ids:
                self.deep_skips += 1  # (DEEP_SKIPS) not read, so left behind: not drained
                grant.complete = False
                self.active_keys = grant.active_keys
                return grant
            [head] = run_steps(cur, [self._head_step(queue, batch_size)])  # nothing else to take
        elif head0 is not None:
            head = head0
        else:
            head = results.pop(0)
        unkeyed = [(job_id, prio, run_at) for job_id, prio, run_at, key in head if key is None]
        # The head is keyed jobs (of keys that may well be at their limit): the unkeyed ones
        # behind them are ready too (read below, where they may change what this claim takes)
        deep = len(head) == unkeyed_limit(batch_size) and len(unkeyed) < batch_size
        grant = self._grant(self.read, ready, unkeyed)
        found = bool(unkeyed)
        # (a limited queue's claim that read the head reads deep too: its skips were the head's)
        skip_deep = ((not limits.limited or head0 is not None) and bool(grant.ids) and not self.deep_found
                     and self.deep_skips < DEEP_SKIPS)
        if deep and self._head_decides(grant, batch_size, ready, unkeyed, head[-1]):
            # The batch's last job comes before the head's last in claim order, so no unkeyed
            # job behind the head could be in it: not read (a round trip, UNKEYED_DEPTH entries
            # and their rows), but left behind (this claim did not drain the queue)
            grant.complete = False
        elif deep and skip_deep:
            self.deep_skips += 1  # (DEEP_SKIPS) not read, so left behind: not drained
            grant.complete = False
        elif deep:
            deeper = self._deeper(cur, queue, batch_size, unkeyed)
            found = bool(deeper)
            self.deep_found, self.deep_skips = len(deeper) > len(unkeyed), 0
            grant = self._grant(self.read, ready, deeper)
        if limits.limited and not (head0 is not None and deep and skip_deep):
            self.deep_found, self.deep_skips = found, 0
        self.active_keys = grant.active_keys
        return grant

    @staticmethod
    def _head_step(queue: str, batch_size: int) -> tuple[str, dict[str, Any]]:
        return Q["flow_unkeyed_ready"], {"queue": queue, "limit": unkeyed_limit(batch_size)}

    def _deeper(self, cur, queue: str, batch_size: int, unkeyed: list[tuple]) -> list[tuple]:
        """`unkeyed` and the unkeyed jobs behind a head of keyed ones (flow_unkeyed_deep)."""
        cur.execute(Q["flow_unkeyed_deep"],
                    {"queue": queue, "depth": UNKEYED_DEPTH, "limit": unkeyed_limit(batch_size)})
        seen = {row[0] for row in unkeyed}
        return unkeyed + [row for row in cur.fetchall() if row[0] not in seen]

    def _head_decides(self, grant: Grant, batch_size: int, ready: list[tuple], unkeyed: list[tuple],
                      head_last: tuple) -> bool:
        """Whether the jobs a grant's batch takes all come before `head_last` (the last of the
        head: flow_unkeyed_ready's row) in claim order: then the jobs behind the head change
        nothing. Only for a claim in claim order (not fair, no per-key rate: the rates may
        leave granted jobs out, and the unkeyed ones behind would fill their places)."""
        if self.limits.fair or self.limits.rate_cap or len(grant.ids) < batch_size:
            return False
        rank = {job_id: (prio, run_at, job_id) for job_id, _, prio, run_at in ready}
        rank.update((job_id, (prio, run_at, job_id)) for job_id, prio, run_at in unkeyed)
        last_id, last_prio, last_run_at, _ = head_last
        return rank[grant.ids[batch_size - 1]] < (last_prio, last_run_at, last_id)

    def for_version(self, cur, version: int, seen: set[int], taken: list[str | None]) -> Grant:
        """In the claim's transaction, after its locking read met jobs too new for its consumer's
        code `version` (a rolling deploy) and left it room: the candidates read again past those
        jobs (flow_key_ready_for_version, flow_unkeyed_ready_for_version: one round trip), for
        the same keys, with the counts the claim's key locks read (KeyGate, which locks the keys
        of these too before any is kept), less the keys a peer held. `seen`:
        the ids that claim tried already; `taken`: the keys of the rows it locked (each uses a
        slot of its key and of the queue's limit). A key's first jobs, too new, hid the ones
        behind them from an old consumer; the version filter costs each entry's row, so only a
        claim that met such jobs reads it."""
        plan = self.read
        assert plan is not None, "for_version follows candidates() in the same claim"
        steps: list[tuple[str, dict[str, Any] | None]] = []
        if plan.keys:
            steps.append((Q["flow_key_ready_for_version"], None))
        steps.append((Q["flow_unkeyed_ready_for_version"],
                      {"queue": plan.queue, "limit": unkeyed_limit(plan.batch_size), "version": version}))
        per_key = [{"queue": plan.queue, "key": k, "limit": plan.caps[k], "version": version} for k in plan.keys]
        results = run_steps(cur, steps, per_key)
        ready = results.pop(0) if plan.keys else []
        unkeyed = results.pop(0)
        grant = self._grant(plan, ready, unkeyed, seen, taken)
        self.last = grant
        return grant

    def _wrapped(self, key: str | None) -> int:
        """A fair claim's turn: 0 for a key after the last claim's turn, 1 for one that had it."""
        return 0 if self.turn is None or (key or "") > self.turn else 1

    def _grant(self, plan: _Read, ready: list[tuple], unkeyed: list[tuple], seen: Collection[int] = (),
               taken: Collection[str | None] = ()) -> Grant:
        """The grant of a candidate read: the ids in the order to lock them, within each key's
        free slots and the queue's room, less the `taken` rows' (locked by this claim already);
        `seen` ids (tried already) are left out."""
        limits = self.limits
        complete, held, held_ready = plan.complete, list(plan.held), plan.held_ready
        by_key: dict[str | None, list[tuple]] = {}
        spare: dict[str | None, list[tuple]] = {}  # each key's jobs read past its free slots (spare_cap)
        read: dict[str | None, int] = {}  # rows read per key, the ones left out included
        for job_id, key, prio, run_at in ready:
            read[key] = read.get(key, 0) + 1
            if job_id not in seen:
                by_key.setdefault(key, []).append((prio, run_at, job_id))
        for key in plan.keys:
            rows = by_key.get(key, [])
            lim = limits.limit_for(key)
            if lim and key in plan.skipped:
                # Another consumer is claiming this key right now (KeyGate found its row locked):
                # its jobs are not ours to count this time, but may be left for us once that
                # claim is in (claim again).
                by_key.pop(key, None)
                complete = complete and not rows
                continue
            free = lim - plan.running.get(key, 0) if lim else len(rows)
            # A read stopped by the rate's N + 1: its last job is one the key's rate holds
            # (rates.hint), and so is every later one until the key's refill
            rate_bound = bool(limits.rate_cap) and plan.caps[key] == limits.rate_cap + 1
            if read.get(key, 0) >= plan.caps[key] and (not lim or free > plan.caps[key]) and not rate_bound:
                complete = False  # the read stopped at its cap, and more may run: claim again
            if lim:
                free -= sum(1 for k in taken if k == key)  # slots the claim's locked rows use
            if len(rows) > free:
                held.append(key)
                held_ready = True
            if lim and not limits.fair and not limits.rate_cap:
                # (spare_cap: the jobs past the ones it would take, locked only where those are gone)
                first = max(0, min(free, plan.batch_size))
                by_key[key], spare[key] = rows[:first], rows[first:]
                if len(rows) > first < free:
                    complete = False  # more jobs and more free slots than its batch takes
            else:
                by_key[key] = rows[:max(0, free)]
        if unkeyed:
            by_key[None] = [(prio, run_at, job_id) for job_id, prio, run_at in unkeyed if job_id not in seen]
        active_keys = sum(1 for rows in by_key.values() if rows)

        if limits.fair:
            # Round-robin: every key's first job, then every key's second, ... (claim order
            # inside each round, except that among jobs of one priority the keys after the last
            # claim's turn go first: by age alone, a claim smaller than its keys, one job say,
            # took the key with the oldest job every time, and a big key's backlog held every
            # other key back as a plain queue's would).
            ordered = sorted((rank, row[0], self._wrapped(key), *row[1:], key)
                             for key, rows in by_key.items() for rank, row in enumerate(rows))
            ids = [r[4] for r in ordered]
            first_round = [r[-1] for r in ordered[:plan.batch_size] if r[0] == 0]
            if first_round:
                self.turn = first_round[-1] or ""
        elif limits.limited and not limits.rate_cap:
            # A key's jobs together (within a priority), the keys by their first job's claim
            # order: a batch then takes whole keys' free slots, and consumers split the keys. In
            # plain claim order (jobs of 100 keys put in turn), a batch of 100 took one job of
            # every key: each claim locked all 100 keys' rows, two consumers' claims skipped each
            # other's (SKIP LOCKED) and came back empty, a third of them, and each consumer held
            # one slot of every key, so the next claims met again.
            # Key affinity (a counting queue's): within a priority, first the keys of the jobs
            # this claim's acks end, then keys with every slot free, then the rest
            counting = self.limits.counts

            def tier(key: str | None) -> int:
                if key is None or not counting:
                    return 1
                return 0 if key in plan.own else 1 if plan.running.get(key, 0) <= 0 else 2
            ordered = sorted((row[0], tier(key), min(rows) if key is not None else row, row[1], row[2])
                             for key, rows in by_key.items() for row in rows)
            ids = [r[4] for r in ordered]
        else:
            ids = [r[2] for r in sorted(row for rows in by_key.values() for row in rows)]
        # The spares after every key's first jobs: a window locks them only once those are gone
        spares = [r[2] for r in sorted(row for rows in spare.values() for row in rows)]
        if QUEUE_ROW in plan.skipped:
            return Grant([], False, held)  # another consumer is claiming this queue right now
        room = None if plan.room is None else plan.room - len(taken)
        queue_full = room is not None and len(ids) > room
        if queue_full:
            ids = ids[:max(0, room)]  # the rest is held back by the queue's limit
            spares = []
        # More ids than the batch takes leave some behind: queries.claim says so (of a rated queue's,
        # only those its rates let through count)
        keys = {row[-1]: key for key, rows in (*by_key.items(), *spare.items()) for row in rows}
        return Grant(ids + spares, complete, held, queue_full, keys, active_keys, spares=len(spares),
                     held_ready=held_ready)


@dataclass
class _Read:
    """What a claim's candidates() settled before reading the keys' jobs: the read again past
    jobs too new for its consumer (for_version) keeps it."""

    queue: str
    batch_size: int
    keys: list[str]
    caps: dict[str, int]  # each key's read limit
    skipped: set[str]  # key rows (and the queue's) another claim held when KeyGate asked for them
    running: dict[str | None, int]  # as last counted: committed, or under the keys' locks (KeyGate)
    room: int | None  # the queue's free slots under its `limit` (as `running` counts them)
    held: list[str]  # keys a limit held back before the read
    complete: bool  # every key with free slots seen
    own: dict[str, int] = field(default_factory=dict)  # the jobs per key the claim's own acks end (affinity)
    held_ready: bool = False  # ready jobs of the keys `held` names were read (Grant.held_ready)


def ready_keys(cur, queue: str, after: str, n: int) -> list[str]:
    """The queue's first `n` keys with ready jobs after `after`, in key order, by the claim's
    discovery (flow_next_key: one dive into ix_key a key, whatever its backlog), in one round
    trip: the console's flow page (notifyq web)."""
    [found] = run_steps(cur, _discovery(queue, after, n))
    return [k for k in found[0] if k is not None]


def _discovery(queue: str, after: str, n: int) -> list[tuple[str, dict[str, Any] | None]]:
    """`n` discovery dives after `after`, and the read of what they found (one row of n)."""
    steps: list[tuple[str, dict[str, Any] | None]] = [(Q["flow_discover_from"], {"after": after})]
    steps += [(_step(i), {"queue": queue}) for i in range(1, n + 1)]
    steps.append((Q["flow_discovered"].replace("@nq_k1, @nq_k2, @nq_k3, @nq_k4",
                                               ", ".join(f"@nq_k{i}" for i in range(1, n + 1))), {}))
    return steps


def _step(n: int) -> str:
    return Q["flow_next_key"].replace("@nq_kSTEP", f"@nq_k{n}").replace("@nq_kPREV", f"@nq_k{n - 1}")


def _firsts(queue: str, keys: list[str], n: int) -> tuple[str, dict[str, Any]]:
    """flow_key_firsts for `keys`, their first `n` ready jobs each (its derived part once per
    offset 0 .. n-1)."""
    sql = Q["flow_key_firsts"]
    head, _, rest = sql.partition("FROM (")
    part, _, tail = rest.rpartition(") f JOIN")
    parts = " UNION ALL ".join(part.replace("%(offset)s", f"%(offset{i})s") for i in range(n))
    params: dict[str, Any] = {"queue": queue, "keys": tuple(keys), **{f"offset{i}": i for i in range(n)}}
    return f"{head}FROM ({parts}) f JOIN{tail}", params


def _capped(rows: list[tuple], caps: dict[str, int]) -> list[tuple]:
    """flow_key_firsts' rows (id, key, key_prio, run_at), each key's first caps[key] in claim
    order (its read took as many of each key as the key with the largest cap)."""
    out: list[tuple] = []
    taken: dict[str, int] = {}
    for row in sorted(rows, key=lambda r: (r[2], r[3], r[0])):
        if taken.get(row[1], 0) < caps[row[1]]:
            taken[row[1]] = taken.get(row[1], 0) + 1
            out.append(row)
    return out


@functools.lru_cache(maxsize=256)
def _count_add(n: int) -> str:
    """flow_count_add with its WHEN part for `n` keys (kept per n: built for every counting claim)."""
    head, _, rest = Q["flow_count_add"].partition("CASE job_key ")
    when, _, tail = rest.partition(" END")
    whens = (when.replace("%(key)s", f"%(key{i})s").replace("%(n)s", f"%(n{i})s") for i in range(n))
    return head + "CASE job_key " + " ".join(whens) + " END" + tail


def _add_keys(n: int) -> str:
    head, _, row = Q["flow_add_keys"].partition("VALUES ")
    return head + "VALUES " + ", ".join(row.replace("%(key)s", f"%(key{i})s") for i in range(n))


def run_steps(cur, steps: list[tuple[str, dict[str, Any] | None]],
             union_params: list[dict[str, Any]] | None = None, counts: list[int] | None = None) -> list[list[tuple]]:
    """Run `steps` as one multi-statement query (one round trip) and return the rows of each
    statement that returns rows, in order (and every statement's row count into `counts`). A
    step whose params are None is a UNION ALL of its statement (flow_key_ready or
    flow_key_ready_for_version), bound part by part with union_params."""
    texts = []
    for sql, params in steps:
        if params is None:
            texts.append(" UNION ALL ".join(cur.mogrify(sql, p) for p in union_params or []))
        else:
            texts.append(cur.mogrify(sql, params) if params else sql)
    cur.execute(";\n".join(texts))
    out = []
    while True:
        if counts is not None:
            counts.append(cur.rowcount)
        if cur.description is not None:
            out.append(list(cur.fetchall()))
        if not cur.nextset():
            break
    return out
