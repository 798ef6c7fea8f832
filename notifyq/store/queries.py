"""The hot path's statements: claim, outcomes, wake-up locks and bells, and taking a dead
consumer's jobs back. The job INSERTs are in inserts.py, consumer registration, heartbeat and
who is dead in liveness.py, the operators' statements (status, metrics, `notifyq jobs`,
periodic ticks) in admin_queries.py: with schema.py the only users of sql.QUERIES.

Functions that take a cursor run inside a transaction someone else owns (the caller's own
connection for transactional enqueue, or a body passed to Session.run). Functions that take a
Session own their transaction and retry it whole.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import MySQLdb

from notifyq.jobs import Job, claimed
from notifyq.store import rates as rating
from notifyq.store.db import Session
from notifyq.store.driver import Ids, IntList, cut_short, error_code
from notifyq.store.flow import COUNT_TRUST_S, MIN_CANDIDATES, QUEUE_ROW, FlowClaims, FlowLimits, UnnamedKeys
from notifyq.store.key_gate import KeyGate
from notifyq.store.pipeline import Pending
from notifyq.store import workflows
from notifyq.store import signal
from notifyq.store.signal import SIGNAL_SLOTS, bump_signal  # noqa: F401 - re-exported: inserts, admin
from notifyq.store.sql import QUERIES as Q

log = logging.getLogger("notifyq.store")

# The token bit of a counting claim (FlowLimits.counts): its jobs were added to their keys'
# counters (nq_flow_key.running), so their ack, failure or give-back takes them off again
# (flow_count_release); a job of any other claim never is. Older versions make tokens of 63 bits.
COUNTED_BIT = 1 << 63


def counted_token(token: int) -> bool:
    """Whether `token` is a counting claim's (COUNTED_BIT)."""
    return token >= COUNTED_BIT


def forget_counters(session: Session, queue: str) -> None:
    """Give up a counting queue's counters (flow_count_forget): every one is recounted by the
    next claim that locks its key. Sent once by a worker before its first claim of the queue."""
    def body(cur) -> None:
        cur.execute(Q["flow_count_forget_keys"], {"queue": queue})
        keys = tuple(r[0] for r in cur.fetchall())
        if keys:
            cur.execute(Q["flow_count_forget_set"], {"queue": queue, "keys": keys})

    session.run(body, what=f"forget counters {queue}")


def forget_counters_of_jobs(cur, ids: list[int]) -> None:
    """The counters of the keys of `ids` set unknown, on the caller's cursor, for running jobs
    ended without their consumer (a reaper's take-back, an operator's purge): the next claim of
    each key recounts it under its lock, instead of trusting a counter that still counts them,
    and holding the key's next job back with nothing to wake a watcher when the trust runs out
    (flow_count_forget_taken). A key row a claim holds right now is skipped: its counter stays
    high, trusted at most COUNT_TRUST_S more."""
    cur.execute(Q["flow_count_forget_taken"], {"ids": Ids(sorted(ids))})
    per_queue: dict[str, list[str]] = {}
    for queue, key in cur.fetchall():
        per_queue.setdefault(queue, []).append(key)
    for queue, keys in per_queue.items():
        cur.execute(Q["flow_count_forget_set"], {"queue": queue, "keys": tuple(keys)})


OVERFETCH = 3  # candidates read per claim, as a multiple of the batch size (at least MIN_CANDIDATES)
PROMOTE_MAX = 1000  # due jobs made ready per claim that finds any (a backlog takes a few claims)
# nq_job.last_error is a TEXT in utf8mb4: 65,535 bytes, not characters. A longer value is an
# error (1406, or 1366 where the cut splits a character) under strict sql_mode.
ERROR_MAX_BYTES = 65535
# An attempt's record (nq_attempt) keeps less: its error and traceback cut to these, and a job
# keeps its last ATTEMPTS_KEPT records, trimmed with each failure and snooze (attempts_prune).
ATTEMPT_ERROR_BYTES = 4000
ATTEMPT_TRACEBACK_BYTES = 16000
ATTEMPTS_KEPT = 10
# A batch's attempt records take their times by the ids' offsets (attempt_acked_dense) while its
# ids span at most this many times its size: the lists then stay within that many entries.
DENSE_SPAN = 3
HOST = os.uname().nodename[:255]  # where an attempt ran, in its record (gethostname without socket)


def microseconds(seconds: float) -> int:
    return max(0, int(seconds * 1_000_000))


def _signal_read(total: Any, queue: str) -> int:
    """A claim's read of its queue's signal total (never NULL: COALESCE). NULL is a KILL QUERY's
    cut that MariaDB answered without an error: the claim is rolled back and run again, as after
    the KILL's own 1317 (an outside storm of KILL QUERY once ended the worker, and its process,
    with a TypeError here)."""
    if total is None:
        raise cut_short(f"claim {queue}: its signal read came back NULL")
    return int(total)


def claim_clock(server_now: dt.datetime | None) -> tuple[dt.datetime, float] | None:
    """A claim's clock (Claim.clock): the server's time its read replied with, and the monotonic
    time now, as its reply has just come in."""
    return None if server_now is None else (server_now, time.monotonic())


def server_time(clock: tuple[Any, float] | None, t: float | None) -> dt.datetime | None:
    """The monotonic time `t` on the server's clock, by a claim's clock (Claim.clock: the
    server's time and the monotonic time it was read at); None without either (the statement
    then places it by its own time)."""
    if clock is None or t is None:
        return None
    return clock[0] + dt.timedelta(microseconds=int((t - clock[1]) * 1_000_000))


# ---------------------------------------------------------------- enqueue (caller's cursor)

def ensure_queue(cur, queue: str) -> bool:
    """True when the queue's row is new: nothing had used this name before."""
    cur.execute(Q["ensure_queue"], {"queue": queue})
    return cur.rowcount == 1


def ensure_queue_unlocked(cur, queue: str) -> None:
    """ensure_queue for a transaction that goes on to wait for job rows (a workflow's put: its
    release of parents that ended already): the INSERT IGNORE only when the row is missing (its
    first use), since on a row that is there it takes a share lock until the COMMIT. A watcher's
    claim sends its queue row's update (mark_watched) without waiting for it, after its jobs may
    have started: a lock on that row held by a transaction that waits for a job row closes a
    cycle that deadlock detection may break by rolling the claim back, and its jobs then ran
    twice. Whoever else locks the queue row holds it briefly and waits for no job row."""
    cur.execute(Q["queue_known"], {"queue": queue})
    if cur.fetchone() is None:
        ensure_queue(cur, queue)


# ---------------------------------------------------------------- claim

@dataclass
class Claim:
    """What one claim took: its jobs, its fencing token, and whether it left the queue empty."""

    jobs: list[Job]
    token: int
    drained: bool  # every ready job seen was taken (by us or a peer): nothing left behind
    paused: bool
    # The claim's COMMIT, sent and not yet read when claim() returns (Pipeline.send_commit): its
    # jobs may start at once. It is read before the work session's next statement; if it
    # failed, the claim is lost: start no more of its jobs (their acks would be fenced anyway).
    commit: Pending | None = None
    held_s: float | None = None  # a rate held jobs back: seconds until it frees a start
    # The claim's clock: the server's time (UTC) in its first read's reply, and this process's
    # monotonic time when that reply came. Each job's Run carries it: its attempt's record places
    # the monotonic start and end on the server's clock from it (server time = at + (t - mono)),
    # as times that do not depend on when the record's statement runs (Acks, Failure).
    clock: tuple[Any, float] | None = None
    # A counting queue's claim whose keys' counters held ready jobs back (whether it drained or
    # not): the seconds until those counters' trust ends (COUNT_TRUST_S at most). A counter left
    # high (a take-back that found the key's row locked, a row deleted outside notifyq) frees its
    # slot only when a claim recounts it, and no wake-up may come: the idle consumer claims again
    # then (wakeup/waiter.py, Waiter.recount_after). None: nothing held, or not counted.
    recount_s: float | None = None
    # A limited claim that carried acks (they free slots): whether a consumer held the queue's
    # watch lock when its mark ran (Acks.watch: read with the mark); None: not read. False: the
    # slot wake after it has nobody to wake, and its look is not sent (acking.PendingAcks.claim)
    watched: bool | None = None


@dataclass
class Acks:
    """A finished batch's successes, acked in the next claim's COMMIT (claim(acks=...)): a
    busy consumer then spends one fsync'd COMMIT per batch instead of two. The ack is the
    last batch's, fenced by its token, so it is as idempotent as ack() is. Each job's attempt
    record (attempt_acked, or attempt_acked_dense) goes first in the same query, under the
    same fence."""
    ids: list[int]
    token: int
    keep: bool  # keep done jobs (ack_keep) instead of deleting them
    started: list[float] | None = None  # each job's start and end, monotonic (its attempt record)
    ended: list[float] | None = None
    results: list[str | None] | None = None  # each job's result (JSON text) when the queue keeps them
    tasks: list[str] | None = None  # each job's task, for the consumer's per-task figures (never sent)
    # A limited queue's name: the ack frees slots, so it bumps the queue's signal in its own
    # transaction (last), and the watcher wakes for the jobs a limit held back (store/flow.py)
    wake: str | None = None
    # The queues of the workflow children this ack released (a hint: its COMMIT may still fail)
    released: tuple[str, ...] = ()
    # Which of `ids` landed, when fewer than all did by this ack's own count (acked_in_all reads
    # them); None: all of them, or not known yet
    landed: set[int] | None = None
    clock: tuple[Any, float] | None = None  # their claim's (Claim.clock): places started and ended
    # each id's key (a limited queue's: the carrying claim's key affinity)
    keys: list[str | None] | None = None
    # Netted (a lean claim's, FlowClaims.freed): its counters' release is not sent; the claim
    # that carries it takes its jobs off their keys' counters itself, client-side by `keys`, in
    # the one net change its mark sends, and only when its DELETE removed every job it named
    net: bool = False
    # The queue's watch lock (a limited queue's, when its instant wake looks for a watcher): the
    # claim that carries these acks reads its holder with its mark (Claim.watched)
    watch: str | None = None

    @property
    def releases(self) -> bool:
        """Whether statements() sends the counters' release (flow_count_release)."""
        return counted_token(self.token) and not self.net

    COUNTED = 1  # the index of the ack's own statement (its row count) in statements()

    def statements(self, bump: bool = True) -> list[tuple[str, dict[str, Any]]]:
        """The ack's statements; bump=False: without the signal's bump (a limited claim sends
        the rest first and the bump with its mark: bump())."""
        ids = Ids(self.ids)
        # Each time as microseconds from the claim's clock (at, mono): absolute once placed, the
        # same however late the statement runs, and on every send of it. Without a clock, from
        # now, placed on the statement's own time (at None: NOW(6))
        at, mono = self.clock if self.clock is not None else (None, time.monotonic())
        started = self.started or [mono] * len(self.ids)
        ended = self.ended or [mono] * len(self.ids)
        started_offsets = [int((t - mono) * 1_000_000) for t in started]
        ended_offsets = [int((t - mono) * 1_000_000) for t in ended]
        out = [self._record(ids, at, started_offsets, ended_offsets),
               (Q["ack_keep" if self.keep else "ack_delete"], {"ids": ids, "token": self.token})]
        if self.releases:
            # A counting claim's jobs: their keys' counters, first (before the rows leave
            # status 2), under the ack's fence, counted on the server's rows
            out.insert(0, (Q["flow_count_release"], {"ids": ids, "token": self.token}))
        for job_id, result in zip(self.ids, self.results or ()):
            if result is not None:
                out.append((Q["attempt_result"], {"id": job_id, "token": self.token, "result": result}))
        # Then, in the same transaction: the first step of the release of these jobs' children
        # (workflows), fenced by the records above; verify() runs the rest when it marked any.
        out += workflows.release_statements(ids, self.token)
        if self.wake is not None and bump:  # last: a limited queue's freed slots wake its watcher
            out += self.bump()
        return out

    def bump(self) -> list[tuple[str, dict[str, Any]]]:
        """A limited queue's signal bump for the slots these acks free (none for another queue)."""
        # On a slot nobody holds: a peer's claim stopped inside its transaction holds the slot
        # its own acks bumped, and this claim waited on it for the lock wait timeout
        return [signal.bump(self.wake, len(self.ids))] if self.wake is not None else []

    @property
    def counted(self) -> int:
        """The index of the ack's own statement (after the counters' release, if any)."""
        return self.COUNTED + self.releases

    def verified(self) -> int:
        """How many of statements()' first statements verify() checks (the release's are not)."""
        return self.counted + 1 + sum(r is not None for r in self.results or ())

    def _record(self, ids: Ids, at: Any, started: list[int], ended: list[int]) -> tuple[str, dict[str, Any]]:
        """The attempt records' statement (times: microseconds from `at`): by the ids' offsets
        when they lie close together (attempt_acked_dense), else by their places in the id list
        (attempt_acked)."""
        record = {"ids": ids, "token": self.token, "host": HOST, "at": at}
        base = min(self.ids, default=0) - 1
        span = max(self.ids, default=0) - base
        if not self.ids or span > DENSE_SPAN * len(self.ids):
            return Q["attempt_acked"], {**record, "id_list": IntList(self.ids),
                                        "started_offsets": IntList(started), "ended_offsets": IntList(ended)}
        by_started, by_ended = [0] * span, [0] * span
        for job_id, s, e in zip(self.ids, started, ended):
            by_started[job_id - base - 1] = s
            by_ended[job_id - base - 1] = e
        return Q["attempt_acked_dense"], {**record, "base": base, "started_offsets": IntList(by_started),
                                          "ended_offsets": IntList(by_ended)}

    def verify(self, cur, counts: list[int], bumped: bool = True) -> None:
        """Before the COMMIT: raise cut_short unless the statements' row counts (statements()'
        order) say each did its part. A KILL QUERY can end one with an OK reply and no row
        changed: attempt records committed without the ack (the job stays claimed and runs
        again, its attempt recorded done), or an ack without its records. The two are under one
        fence, so they count the same rows; fewer than asked is a claim taken back only if none
        of the rest is still ours (both cut short count the same too)."""
        if self.wake is not None and bumped:
            counts = counts[:-1]  # the signal's bump, last
        # The release's first step (workflows), when statements() sent it
        marked = counts[self.verified()] if len(counts) > self.verified() else 0
        counts = counts[:self.verified()]
        if self.releases:
            counts = counts[1:]  # (the counters' release: not checked)
        recorded, acked, stored = counts[0], counts[self.COUNTED], counts[self.COUNTED + 1:]
        if recorded != acked or any(n > 1 for n in stored) or (acked == len(self.ids) and 0 in stored):
            raise cut_short(f"ack, replies {counts}")
        if acked < len(self.ids) and still_claimed(cur, self.ids, self.token):
            raise cut_short(f"ack, replies {counts}, and some of its jobs still claimed")
        if marked:  # children of these jobs: the rest of their release, before the COMMIT
            self.released = tuple(workflows.release_rest(cur, self.ids, marked))


def still_claimed(cur, ids: list[int], token: int) -> list[int]:
    """Which of these jobs the claim still holds (in the caller's transaction)."""
    cur.execute(Q["claims_owned"], {"ids": Ids(ids), "token": token})
    return [r[0] for r in cur.fetchall()]


def claim(session: Session, queue: str, owner: str, batch_size: int, lease_s: float,
          as_watcher: bool = False, acks: Acks | None = None, rates: rating.Rates | None = None,
          version: int = 0, flow: FlowClaims | None = None) -> Claim:
    """Claim up to batch_size jobs: candidates -> lock by PK with SKIP LOCKED -> mark -> commit.

    Two round trips and a send: the candidate read (claim_ready, with due_any and queue_paused
    in its round trip; a claim that finds due jobs promotes them and reads them with the ready
    ones, _with_due); the locking read (one per window, usually one); then the mark with its
    COMMIT in one multi-statement query that is not waited for
    (Pipeline.send_commit): the rows are locked, so the jobs may start while the server writes
    the mark and the COMMIT's fsync runs. If either fails after all, the claim is lost as a
    crash loses it: the rows unlock, and the claim token fences this claim's acks.
    as_watcher: the watcher's claim. Where no flow limits or rates choose its candidates, it
    is one round trip and a send: its looks in one statement (watcher_looks), then one locking
    read of the first ready jobs (claim_take, `taken`); a due job sends it to the two steps
    after the promotion. It reads the queue's enqueue count in the candidates'
    round trip, as a statement of its own just before them (READ COMMITTED: a fresh snapshot
    per statement, so every job that count includes is visible to the candidate read), and if
    the claim drains the queue it records that count as watched, in the claim's own COMMIT,
    not waited for either when it took jobs: the watch's hand-on waits for that COMMIT on the
    server (advisory.hand_watch_on, on a job of the claim), so the next watcher does not wake
    for work already taken. An empty watcher's claim waits for it (the hand-on then waits on
    the queue's row).
    acks: the last batch's successes, acked first, with the mark, in a query whose replies are
    waited for and checked (Acks.verify) before the COMMIT goes (unlike the mark, the ack's
    DELETE can wait for a lock or lose a deadlock, and a KILL QUERY can answer it OK with no
    row deleted: either reruns the claim before its jobs start). Only the COMMIT is left on the
    wire; if it fails, Claim.commit says so and the caller acks them again (ack()). Its first
    row counts are theirs. A limited queue's claim sends them (but the signal's bump) first, in
    its first round trip, so that its counts of running jobs leave them out (`front`).
    rates: the queue's rate limits (store/rates.py): only candidates the log (as committed) has a
    start for are locked (rates.hint), and of the locked rows only those a start is free for
    under the budgets' locks are marked, their starts written in this transaction; its jobs
    then start only once its COMMIT is read.
    version: the consumer's code version: jobs that need a newer one are not taken (lock_window).
    A claim whose locking read met such jobs and that still has room reads its candidates again
    past them (claim_ready_for_version, claim_candidates_for_version, FlowClaims.for_version) and
    locks those too, in the same transaction: a run of them at the head of the queue, or of a
    key, hides nothing behind it. A round trip more for an old consumer in a rolling deploy;
    a claim that meets none pays nothing.
    flow: the queue's limits, fairness and per-key rate (store/flow.py): its candidates replace the ready read,
    and a job they hold back counts as taken (the claim may still drain the queue).
    """
    token = int.from_bytes(os.urandom(8), "big") >> 1  # 63 random bits; `secrets` would load hmac and hashlib
    counting = flow is not None and flow.limits.counts
    if counting:
        token |= COUNTED_BIT  # its jobs are in their keys' counters: their ends release them
    # A limited queue's acks go first in its claim (see body), not with its mark
    front = acks is not None and acks.wake is not None and flow is not None and flow.limits.limited
    front_counts: list[int] = []
    if flow is not None:
        flow.recounted = False
        # Key affinity: the keys of the jobs the carried acks end (their release, server-side
        # and first in the claim, already left them out of the counters it reads)
        flow.own_acked = _per_key(acks.keys) if front and counting and acks.keys is not None else {}
        if counting and flow.forget:
            forget_counters(session, queue)
            flow.forget = False
    limit = max(batch_size * OVERFETCH, MIN_CANDIDATES)
    # A watcher's claim reads and locks in one statement (claim_take), where nothing else must
    # see the candidates first: no flow limits (their keys pick them), no rates (their hint).
    # (It locks only what it takes, skipping peers' rows: the candidates' minimum is not its.)
    one_step = as_watcher and flow is None and rates is None

    def first_query(cur) -> str:
        """A watcher's one round trip: watcher_looks, then claim_take of one more job than its
        batch (did it leave any behind?)."""
        take = {"queue": queue, "limit": batch_size + 1}
        return cur.mogrify(Q["watcher_looks"], take) + ";\n" + cur.mogrify(Q["claim_take"], take)

    def two_steps(cur, ordered: list[int], due: bool):
        """The candidates (`ordered`, read; or the flow's, read here), then locked by id:
        (candidates, the rates' hint, the rows locked, how many too new, drained, the key gate)."""
        complete = True
        keys = None
        gate = None
        if flow is not None:
            if due:
                flow.drop_looks()  # its key reads were before the promotion: read again
                _apply_freed(cur, queue, flow)  # (the promotion commits the acks with it)
                _promote_due(session, cur, queue)
            grant = flow.candidates(cur, queue, batch_size)
            ordered, complete, keys = grant.ids, grant.complete, grant.keys  # it says what it left behind
            if flow.limits.limited and flow.read is not None:
                # Its keys' rows are locked with the jobs it takes, and counted under those locks
                gate = KeyGate(queue, flow.limits, flow.read, grant.keys, flow.freed, flow.trust_s)
        read = len(ordered)
        candidates = ordered  # every id read, before the rates' hint leaves some out
        # A rated queue locks only candidates its budgets have a start for (the log as committed):
        # the windows below are then filled by keys with room, not by a spent key's backlog
        hinted = rating.hint(cur, queue, token, rates, ordered, keys)
        if hinted is not None:
            ordered = hinted.ids
        locked: list[tuple] = []
        spares = grant.spares if flow is not None and hinted is None else 0
        firsts = ordered[:len(ordered) - spares]
        tried, too_new = lock_windows(cur, firsts, batch_size, version, locked, gate)
        if spares:
            # A key's jobs past its free slots (flow.spare_cap), only for keys whose first jobs a
            # peer's claim took meanwhile (their rows no longer ready, or locked)
            got = {r[0] for r in locked}
            missed = {keys.get(i) for i in firsts[:tried] if i not in got}
            extra = [i for i in ordered[len(firsts):] if keys.get(i) in missed]
            more, more_new = lock_windows(cur, extra, batch_size, version, locked, gate)
            too_new += more_new
            # (spares not tried: the batch is full; the rest are of keys whose first jobs it
            # had, no more than their free slots as committed: not left behind)
            complete = complete and more == len(extra)
            ordered = firsts
        if gate is not None:
            grant.held_keys += [k for k in gate.held if k not in grant.held_keys]
            complete = complete and not gate.contended  # jobs left for the claim that holds their keys
            grant.contended = grant.contended or gate.contended
            flow.recounted = flow.recounted or gate.recounted
        # What the rates held back waits for their refill (admit's hold), as if taken; a flow read
        # says itself whether it left any job behind, except those of more ids than a claim takes.
        drained = ((complete and tried == len(ordered)
                    and (len(ordered) <= batch_size if flow is not None
                         else read < limit or (hinted is not None and hinted.held)))
                   # Nothing to take but what the rates hold: wait for the refill, not claim again at
                   # once (a flow read that left keys unread reads them next time, from its cursor)
                   or (not locked and hinted is not None and hinted.held))
        return candidates, hinted, locked, too_new, drained, gate

    def body(cur) -> Claim:
        params = {"queue": queue, "limit": limit}
        seen_seq = None
        ordered: list = []  # (a flow claim's candidates are read in two_steps)
        if one_step:
            cur.execute(first_query(cur))  # one round trip: the looks, then the locking read
            seen, due, paused, server_now = cur.fetchone()
            clock = claim_clock(server_now)
            seen_seq, due = _signal_read(seen, queue), bool(due)
            cur.nextset()
            rows = cur.fetchall()  # locked, in claim order (ix_state's)
            if paused:  # (the COMMIT lets go of what claim_take locked)
                return Claim([], token, True, True)
        elif flow is not None:
            writes: list[tuple[str, dict[str, Any]]] = []
            flow.freed = {}
            if front:
                # A lean claim nets its acks' release into its mark's counter change (Acks.net)
                acks.net = (flow.lean_now and counting and acks.keys is not None and not net_failed
                            and not any(r is not None for r in acks.results or ()))
                # A limited claim's acks go first, in its transaction: its counts of running
                # jobs then leave their jobs out (its own DELETE is visible to it), and their
                # slots are taken again by this claim, under its keys' locks, or freed by its
                # COMMIT. In its first round trip, checked once it is read, as send_commit
                # checks a plain claim's; kept results (maybe large: send_commit's sizing)
                # go in a round trip of their own.
                if any(r is not None for r in acks.results or ()):
                    front_counts[:] = session.pipeline.run_all(cur, acks.statements(bump=False))
                    acks.verify(cur, front_counts, bumped=False)
                else:
                    writes = acks.statements(bump=False)
            # The looks ride the flow read's first round trip (its keys and their counts), after
            # them: a watcher's count is read before any candidate, as below
            names = ("signal_total",) * as_watcher + ("due_any", "queue_paused")
            counts, (*count, due_rows, paused_rows) = flow.looks(cur, queue, batch_size,
                                                                [(Q[name], params) for name in names], writes)
            if writes:
                front_counts[:] = counts
                acks.verify(cur, front_counts, bumped=False)
                if acks.net:
                    if front_counts[acks.counted] != len(acks.ids):
                        # A job of the ack taken back meanwhile (its fence failed): the keys of
                        # the rows it did delete are the server's to count. Again, released
                        # server-side (flow_count_release)
                        net_failed.append(True)
                        raise cut_short(f"claim {queue}: netted ack deleted {front_counts[acks.counted]} "
                                        f"of {len(acks.ids)}")
                    # (the same jobs per key as its key affinity's, counted once in claim())
                    flow.freed = dict(flow.own_acked)
            if as_watcher:
                seen_seq = _signal_read(count[0][0][0], queue)
            due = bool(due_rows)
            paused, server_now = paused_rows[0] if paused_rows else (0, None)  # (a KILL QUERY's cut)
            clock = claim_clock(server_now)
            if paused:
                flow.drop_looks()
                _apply_freed(cur, queue, flow)
                return Claim([], token, True, True)
        else:
            names = ("signal_total",) * as_watcher + ("claim_ready", "due_any", "queue_paused")
            cur.execute(";\n".join([cur.mogrify(Q[name], params) for name in names]))  # one round trip
            if as_watcher:
                seen_seq = _signal_read(cur.fetchone()[0], queue)
                cur.nextset()
            ordered = [row[0] for row in cur.fetchall()]  # already in claim order: ix_state's
            cur.nextset()
            due = cur.fetchone() is not None
            cur.nextset()
            paused, server_now = cur.fetchone() or (0, None)  # (a KILL QUERY's cut)
            clock = claim_clock(server_now)
            if paused:
                return Claim([], token, True, True)
        gate = None
        if one_step and not due:
            candidates = [row[0] for row in rows]
            locked, too_new, drained = taken(rows, batch_size, version)
            hinted = None
        else:
            if due and flow is None:
                # Due jobs: promoted, then read with the ready ones (after a claim_take, its rows
                # are let go by the promotion's COMMIT: this read finds them again)
                ordered = _with_due(session, cur, queue, params)
                if ordered is None:  # paused meanwhile
                    return Claim([], token, True, True)
            candidates, hinted, locked, too_new, drained, gate = two_steps(cur, ordered, due)
        if too_new and len(locked) < batch_size:
            # The candidates held jobs too new for this consumer (a rolling deploy), and it has
            # room: read again past them, and lock those too. Without this, a run of them longer
            # than the read at the head of the queue (or of a key) hid every job behind it that
            # this consumer can run. Its drained then says whether jobs it can run are left: a
            # queue of only too-new jobs is drained for it (it waits for the next wake-up, never
            # claims again at once). The filter costs each candidate's row, so it is not in the
            # first read, which every claim makes. (The rates still decide in admit below.)
            seen = set(candidates)
            complete = True  # a plain read's: it says what it left behind by its length
            if flow is not None:
                grant = flow.for_version(cur, version, seen, [r[KEY] for r in locked])
                again, complete = grant.ids, grant.complete
                if gate is not None:
                    gate.learn(grant.keys)
            elif due:
                again = _merged(cur, Q["claim_candidates_for_version"], {**params, "version": version}) or []
            else:
                cur.execute(Q["claim_ready_for_version"], {**params, "version": version})
                again = [row[0] for row in cur.fetchall()]
            fresh = [job_id for job_id in again if job_id not in seen]  # tried already, or ours
            tried, _ = lock_windows(cur, fresh, batch_size, version, locked, gate)
            if gate is not None:
                complete = complete and not gate.contended
                flow.last.contended = gate.contended
            drained = (complete and tried == len(fresh)
                       and (len(fresh) <= batch_size if flow is not None else len(again) < limit))
        # Claim order by what the locked rows say now, not by the candidate read: a job a peer
        # retried (or an operator re-prioritised) since then has a new run_at or priority.
        in_claim_order(locked)
        if len(locked) > 1 and any(map(_suspect, locked)):
            kept = suspects_alone(locked)
            drained = drained and len(kept) == len(locked)  # the rest waits for the next claim
            locked = kept
        admitted = rating.admit(cur, queue, token, rates, locked, drained, hinted)
        locked, drained = admitted.rows, admitted.drained
        if front:
            last = acks.bump()  # sent first: their bump, last before the COMMIT as a plain claim's
        else:
            last = acks.statements() if acks is not None else []
        verified = len(last)
        if locked:
            marking = [r[0] for r in locked]
            last.append((Q["claim_mark"], {"ids": Ids(marking), "owner": owner,
                                           "token": token, "lease_us": microseconds(lease_s)}))
            sent_marks.update(marking)  # (before it is sent: it may land unseen)
        mark_at, marked = len(last) - 1, len(locked)
        # A limited claim reads its keys' running jobs again right after its mark, in the mark's
        # own query (FlowClaims.verify_marked reads the rows). A counting claim instead adds its
        # grant to its keys' counter rows (held by its KeyGate), checked by its row count; it
        # counts again as the others do only when it recounted a key (a recount cut short by a
        # KILL QUERY must not let a key run more than its limit: the rollback undoes it).
        add = None
        add_least = 0
        if counting:
            delta = _per_key(map(_key, locked))  # the jobs it marked, per key
            for k, n in flow.freed.items():  # a netted ack's jobs, off their keys (Acks.net)
                delta[k] = delta.get(k, 0) - n
            add = flow.count_add(queue, delta)
            # (of its keys, those only a netted ack frees may be unknown, NULL, and stay so: unchanged)
            add_least = sum(1 for k in add[1]["keys"] if k not in flow.freed or delta.get(k, 0) > 0) if add else 0
        elif gate is not None and gate.known and locked:
            # A limited claim that does not count (a `limit` or `fair` too, or a consumer reloaded
            # from a config that counted): its jobs are in no counter, so the known counters of
            # their keys (a counting consumer's, read by its KeyGate's lock) are given up, under
            # those locks: a counting claim recounts them before it trusts them again
            forget = tuple(sorted({r[KEY] for r in locked if r[KEY] in gate.known}))
            if forget:
                add = (Q["flow_count_forget_set"], {"queue": queue, "keys": forget})
                add_least = len(forget)  # each was known: each changes
        add_at = len(last)
        if add is not None:
            last.append(add)
        add_rows = len(add[1]["keys"]) if add is not None else 0
        recount = flow is not None and flow.limits.limited and (not counting or flow.recounted) and bool(locked)
        if recount:
            last.append((Q["flow_running"], {"queue": queue}))
        # The acks free slots: whether a consumer watches the queue now, read with the mark (its
        # replies are waited for), so that the slot wake's own look (a round trip on another
        # session after every such claim) is sent only when one does (Claim.watched)
        look_at = len(last) if front and acks.watch is not None else None
        if look_at is not None:
            last.append((Q["lock_holder"], {"name": acks.watch}))
        watched = drained and seen_seq is not None
        if watched:
            # Last before COMMIT, in the same query: the queue row's lock is held only for the
            # commit itself, never across a pause of this process between two round trips.
            last.append((Q["mark_watched"], {"queue": queue, "seq": seen_seq}))
        # The rows are locked: the jobs may start while the mark and the COMMIT run; so may a
        # watcher's, while its mark_watched runs: the hand-on's share lock on one of the locked
        # rows waits for our COMMIT (advisory.hand_watch_on), and the next watcher reads the
        # count we saw instead of waking for work just taken. Waiting here for mark_watched's
        # reply was a round trip more on every pick-up from idle. Whoever else locks the queue
        # row (a hand-on, a pause, the last watcher's claim until its COMMIT) holds it briefly
        # and waits for no job row: that can delay our COMMIT, not deadlock it. An empty
        # watcher's claim waits (its hand-on locks the queue row, which must be ours by then).
        # Acks are waited for: their DELETE may wait for a row lock or lose a deadlock, and
        # that must fail the claim here, before its jobs start (the body is then run again),
        # not after, when it would take the claim with it and let its jobs run twice.
        # A flow claim's mark is waited for too: its transaction also holds key rows
        # (nq_flow_key) that other claims wait on, and a deadlock that ended its mark after its
        # jobs started would be a lost claim (they would run twice); waited for, it reruns the
        # claim before any starts. A round trip more, for limited and fair queues only.
        wait = not locked or acks is not None or flow is not None
        # A KILL QUERY can end a statement with an OK reply and no row changed. The acks are
        # verified before the COMMIT goes (Acks.verify; a round trip more, for busy claims only),
        # with the mark, since both are known then; a claim without acks sends its COMMIT with
        # the mark, and a mark that changed fewer rows than it locked fails the claim (its
        # Pending), as a failed COMMIT would: its jobs are given back, not run as ours.
        watched_now = None
        if acks is not None or (flow is not None and (locked or add is not None)):
            verified += bool(locked) + (add is not None) + recount + (look_at is not None)
            replies: list[list[tuple] | None] = []  # the verified statements' rows

            def verify(cur, counts: list[int]) -> None:
                if acks is not None and not front:
                    acks.verify(cur, counts[:mark_at] if locked else counts)
                if locked and counts[mark_at] != marked:
                    raise cut_short(f"claim {queue}: marked {counts[mark_at]} of {marked}")
                if add is not None and not add_least <= counts[add_at] <= add_rows:
                    raise cut_short(f"claim {queue}: counted {counts[add_at]} of {add_rows} keys")
                if recount:
                    # The limits once more, on the rows as marked, before the COMMIT: a count
                    # that a KILL QUERY cut short (an OK reply, rows missing) must not let a
                    # key run more than its limit.
                    flow.verify_marked(replies[mark_at + 1 + (add is not None)], queue, [r[KEY] for r in locked])

            commit = session.pipeline.send_commit(cur, last, what=f"claim {queue}", wait_replies=wait,
                                                  verified=verified, verify=verify, rows=replies)
            if front:
                commit.rowcounts[0:0] = front_counts  # the acks' counts first, as a plain claim's
            if look_at is not None and replies[look_at]:
                watched_now = replies[look_at][0][0] is not None
        elif last:
            commit = session.pipeline.send_commit(
                cur, last, what=f"claim {queue}", wait_replies=wait,
                check=(lambda counts: counts[mark_at] == marked) if locked else None)
        else:
            commit = None
        jobs = [claimed(r[0], queue, r[1], r[2], r[3] + 1, r[4], r[5], r[6], r[7], r[8], clock) for r in locked]
        if admitted.spent:
            jobs = rating.after_commit(session, commit, jobs)
        # (Claim.recount_s: ready jobs a counter held back: claim again at its trust end. Drained
        # or not: a claim that recounted an untrusted counter under its key's lock read that
        # key's slots as free, sized its grant by them, and may call itself not drained when the
        # recount held every job back; an empty claim outside the watch has nobody to follow it)
        counter_held = counting and ((flow.last is not None and flow.last.held_ready)
                                     or (gate is not None and bool(gate.held)))
        return Claim(jobs, token, drained, False, commit, admitted.held_s, clock,
                     recount_s=COUNT_TRUST_S if counter_held else None, watched=watched_now)

    net_failed: list[bool] = []  # a netted ack fell short of its jobs: this claim releases server-side
    runs = 0
    # Every job an attempt's mark named: an attempt whose COMMIT may have landed unseen marked
    # only these, so a rerun hands back only these (unclaim_token, by primary key).
    sent_marks: set[int] = set()
    connection: int | None = None
    alive_at = -math.inf  # when `connection` was last known open, before the earlier attempt
    run: float | None = None  # and the server run it was of (Session.server_run)

    def once(cur) -> Claim:
        nonlocal runs, connection, alive_at, run
        runs += 1
        if runs > 1:
            if session.connection_id != connection and connection is not None:
                # A rerun on a new connection (a read timeout, a lost connection): the earlier
                # attempt may still be running on the server, and commit after we looked.
                # End it and wait until it is gone, so its outcome is settled (unless the
                # server restarted since: then it is gone, and its id may be another's) ...
                end_connection(cur, connection, session, alive_at, run)
            # ... then, if it did commit, its rows carry this token: hand them back first, or
            # they would sit claimed under a token nobody runs until their lease ends. Only the
            # rows an attempt marked: by owner and token alone the statement read every claimed
            # job of the table, and waited on (or deadlocked with) every ack under way.
            if sent_marks:
                cur.execute(Q["unclaim_token"], {"ids": Ids(sorted(sent_marks)), "owner": owner, "token": token})
        # Not the attempt's start: the attempt may be the first statement sent on a connection
        # the server lost in a restart since it last answered (an id another client has now)
        connection, alive_at, run = session.connection_id, session.open_at, session.server_run
        return body(cur)

    if flow is not None:
        # Keys the last claim found unnamed, named before this claim's transaction begins (and
        # before the acks it carries run): naming can wait on a peer's key row lock
        flow.named_now = bool(flow.unnamed)
        if flow.unnamed:
            flow.name_keys(session, queue, flow.unnamed)
        if counting:
            # Whether every consumer of the queue keeps the counters (a read every few seconds)
            flow.trust.refresh(session, queue)
        # A queue limited per key only reads lean (its counters and head: FlowClaims.lean_grant)
        flow.lean_now = flow.lean and rates is None
    try:
        return session.run(once, what=f"claim {queue}")
    except UnnamedKeys as e:
        assert flow is not None  # (only a flow read raises it)
        # Its candidate read found keys no row names: rolled back (its acks with it), the keys
        # named on their own, then the claim again, which takes their jobs too
        flow.name_keys(session, queue, e.keys)
        flow.named_now = True
        flow.lean_now = False
        return session.run(once, what=f"claim {queue}")


def retake(session: Session, jobs: list[Job], token: int, owner: str, lease_s: float,
           connection: int | None, sent_at: float, run: float | None = None,
           limits: FlowLimits | None = None) -> list[int] | None:
    """A claim whose COMMIT failed, or lost its reply, after its first job started (claim()
    does not wait for it): which of its `jobs` it holds now, committed. Those its COMMIT did
    mark are its own; those it did not and that nobody took meanwhile (still claimable, their
    attempts unchanged) are marked again under its token: the job already running is then ours,
    and its ack holds, instead of a rerun. The rest are someone else's. Asked once the claim's
    transaction can no longer commit: its connection (`connection`, the claim sent at
    `sent_at`, of the server's run `run`: Session.server_run when it was sent) ended and waited
    for, unless the server restarted since (recovery settled it). None: that connection outlived
    its KILL, so no read tells yet. Without `run`, a restart within a second or two of `sent_at`
    (a crash, the server back at once; or a claim first sent after it on a connection from before
    it) passed for none, and the KILL of the claim's connection id took an application's session
    that had the id on the new server.

    A limited queue's (`limits`, its claims' FlowLimits) jobs are taken again only within its
    limits: the failed COMMIT let go of the claim's key rows, and a peer's claim may have taken
    the free slots of their keys (or of the queue's `limit`) since, its count without ours. The
    rows of their keys (and the queue's) are locked first, waited for (outside any claim), the
    running jobs counted under them (flow_running), and of each key only as many jobs taken
    again as leave it within its limit, the claim's started ones first; the rest are someone
    else's (their current run's ack is fenced out)."""
    ids = [j.id for j in jobs]
    if not ids:  # every job of the claim was taken back meanwhile: nothing is left to learn
        return []
    earlier = connection  # a connection whose transaction may still commit what we look at
    alive_at = sent_at  # when `earlier` was last known open

    def body(cur) -> list[int] | None:
        nonlocal earlier, alive_at, run
        if earlier is not None and earlier != session.connection_id:
            if not end_connection(cur, earlier, session, alive_at, run):
                return None
        # a rerun on a new connection ends this one first (as in claim: open when it last answered)
        earlier, alive_at, run = session.connection_id, session.open_at, session.server_run
        if session.galera:  # this node first applies every write set the cluster committed
            cur.execute(Q["wsrep_sync_wait"], {"level": 1})
        try:
            # Locked: held while this waits for its keys' rows below (a reaper passes over them)
            cur.execute(Q["claims_owned_lock"], {"ids": Ids(ids), "token": token})
            held = {r[0] for r in cur.fetchall()}
            free = {j.id: j.attempts - 1 for j in jobs if j.id not in held}  # attempts before the claim
            if free:
                gated = limits is not None and limits.limited
                locked_keys: set[str] = set()
                if gated:
                    # Key order (the queue's row, the empty key, first): as KeyGate locks them
                    want = sorted({j.key for j in jobs if j.id in free and limits.limit_for(j.key)}, key=str)
                    if limits.limit:
                        want.insert(0, QUEUE_ROW)
                    if want:
                        cur.execute(Q["flow_lock_wait"], {"queue": jobs[0].queue, "keys": tuple(want)})
                        locked_keys = {r[0] for r in cur.fetchall()}
                cur.execute(Q["claim_lock"], {"ids": Ids(list(free))})
                rows = [r for r in cur.fetchall() if r[3] == free[r[0]]]
                if gated and rows:
                    cur.execute(Q["flow_running"], {"queue": jobs[0].queue})
                    running = {r[0]: int(r[1]) for r in cur.fetchall()}
                    order = {job_id: i for i, job_id in enumerate(ids)}  # the started jobs first
                    rows = _within_limits(sorted(rows, key=lambda r: order[r[0]]), limits, running, locked_keys)
                mine = [r[0] for r in rows]
                if mine:
                    cur.execute(Q["claim_mark"], {"ids": Ids(mine), "owner": owner, "token": token,
                                                  "lease_us": microseconds(lease_s)})
                    if cur.rowcount != len(mine):  # a KILL QUERY's OK reply: run it again
                        raise cut_short(f"retake a claim: marked {cur.rowcount} of {len(mine)}")
                    if gated:
                        # The limits once more on the rows as marked: a count that a KILL QUERY
                        # cut short (an OK reply, rows missing) must not let a key run more
                        # than its limit (as a claim's FlowClaims.verify_marked)
                        cur.execute(Q["flow_running"], {"queue": jobs[0].queue})
                        limits.verify_within(cur.fetchall(), {r[KEY] for r in rows}, "retake a claim")
                    keys = tuple(sorted({r[KEY] for r in rows if r[KEY] is not None}))
                    if keys and counted_token(token):
                        # A counting claim's jobs marked again: its COMMIT's counter change did
                        # not land with them, and their ends will release them (COUNTED_BIT).
                        # Their keys' counters are given up, recounted by the next claim of each
                        # (not added to: a retake is rare, and a recount under the lock is exact)
                        cur.execute(Q["flow_count_forget_set"], {"queue": jobs[0].queue, "keys": keys})
                    held.update(mine)
        finally:
            if session.galera:
                cur.execute(Q["wsrep_sync_wait"], {"level": 0})
        return [job_id for job_id in ids if job_id in held]

    return session.run(body, what="retake a claim")


def _within_limits(rows: list[tuple], limits: FlowLimits, running: dict[str | None, int],
                   locked: set[str]) -> list[tuple]:
    """Of a retake's locked rows (claim_lock's, in the claim's order), those its limits leave
    room for: their key's row (and the queue's, for a `limit`) locked, and a slot free under the
    running jobs counted under those locks (`running`, per key) and the rows kept before."""
    kept: list[tuple] = []
    per_key: dict[str, int] = {}
    total = sum(running.values())
    for row in rows:
        key = row[KEY]
        if limits.limit and (QUEUE_ROW not in locked or total + len(kept) >= limits.limit):
            continue
        lim = limits.limit_for(key)
        if lim:
            if key not in locked or running.get(key, 0) + per_key.get(key, 0) >= lim:
                continue
            per_key[key] = per_key.get(key, 0) + 1
        kept.append(row)
    return kept


def _apply_freed(cur, queue: str, flow: FlowClaims) -> None:
    """A netted ack's jobs taken off their keys' counters now (FlowClaims.freed), for a claim
    that commits before its mark: paused, or promoting due jobs."""
    if flow.freed:
        add = flow.count_add(queue, {k: -n for k, n in flow.freed.items()})
        if add is not None:
            cur.execute(*add)
        flow.freed = {}


def _with_due(session: Session, cur, queue: str, params: dict[str, Any]) -> list[int] | None:
    """The candidates of a claim that found due jobs: promoted to ready first, then read with the
    ready ones (and any due ones still left) and merged in claim order; None if the queue was
    paused meanwhile."""
    _promote_due(session, cur, queue)
    return _merged(cur, Q["claim_candidates"], params)


def _merged(cur, sql: str, params: dict[str, Any]) -> list[int] | None:
    """claim_candidates' (or claim_candidates_for_version's) two parts merged in claim order;
    None at its pause marker."""
    cur.execute(sql, params)
    candidates = []
    for job_id, prio_key, run_at, _due in cur.fetchall():
        if job_id == 0:
            return None
        candidates.append((prio_key, run_at, job_id))
    candidates.sort()
    return [c[2] for c in candidates]


def _promote_due(session: Session, cur, queue: str) -> None:
    """Due jobs -> ready, committed at once (before the claim locks anything), so peers that
    promote at the same time wait on these rows only for this one statement. The signal moves
    with them, by the count read (an upper bound: a spurious wake-up at worst): idle consumers
    wake for promoted work as they did for due work."""
    cur.execute(Q["due_ids"], {"queue": queue, "limit": PROMOTE_MAX})
    ids = [r[0] for r in cur.fetchall()]
    if not ids:
        return
    session.pipeline.commit_with(cur, [
        (Q["promote_due"], {"ids": Ids(ids)}),
        signal.bump(queue, len(ids))])
    # Not the claim's last word: what it does next is a transaction of its own, which the
    # Session commits if the claim sends no COMMIT (it took nothing, carried no acks). Marked
    # committed, that transaction stayed open: a limited claim's key rows (and its queue's row)
    # locked until the connection's next claim, which an idle consumer never sent, and every
    # peer's claim skipped them (a key stalled for 15 minutes under an outside test)
    session.attempt.committed = False


KEY = 8  # claim_lock's column: the job's flow key
SUSPECT = 9  # claim_lock's column: the job was held by a consumer that died or stalled
MIN_VERSION = 10  # claim_lock's column: the lowest consumer code version the job may run on


def lock_windows(cur, ordered: list[int], batch_size: int, version: int, locked: list[tuple],
                 gate: KeyGate | None = None) -> tuple[int, int]:
    """Lock windows of `ordered` (candidates in claim order) until `locked` holds batch_size
    rows or every candidate was tried: how many were tried, and how many of the locked rows were
    too new for `version` (lock_window). Each window is exactly as large as what is still
    missing: no LIMIT on the locking read, so InnoDB's primary-key order can never pick a
    low-priority job over a higher one. Under contention the next window takes over skipped
    rows (and rows a limited claim's `gate` did not keep)."""
    tried = too_new = 0
    while len(locked) < batch_size and tried < len(ordered) and not (gate is not None and gate.closed):
        window = ordered[tried: tried + batch_size - len(locked)]
        tried += len(window)
        rows, skipped = lock_window(cur, window, version, gate)
        locked.extend(rows)
        too_new += skipped
    return tried, too_new


def lock_window(cur, ids: list[int], version: int, gate: KeyGate | None = None) -> tuple[list[tuple], int]:
    """Step 2 of a claim, for one window of candidates: the rows locked (claim_lock) that a
    consumer of code `version` may run, and how many it may not (their min_version is above
    it: old code never claims a job that needs newer code). Those stay unmarked: the claim's
    COMMIT releases them for a newer consumer. The test is on the rows already read, so a job
    without a minimum costs nothing more; only a claim that met such jobs reads its candidates
    again past them (claim()). A limited claim's `gate` locks the window's keys in the same
    round trip and keeps only the rows its limits let through (KeyGate); the others stay
    unmarked too."""
    if gate is not None:
        rows = gate.lock(cur, ids, (Q["claim_lock"], {"ids": Ids(ids)}))
    else:
        cur.execute(Q["claim_lock"], {"ids": Ids(ids)})
        rows = cur.fetchall()
    kept = [r for r in rows if r[MIN_VERSION] is None or r[MIN_VERSION] <= version]
    too_new = len(rows) - len(kept)
    if gate is not None:
        kept = gate.admit(in_claim_order(list(kept)), key=_key)
    return kept, too_new


def taken(rows: list[tuple], batch_size: int, version: int) -> tuple[list[tuple], int, bool]:
    """A watcher's one-step claim (claim_take): of the rows it locked, in claim order, up to
    batch_size that a consumer of code `version` may run; how many it may not (as lock_window);
    and whether it drained the queue. It read one row more than its batch: it drained the queue
    when fewer came back, the rest (rows a peer holds, skipped) taken by others, as the two
    steps count them. The rows it locked and does not take are let go, unmarked, at its COMMIT."""
    kept = [r for r in rows if r[MIN_VERSION] is None or r[MIN_VERSION] <= version]
    return kept[:batch_size], len(rows) - len(kept), len(rows) <= batch_size


_by_time_then_id = itemgetter(5, 0)  # a claim_lock row's run_at (its text: one width, so it
_by_priority = itemgetter(2)  # sorts as the times do) and id; its priority
_suspect = itemgetter(SUSPECT)
_key = itemgetter(KEY)


def _per_key(keys: Iterable[str | None]) -> dict[str, int]:
    """How many of `keys` each key is (None, a job without a key, left out): counted in C, for
    each job a limited claim carries or marks."""
    counts = dict(Counter(keys))
    counts.pop(None, None)
    return counts


def in_claim_order(rows: list[tuple]) -> list[tuple]:
    """claim_lock rows sorted in place into claim order: priority (highest first), then run_at,
    then id. Two sorts by C-level keys, the second stable (reverse keeps ties in order), not one
    by a Python key function called per row; rows in order already cost a pass each."""
    rows.sort(key=_by_time_then_id)
    rows.sort(key=_by_priority, reverse=True)
    return rows


def suspects_alone(locked: list[tuple]) -> list[tuple]:
    """What a claim takes of rows it locked, in claim order: a suspect alone, or the jobs before
    the first suspect. A suspect's next crash is then charged to it alone (and claim order
    holds: the rest, suspects first, go to the next claims). Rows left out are not marked, so
    the claim's COMMIT simply releases them."""
    if locked[0][SUSPECT]:
        return locked[:1]
    for i, row in enumerate(locked):
        if row[SUSPECT]:
            return locked[:i]
    return locked


# ---------------------------------------------------------------- outcomes

def ack(session: Session, ids: list[int], token: int, keep: bool, acks: Acks | None = None) -> int:
    """Success for `ids` (or `acks`); returns how many rows this claim still owned (the rest
    were lost)."""
    acks = acks if acks is not None else Acks(ids, token, keep)
    acks.net = False  # (an ack alone releases its counters itself: a claim that netted it failed)
    if not acks.ids:
        return 0

    def body(cur) -> int:  # fenced by token, so idempotent; verified before its COMMIT (Acks.verify)
        counts = session.pipeline.run_all(cur, acks.statements())
        acks.verify(cur, counts)
        return counts[acks.counted]

    return acked_in_all(session, acks, session.run(body, what="ack"))


def slots_freed(session: Session, queue: str, n: int) -> None:
    """A limited queue's signal bumped by `n`, in a transaction of its own: `n` slots freed by
    jobs completed in their own transactions (their COMMITs bump nothing), with no ack to carry
    the bump. Run again after a lost COMMIT, it bumps twice: a spurious wake-up at worst."""
    session.run(lambda cur: bump_signal(cur, queue, n), what="wake for freed slots")


def acked_in_all(session: Session, acks: Acks, acked: int) -> int:
    """How many of `acks` this claim acked, given that its last ack (alone, or in a claim's
    COMMIT) counted `acked`. Fewer than all: fenced out, or acked already by a try whose reply
    was lost (retried on a new connection, it found the rows gone; its outcome was landed, not
    lost). Each ack writes its jobs' records under the claim's token in its own transaction:
    those records count what this claim acked, over every try (one read, only then), and also
    what another send of the same outcomes acked (the stop's, of a batch its worker was still
    sending): which ones is kept on `acks` (Acks.landed), for the consumer to count each job once."""
    if acked >= len(acks.ids):
        acks.landed = None
        return acked
    acks.landed = session.run(lambda cur: completions_landed(cur, acks.ids, acks.token), what="check acks")
    return len(acks.landed)


def completions_landed(cur, ids: list[int], token: int) -> set[int]:
    """Of `ids`, the jobs this claim's ack or completion (job.transaction(), complete_in)
    committed: their 'done' record under its token."""
    cur.execute(Q["completions_landed"], {"ids": Ids(ids), "token": token})
    return {int(r[0]) for r in cur.fetchall()}


LOCK_NOWAIT = frozenset({1205, 3572})  # a NOWAIT read of a locked row: MariaDB's lock wait error, MySQL's


def rows_locked(cur, ids: list[int]) -> set[int]:
    """Of `ids`, the jobs whose row a transaction holds now (job_row_locked, one probe each: a
    rare path, after a handler's timeout). Rolls back: the probes' own locks go at once."""
    locked = set()
    try:
        for job_id in ids:
            try:
                cur.execute(Q["job_row_locked"], {"id": job_id})
                cur.fetchall()
            except MySQLdb.OperationalError as e:
                if error_code(e) not in LOCK_NOWAIT:
                    raise
                locked.add(job_id)
    finally:
        cur.connection.rollback()
    return locked


@dataclass
class Failure:
    """One failed attempt: what queries.reschedule_or_bury records (the job's row, and its attempt's)."""
    id: int
    delay_s: float | None  # None: dead
    error: str
    attempt: int = 0  # the attempt that failed
    traceback: str | None = None
    started: float | None = None  # monotonic
    ended: float | None = None
    snooze: bool = False  # not a failure: back after delay_s, no attempt spent (Job.snooze)
    interrupted: bool = False  # not a failure: its consumer's shutdown stopped it (ready now, uncharged)
    clock: tuple[Any, float] | None = None  # its claim's (Claim.clock): places started and ended


class Owned(list):
    """The ids of the jobs a claim still owned (reschedule_or_bury), and among them `cancelled`:
    those that ended cancelled instead, their cancel requested while they ran; and `earlier`:
    those whose outcome another send of it landed first (attempt_landed: the stop's, the
    worker's, or a try whose reply was lost), ours all the same, not taken from us."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled: set[int] = set()
        self.earlier: set[int] = set()
        # The queues of the workflow children that run anyway these ends released (to wake)
        self.released: list[str] = []


def reschedule_or_bury(session: Session, queue: str, token: int,
                       failures: list[tuple[int, float | None, str] | Failure], wake: bool = False) -> Owned:
    """failures: Failure, or (id, delay_s or None for dead, error). Returns the ids the claim
    still owned (Owned: with those that ended cancelled). Each job's attempt record goes with
    its outcome, in one round trip. wake: a limited queue's, whose every outcome frees a slot
    (a burial and a cancel too, not only a retry): the signal moves for each."""
    if not failures:
        return Owned()
    items = [f if isinstance(f, Failure) else Failure(*f) for f in failures]

    def body(cur) -> Owned:
        owned = Owned()
        retried = 0
        now = time.monotonic()
        if counted_token(token):
            # A counting claim's jobs: their keys' counters, before the outcomes take the rows
            # out of status 2, under their fence
            cur.execute(Q["flow_count_release"], {"ids": Ids([f.id for f in items]), "token": token})
        for f in items:
            fenced = {"id": f.id, "token": token}
            if f.interrupted:
                outcome = (Q["interrupt"], {**fenced, "error": error_text(f.error)})
            elif f.snooze:
                outcome = (Q["snooze"], {**fenced, "error": error_text(f.error),
                                         "delay_us": microseconds(f.delay_s or 0.0)})
            elif f.delay_s is None:
                outcome = (Q["bury"], {**fenced, "error": error_text(f.error)})
            else:
                outcome = (Q["retry_later"], {**fenced, "error": error_text(f.error),
                                              "delay_us": microseconds(f.delay_s)})
            # Right after it, whether it ended cancelled instead (its cancel asked while it ran)
            outcome = (outcome[0] + ";\n" + Q["ended_cancelled"], outcome[1])
            recorded_error = None if f.snooze else error_text(f.error, ATTEMPT_ERROR_BYTES)
            record = (Q["attempt_failed"], {
                **fenced, "dead": int(f.delay_s is None), "snoozed": int(f.snooze),
                "interrupted": int(f.interrupted), "host": HOST,
                "started_at": server_time(f.clock, f.started), "ended_at": server_time(f.clock, f.ended),
                "started_age_us": microseconds(now - (f.started if f.started is not None else now)),
                "ended_age_us": microseconds(now - (f.ended if f.ended is not None else now)),
                "error": recorded_error,
                "traceback": error_text(f.traceback, ATTEMPT_TRACEBACK_BYTES) if f.traceback else None})
            statements = [record, outcome, (Q["attempts_prune"], {"id": f.id, "kept": ATTEMPTS_KEPT})]
            cur.execute(";\n".join(cur.mogrify(sql, params) for sql, params in statements))
            recorded = cur.rowcount
            cur.nextset()
            n = cur.rowcount  # the outcome's
            cur.nextset()
            ended = cur.fetchone()  # ended_cancelled's
            while cur.nextset():
                pass
            # Record and outcome are under one fence: a KILL QUERY that ended one of them with an
            # OK reply and no row changed must not commit the other alone (nor leave the job
            # claimed, counted lost, when it ended both)
            if recorded != n or (n == 0 and still_claimed(cur, [f.id], token)):
                raise cut_short(f"fail job {f.id}, replies {recorded}, {n}")
            if n == 0:
                # Fenced out: taken from us, or landed by another send of this outcome (its
                # record under our token says which). Landed: ours, and settled by that send
                cur.execute(Q["attempt_landed"], {**fenced, "error": recorded_error})
                landed = cur.fetchone()
                if landed is not None:
                    owned.append(f.id)
                    owned.earlier.add(f.id)
                    if landed[0] == "cancelled":
                        owned.cancelled.add(f.id)
                continue
            if f.delay_s is not None:
                retried += n
            owned.append(f.id)
            if ended is not None and ended[0]:
                owned.cancelled.add(f.id)
            # A job that ended here (dead, or cancelled) settles its workflow's children in the
            # same transaction: cancelled, or counted where they run anyway
            if f.id in owned.cancelled:
                workflows.settle_failed(cur, [f.id], "cancelled", owned.released)
            elif f.delay_s is None and not f.snooze:
                workflows.settle_failed(cur, [f.id], "dead", owned.released)
        freed = len(owned) - len(owned.earlier)  # (another send's freed its slots, and bumped)
        if retried or (wake and freed):
            # the watcher's next-due deadline must learn of a retry; a limited queue's watcher
            # of the slot it frees
            bump_signal(cur, queue, max(retried, freed))
        return owned

    return session.run(body, what="fail")


def error_text(error: str, max_bytes: int = ERROR_MAX_BYTES) -> str:
    """The error as last_error can hold it: valid UTF-8 (a lone surrogate, which no encoder
    takes, becomes '?') of at most max_bytes, cut on a character boundary."""
    return error.encode("utf-8", "replace")[:max_bytes].decode("utf-8", "ignore")


def give_back(session: Session, queue: str, ids: list[int], token: int) -> int:
    """Claimed jobs that never started go back to ready; returns how many this claim still held."""
    if not ids:
        return 0

    def body(cur) -> int:
        if counted_token(token):
            # A counting claim's jobs: the counters of the keys they held, first, under the fence
            cur.execute(Q["flow_count_release"], {"ids": Ids(ids), "token": token})
        cur.execute(Q["give_back"], {"ids": Ids(ids), "token": token,
                                     "cancelled": "cancelled before it started"})
        n = cur.rowcount  # read before the bump: its own row count would replace this one
        # Fewer than asked is a claim taken back, unless some are still ours: a KILL QUERY's OK
        # reply to the UPDATE it cut short (they would wait for their lease, ready jobs unclaimed)
        if n < len(ids) and still_claimed(cur, ids, token):
            raise cut_short(f"give back {len(ids)} jobs: {n} returned")
        if n:
            bump_signal(cur, queue, n)
        return n

    return session.run(body, what="give back")


def extend_lease(session: Session, ids: list[int], token: int, lease_s: float) -> list[int]:
    """Push the claim's lease out for `ids`; returns those the claim still holds.

    One statement for the batch; only when it changed fewer rows than asked (someone took jobs
    back after their lease ran out) a second read says which ones are still ours."""
    if not ids:
        return []

    def body(cur) -> list[int]:
        params = {"ids": Ids(ids), "token": token}
        cur.execute(Q["extend_lease"], {**params, "lease_us": microseconds(lease_s)})
        if cur.rowcount == len(ids):
            return list(ids)
        cur.execute(Q["claims_owned"], params)
        return [r[0] for r in cur.fetchall()]

    return session.run(body, what="extend lease")


# ---------------------------------------------------------------- one value, and pause

def one_value(session: Session, name: str, params: dict[str, Any], what: str) -> Any:
    def body(cur):
        cur.execute(Q[name], params)
        row = cur.fetchone()
        return row[0] if row else None

    return session.run(body, what=what)


END_CONNECTION_WAIT_S = 30.0  # a server thread KILL cannot stop within this is stuck in I/O


def connection_is_ours(cur, session: Session | Any, conn_id: int) -> bool:
    """Whether the server's session `conn_id` may still be the connection `session` had under
    that id: the same client port in its host (a restart within a second or two cannot be told
    from the times, Session.restarted_after, and gave the id to another client's session).
    True when the port is not known (a unix socket, an id not of this session): the times judge."""
    port_of = getattr(session, "port_of", None)  # (a complete_in caller's connection: not known)
    port = port_of(int(conn_id)) if port_of is not None else None
    if port is None:
        return True
    cur.execute(Q["connection_from_port"], {"conn_id": int(conn_id), "host_like": f"%:{port}"})
    return bool(cur.fetchone()[0])


def end_connection(cur, conn_id: int, session: Session | None = None, alive_at: float | None = None,
                   run: float | None = None) -> bool:
    """KILL one of our own earlier connections and wait until the server has ended it (its
    transaction then committed or rolled back, for good). False if it outlived the wait.
    session, alive_at, run: the session `cur` is of, the monotonic time the connection was last
    known to be open, and the server run it was of (Session.server_run). If the server
    restarted since, the connection ended with it, and its id
    may name another client's session now: nothing is killed (a KILL of it killed an
    application's session after a server restart)."""
    if session is not None and alive_at is not None and session.restarted_after(alive_at, run):
        return True
    if session is not None and not connection_is_ours(cur, session, conn_id):
        return True
    try:
        cur.execute(Q["kill_connection"], {"conn_id": int(conn_id)})
    except MySQLdb.OperationalError as e:
        if error_code(e) not in (1094, 1095):  # already gone, or not ours
            raise
    deadline = time.monotonic() + END_CONNECTION_WAIT_S
    delay = 0.005
    while True:
        cur.execute(Q["connection_alive"], {"conn_id": int(conn_id)})
        if not cur.fetchone()[0]:
            return True
        if time.monotonic() >= deadline:
            log.warning("an earlier connection outlived its KILL for %.0fs conn=%d: what it "
                        "claimed returns when its lease ends", END_CONNECTION_WAIT_S, conn_id)
            return False
        time.sleep(delay)  # a rare recovery path: the killed thread ends within milliseconds
        delay = min(delay * 2, 0.5)


def set_paused(session: Session, queue: str, paused: bool) -> bool:
    """Pause or resume; True when the queue did not exist before (it is created in that state)."""
    def body(cur):
        created = ensure_queue(cur, queue)
        cur.execute(Q["set_paused"], {"queue": queue, "paused": int(paused)})
        if not paused:
            bump_signal(cur, queue, 1)  # wake the watcher: there may be work waiting
        return created

    return session.run(body, what="pause" if paused else "resume")


def ready_left(session: Session, queue: str, version: int) -> bool:
    """Whether `queue` has a ready job a consumer of code `version` may run (a limit or a peer's
    claim may hold it: a cron run waits for those, not for jobs too new for it)."""
    def body(cur) -> bool:
        cur.execute(Q["ready_left"], {"queue": queue, "version": version})
        return cur.fetchone() is not None

    return session.run(body, what="ready left")


def claimable_left(session: Session, queue: str, version: int) -> bool:
    """Whether `queue` has a ready or due job a consumer of code `version` may run: after an
    empty claim, jobs another session holds locked (its SKIP LOCKED, and the promotion's, passed
    them over) when nothing else held them back."""
    def body(cur) -> bool:
        cur.execute(Q["claimable_left"], {"queue": queue, "version": version})
        return bool(cur.fetchall())

    return session.run(body, what="claimable left")
