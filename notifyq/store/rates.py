"""Rate limits (`rate`, `rate_per_key`): at most N job starts in any window of one period, per
queue and per key, across every consumer process and host; and consume_rate, which spends the
same budgets for work done outside jobs.

The scheme is a sliding log. Each budget (the queue's own, each key's) keeps the times of its
last N starts, one row per slot (nq_rate). A start takes a slot whose time lies a whole period
back (the oldest, in effect): the N starts before it and this one then span more than a period,
so no window of one period ever holds N+1. Not a token bucket: one of capacity N refills while it
is spent, and a window that straddles a refill sees up to 2N starts. Not GCRA with burst 1,
which keeps the bound but spaces every start a period/N apart, where users asking for "100 a
minute" expect a burst of 100 to go at once. The log costs N rows per budget (N <= 10,000) and a
claim of a rated queue reads the rows of the budgets it could spend from.

The log lives in the database and is written in the claim's own transaction, under the lock of
the budgets' rows (a claimer of the same budget waits for that COMMIT): a start counts only if
its claim commits. The claim's jobs start only once that COMMIT's reply is read (after_commit):
a COMMIT that failed spent nothing and starts nothing; one whose reply was lost may have spent
starts that never happen, which holds starts back until those slots are a period old, never
longer (its jobs come back when their lease ends). A claim run again after an earlier try
committed (queries.claim's rerun, which hands that try's jobs back unstarted) counts the slots
it spent under its token as free.

Every time is the server's, read once the budgets' rows are locked (SYSDATE(6) in the locking
read: NOW(6) would be the statement's start, before any wait for a peer's COMMIT), one clock for
every host. A start's time is its claim's: a batch's later jobs begin when the jobs before them
are done, so a rate that must hold for handler starts (an API called as each job begins) wants a
small batch, or consume_rate where the call is made. The log is exact for the times it holds,
so a claim that comes late to a refill (the watcher's wake, the claim's round trips: a few ms,
more on a loaded machine) loses that much of the period's room: the chain of starts from a slot
drifts by it, never ahead.

Held jobs are woken at the refill, without polling the jobs table: a claim that held any back
writes when the first of its budgets frees a start (nq_rate_hold), and the watcher's wait
(watch_bell, poll_signal) ends then, as it ends for a scheduled job that falls due.

Before it locks any job, a claim reads the log as committed (hint, no lock) and leaves out the
candidates whose budgets have no start free: its locking windows are filled by keys with room,
so a key whose budget is spent never holds another back (its backlog, first in claim order,
filled every window, and every other key waited for its refill). A per-key rate's candidates
are read key by key (store/flow.py, at most N + 1 of a key), so one key's backlog never fills
the read either. The hint decides nothing: admit does, under the budgets' locks.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from dataclasses import dataclass, field
from typing import Any

from notifyq import errors
from notifyq.config import QueueConfig, values
from notifyq.config.values import Rate
from notifyq.store.db import Session
from notifyq.store.driver import Ids, cut_short
from notifyq.store.sql import QUERIES as Q

QUEUE_BUDGET = ""  # the queue's own budget's rate_key: a job's key is never empty
NEVER = dt.datetime(1970, 1, 1)  # a slot never spent


@dataclass(frozen=True)
class Rates:
    """A queue's rate limits, as a claim and consume_rate spend them."""

    queue: Rate | None
    per_key: Rate | None

    @classmethod
    def of(cls, qc: QueueConfig) -> "Rates | None":
        queue, per_key = qc.rates
        return None if queue is None and per_key is None else cls(queue, per_key)

    def budgets(self, key: str | None) -> list[str]:
        """The budgets a start of a job with this key spends from."""
        out = [QUEUE_BUDGET] if self.queue is not None else []
        if self.per_key is not None and key is not None:
            out.append(key)
        return out

    def rate(self, budget: str) -> Rate:
        rate = self.queue if budget == QUEUE_BUDGET else self.per_key
        assert rate is not None
        return rate


@dataclass
class _Budget:
    """One budget's log, locked: its slots' times, and which of them may start now."""

    rate: Rate
    times: dict[int, dt.datetime] = field(default_factory=dict)  # slot -> its last start
    free: list[int] = field(default_factory=list)  # slots a start may take now, oldest first
    spent: list[int] = field(default_factory=list)

    def take(self) -> int:
        slot = self.free.pop(0)
        self.spent.append(slot)
        return slot

    def frees_at(self, now: dt.datetime, n: int = 1) -> dt.datetime:
        """When the n-th start from now on is free, once what is spent is written."""
        busy = sorted([t for s, t in self.times.items() if s not in self.free and s not in self.spent]
                      + [now] * len(self.spent))
        period = dt.timedelta(seconds=self.rate.period_s)
        return busy[n - len(self.free) - 1] + period if n > len(self.free) else now


@dataclass
class Hint:
    """A claim's candidates as the committed rate log lets them through (hint), before it locks any
    job: the ids it may lock, in claim order, and what the log held back."""

    ids: list[int]
    keys: dict[int, str | None]  # every candidate's key (what rate_keys would read)
    hold: tuple | None  # the queue's nq_rate_hold row (rate_hold), if read
    wake_at: dt.datetime | None = None  # the first start free for a candidate held back
    now: dt.datetime | None = None  # the server's time of the read

    @property
    def held(self) -> bool:
        """The log held a candidate back."""
        return self.wake_at is not None


def hint(cur, queue: str, token: int, rates: Rates | None, ordered: list[int],
         keys: dict[int, str | None] | None = None) -> Hint | None:
    """Of a claim's candidates (claim order), those the budgets have a start for, by a plain read
    of the log (rate_slots_peek), before the claim locks any job. The locking read then takes
    its windows among these only: a key whose budget is spent costs no place in them, and the
    candidates of keys with room fill the batch (a backlog of one spent key held every other
    key back until its refill). Only a hint: admit decides, on the budgets it locks after the
    rows (a peer may spend what the hint saw free; then admit holds the row). The held
    candidates' refill is admit's hold (wake_at). keys: the candidates' keys when the read that
    found them returned them (store/flow.py); else read here with the hold, one round trip more."""
    if rates is None or not ordered:
        return None
    params = {"queue": queue, "ids": Ids(ordered)}
    if keys is None and rates.per_key is not None:
        cur.execute(";\n".join(cur.mogrify(Q[n], params) for n in ("rate_hold", "rate_keys")))
        hold = cur.fetchone()
        cur.nextset()
        keys = {int(i): k for i, k in cur.fetchall()}
        while cur.nextset():
            pass
        peek: list[str] = []
    else:
        peek = [cur.mogrify(Q["rate_hold"], params)]
        hold = None
    keys = keys or {}
    wanted = {b for job_id in ordered for b in rates.budgets(keys.get(job_id))}
    if not wanted:  # only jobs without a key, under rate_per_key alone: nothing to hold
        if peek:
            cur.execute(peek[0])
            hold = cur.fetchone()
            while cur.nextset():
                pass
        return Hint(list(ordered), keys, hold)
    peek += [cur.mogrify(Q["rate_slots_peek"], _slot_params(queue, rates, wanted)), Q["rate_now"]]
    cur.execute(";\n".join(peek))  # one round trip: the hold (unless read with the keys) and the log
    if len(peek) == 3:
        hold = cur.fetchone()
        cur.nextset()
    rows = cur.fetchall()
    cur.nextset()
    clock = cur.fetchone()
    while cur.nextset():
        pass
    if clock is None:  # a KILL QUERY's OK reply without the row: read it all again
        raise cut_short("rate hint, no server time")
    now = clock[0]
    ids, wake_at = _take(rates, _budgets(rates, wanted, token, rows, now), now, ordered, keys)
    return Hint(ids, keys, hold, wake_at, now)


@dataclass
class Admitted:
    """What a claim may start of the rows it locked (admit)."""

    rows: list[tuple]
    drained: bool
    spent: bool  # the claim spends from a budget: its jobs start only once its COMMIT is read
    held_s: float | None = None  # jobs were held back: seconds until the first budget frees a start


def admit(cur, queue: str, token: int, rates: Rates | None, locked: list[tuple], drained: bool,
          hinted: Hint | None = None) -> Admitted:
    """Of the rows a claim locked (claim order), those the rates let start now, their starts
    written in the claim's transaction. A row held back stays ready, not charged; the claim then
    counts as drained (what is left waits for a refill, not for the next claim) and writes when
    the queue's watcher is to wake for it (nq_rate_hold). hinted: what hint() read before the
    rows were locked (their keys, the hold, and when the candidates it held back get a start)."""
    if rates is None:
        return Admitted(locked, drained, False)
    early = hinted.wake_at if hinted is not None else None
    if not locked:
        if early is not None:  # held by the hint alone: the watcher wakes at their refill
            cur.execute(Q["rate_hold_set"], {"queue": queue, "wake_at": early})
            return Admitted(locked, drained, False, max(0.0, (early - hinted.now).total_seconds()))
        # a hold whose time came is over: the watcher must not wake for it again
        cur.execute(Q["rate_hold_clear"], {"queue": queue})
        return Admitted(locked, drained, False)
    ids = [r[0] for r in locked]
    if hinted is not None and all(i in hinted.keys or rates.per_key is None for i in ids):
        hold, keys = hinted.hold, hinted.keys
    else:
        names = ("rate_hold",) + ("rate_keys",) * (rates.per_key is not None)
        cur.execute(";\n".join(cur.mogrify(Q[n], {"queue": queue, "ids": Ids(ids)}) for n in names))  # one round trip
        hold = cur.fetchone()
        keys = {}
        if rates.per_key is not None:
            cur.nextset()
            keys = {int(i): k for i, k in cur.fetchall()}
        while cur.nextset():
            pass
    wanted = {b for job_id in ids for b in rates.budgets(keys.get(job_id))}
    budgets, now = _lock(cur, queue, token, rates, wanted)
    if now is None:  # no budget to spend from (only jobs without a key, under rate_per_key)
        if early is not None:
            cur.execute(Q["rate_hold_set"], {"queue": queue, "wake_at": early})
        return Admitted(locked, drained, False)
    ids_taken, row_wake = _take(rates, budgets, now, ids, keys)
    starting = set(ids_taken)
    taken = [row for row in locked if row[0] in starting]
    wake_at = early
    if row_wake is not None:
        wake_at = row_wake if early is None else min(early, row_wake)
        drained = True  # a peer spent what the hint saw free: the rest waits for the refill
    statements = _spends(queue, token, now, budgets)
    if wake_at is not None:
        statements.append((Q["rate_hold_set"], {"queue": queue, "wake_at": wake_at}))
    elif hold is not None and hold[0] is not None and hold[0] <= now:
        statements.append((Q["rate_hold_clear"], {"queue": queue}))
    _write(cur, statements, sum(bool(b.spent) for b in budgets.values()))
    return Admitted(taken, drained, any(b.spent for b in budgets.values()),
                    None if wake_at is None else max(0.0, (wake_at - now).total_seconds()))


def after_commit(session: Session, commit: Any, jobs: list) -> list:
    """A rated claim's jobs, once its COMMIT is read: none if it failed (nothing of its spend is
    to be counted on, so nothing of it starts; a COMMIT whose reply was lost hands its jobs
    back at their lease's end, as any lost claim does)."""
    if commit is None:
        return jobs
    session.pipeline.read_reply()
    return [] if commit.failed else jobs


def consume_args(n: Any, key: Any, wait: Any) -> tuple[int, str | None, float | None]:
    """consume_rate's arguments checked: one line naming the bad one."""
    n = values.number("consume_rate: n", n, lo=1, hi=values.RATE_MAX_COUNT, integer=True)
    if key is not None:
        key = values.job_key("consume_rate: key", key)
    if wait is not None:
        wait = values.seconds("consume_rate: wait", wait, positive=False)
    return n, key, wait


def consume(session: Session, queue: str, rates: Rates | None, key: str | None, n: int,
            wait_s: float | None, stop: Any = None) -> bool:
    """Spend n starts from the queue's budget (and the key's, with rate_per_key), as n jobs of
    that key starting would: True once spent; False if the rates did not allow it within
    wait_s (None: wait as long as it takes; 0: do not wait), nothing spent. A timed wait for
    the refill, not a poll: each try that finds the budget short sleeps until the log says it
    has room (or a peer spent it first: then again). stop: a threading.Event that ends the wait."""
    if rates is None or not rates.budgets(key):
        return True
    for b in rates.budgets(key):
        if n > rates.rate(b).count:
            raise errors.InputError(f"consume_rate: n={n} is more than the rate allows in one period "
                                    f"({rates.rate(b).count}): it could never be granted")
    token = int.from_bytes(os.urandom(8), "big") >> 1  # a retried try finds its own spend free
    deadline = None if wait_s is None else time.monotonic() + wait_s

    def body(cur) -> float | None:
        budgets, now = _lock(cur, queue, token, rates, set(rates.budgets(key)))
        if all(len(b.free) >= n for b in budgets.values()):
            for b in budgets.values():
                for _ in range(n):
                    b.take()
            _write(cur, _spends(queue, token, now, budgets), len(budgets))
            return None
        return max((b.frees_at(now, n) - now).total_seconds() for b in budgets.values())

    while True:
        short_s = session.run(body, what=f"consume rate {queue}")
        if short_s is None:
            return True
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        pause = max(0.001, short_s) if left is None else min(max(0.001, short_s), left)
        if stop is not None:
            if stop.wait(pause):
                return False
        else:
            time.sleep(pause)  # the refill's time, read from the log: a timed wait, not a poll


@dataclass(frozen=True)
class Usage:
    """One budget as its log stands (usage): starts in the last period, of how many, and when
    the next start is free (None: one is free now)."""

    used: int
    count: int
    period_s: float
    frees_at: dt.datetime | None


NO_CLAIM = -1  # no claim's token: usage counts every spend in the log (consume_rate's 0 too)


def usage(session: Session, queue: str, rates: Rates, keys: list[str]) -> dict[str, Usage]:
    """The queue's own budget and those of `keys` (rate_per_key) as committed, by the plain read
    a claim's hint makes (rate_slots_peek): N rows a budget at most. Budget '' is the queue's."""
    wanted = set(rates.budgets(None)) | (set(keys) if rates.per_key is not None else set())
    if not wanted:
        return {}

    def body(cur) -> tuple[list[tuple], dt.datetime]:
        cur.execute(Q["rate_slots_peek"], _slot_params(queue, rates, wanted))
        rows = list(cur.fetchall())
        cur.execute(Q["rate_now"])
        return rows, cur.fetchone()[0]

    rows, now = session.run(body, what="rate usage")
    out = {}
    for name, b in _budgets(rates, wanted, NO_CLAIM, rows, now).items():
        out[name] = Usage(b.rate.count - len(b.free), b.rate.count, b.rate.period_s,
                          None if b.free else b.frees_at(now))
    return out


def _take(rates: Rates, budgets: dict[str, _Budget], now: dt.datetime, ids: list[int],
          keys: dict[int, str | None]) -> tuple[list[int], dt.datetime | None]:
    """Of `ids` (claim order), those whose budgets all have a start free, each taking its
    starts (a held job never lets a later one of its budget go first: claim order), and the
    earliest time a held one's budgets free a start (None: none was held)."""
    taken: list[int] = []
    wake_at: dt.datetime | None = None
    for job_id in ids:
        names_of = rates.budgets(keys.get(job_id))
        empty = [budgets[b] for b in names_of if not budgets[b].free]
        if empty:
            row_wake = max(b.frees_at(now) for b in empty)
            wake_at = row_wake if wake_at is None else min(wake_at, row_wake)
            continue
        for b in names_of:
            budgets[b].take()
        taken.append(job_id)
    return taken, wake_at


def _slot_params(queue: str, rates: Rates, wanted: set[str]) -> dict[str, Any]:
    return {"queue": queue, "keys": tuple(sorted(wanted)),
            "queue_count": rates.queue.count if rates.queue is not None else 0,
            "key_count": rates.per_key.count if rates.per_key is not None else 0}


def _budgets(rates: Rates, wanted: set[str], token: int, rows: list[tuple], now: dt.datetime) -> dict[str, _Budget]:
    """The wanted budgets as the log's rows (rate_slots_lock's columns) say at `now`: a slot is
    free when its last start lies a whole period back, or this claim's own earlier try spent it;
    a slot without a row (a budget's first use, or N raised) was never spent."""
    budgets = {b: _Budget(rates.rate(b)) for b in wanted}
    for budget, slot, started_at, spent_by, _ in rows:
        b = budgets[budget]
        b.times[int(slot)] = started_at
        if started_at <= now - dt.timedelta(seconds=b.rate.period_s) or spent_by == token:
            b.free.append(int(slot))
    for b in budgets.values():
        for slot in range(b.rate.count):
            if slot not in b.times:
                b.times[slot] = NEVER
                b.free.append(slot)
        b.free.sort(key=lambda s, b=b: (b.times[s], s))
    return budgets


def _lock(cur, queue: str, token: int, rates: Rates,
          wanted: set[str]) -> tuple[dict[str, _Budget], dt.datetime | None]:
    """The wanted budgets' logs, locked until COMMIT (in one order for every claimer), a budget's
    missing slots (first use, or N raised) made first; and the server's time once they are
    locked (None: nothing wanted)."""
    if not wanted:
        return {}, None
    params = _slot_params(queue, rates, wanted)
    for made in (False, True):
        cur.execute(Q["rate_slots_lock"], params)
        rows = cur.fetchall()
        missing = len(rows) < sum(rates.rate(b).count for b in wanted)
        if missing:
            assert not made, "rate slots made and not found"
            have = {(b, int(s)) for b, s, *_ in rows}
            cur.executemany(Q["rate_slot_add"], [{"queue": queue, "key": b, "slot": s} for b in sorted(wanted)
                                                 for s in range(rates.rate(b).count) if (b, s) not in have])
            continue
        now = max(row[4] for row in rows)  # SYSDATE per row: the last is the latest
        return _budgets(rates, wanted, token, rows, now), now
    raise AssertionError("unreachable")


def _spends(queue: str, token: int, now: dt.datetime, budgets: dict[str, _Budget]) -> list[tuple[str, dict[str, Any]]]:
    return [(Q["rate_spend"], {"queue": queue, "key": b, "slots": Ids(budget.spent), "now": now, "token": token})
            for b, budget in sorted(budgets.items()) if budget.spent]


def _write(cur, statements: list[tuple[str, dict[str, Any]]], spends: int) -> None:
    """The spends (first) and the hold, in one round trip; a spend a KILL QUERY cut short (an OK
    reply, no row changed) fails the transaction, which runs again, rather than start jobs whose
    starts were not written."""
    if not statements:
        return
    cur.execute(";\n".join(cur.mogrify(sql, params) for sql, params in statements))
    counts = [cur.rowcount]
    while cur.nextset():
        counts.append(cur.rowcount)
    if any(n != len(params["slots"]) for (_, params), n in zip(statements[:spends], counts)):
        raise cut_short(f"rate spend, replies {counts}")
