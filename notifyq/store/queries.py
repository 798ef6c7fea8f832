"""The hot path's statements: enqueue, claim, outcomes, wake-up locks and bells, consumers and
the reaper. With admin_queries.py (status, metrics, `notifyq jobs`, periodic ticks) the only user
of sql.QUERIES.

Functions that take a cursor run inside a transaction someone else owns (the caller's own
connection for transactional enqueue, or a body passed to Session.run). Functions that take a
Session own their transaction and retry it whole.
"""

from __future__ import annotations

import functools
import random
import secrets
from dataclasses import dataclass
from typing import Any

import MySQLdb
import MySQLdb.cursors
from MySQLdb.constants import CLIENT

from notifyq.jobs import Job
from notifyq.store.db import Ids, Session, error_code
from notifyq.store.sql import QUERIES as Q

SIGNAL_SLOTS = 16  # enough that concurrent producers rarely share a row lock
OVERFETCH = 3  # candidates read per claim, as a multiple of the batch size


def microseconds(seconds: float) -> int:
    return max(0, int(seconds * 1_000_000))


# ---------------------------------------------------------------- enqueue (caller's cursor)

def ensure_queue(cur, queue: str) -> bool:
    """True when the queue's row is new: nothing had used this name before."""
    cur.execute(Q["ensure_queue"], {"queue": queue})
    return cur.rowcount == 1


def bump_signal(cur, queue: str, n: int) -> None:
    cur.execute(Q["bump_signal"], {"queue": queue, "slot": random.randrange(SIGNAL_SLOTS), "n": n})


def insert_jobs(cur, rows: list[tuple], auto_increment_increment: int,
                signal: tuple[str, int] | None = None) -> list[int]:
    """rows: (queue, status, priority, delay_us, max_attempts, payload_json, dedup_key).

    One multi-row INSERT. InnoDB hands a single INSERT of known row count consecutive ids (in
    every autoinc lock mode), spaced by auto_increment_increment, so the ids are computable.
    (executemany() cannot batch this: mysqlclient only rewrites VALUES of bare placeholders,
    and run_at is computed by the server, so that producers' clocks never matter.)

    signal=(queue, n) bumps the queue's signal row by n in the same transaction. On a
    mysqlclient cursor the bump rides in the INSERT's round trip, as a second statement of
    one multi-statement query (mysqlclient enables them by default; every value in both is
    bound, as always): for put() per job that is 2 round trips with the COMMIT instead of 3,
    the same as a bare INSERT + COMMIT. If the INSERT fails the server never runs the bump.
    """
    sql = _insert_sql(len(rows))
    if not isinstance(cur, MySQLdb.cursors.BaseCursor):  # another driver's cursor: its own binding
        cur.execute(sql, [value for r in rows for value in r])
        first = cur.lastrowid
        if signal is not None:
            bump_signal(cur, *signal)
        return [first + i * auto_increment_increment for i in range(len(rows))]
    combine = signal is not None and bool(cur.connection.client_flag & CLIENT.MULTI_STATEMENTS)
    # Bound exactly as cursor.execute(sql, args) binds (connection.literal() per value, then
    # %), but each distinct value is rendered once: in a put_many chunk five of the seven
    # values repeat in every row, and literal() per value was half of a bulk producer's CPU.
    db = cur.connection
    if len(rows) == 1:  # put(): nothing repeats
        args = [db.literal(value) for value in rows[0]]
    else:
        rendered: dict[tuple, bytes] = {}
        args = []
        for row in rows:
            for value in row:
                key = (value.__class__, value)  # the class too: 1 and True are equal keys
                text = rendered.get(key)
                if text is None:
                    text = rendered[key] = db.literal(value)
                args.append(text)
    statement = _encoded(sql, db.encoding) % tuple(args)
    if combine:
        assert signal is not None
        statement += _rendered_bump(db, *signal)
    cur.execute(statement)
    first = cur.lastrowid  # the INSERT's: read before moving on to the bump's result
    if combine:
        cur.nextset()  # the bump's result; raises the bump's error if it failed
    elif signal is not None:  # a caller's connection opened with multi_statements=False
        bump_signal(cur, *signal)
    return [first + i * auto_increment_increment for i in range(len(rows))]


def _rendered_bump(db, queue: str, n: int) -> bytes:
    """";\n" + the bump statement, bound. put() sends one per job, and binding it afresh
    (mogrify) cost 13 us of a producer's ~100 us of CPU per put; the bound text only depends
    on the queue, the slot, n and the connection's charset, so it is rendered once."""
    return _bump_text(db.encoding, db.literal(queue), random.randrange(SIGNAL_SLOTS), n)


@functools.lru_cache(maxsize=1024)
def _bump_text(encoding: str, queue_literal: bytes, slot: int, n: int) -> bytes:
    params = {"queue": queue_literal, "slot": str(slot).encode(), "n": str(int(n)).encode()}
    return b";\n" + Q["bump_signal"].encode(encoding) % {k.encode(): v for k, v in params.items()}


@functools.lru_cache(maxsize=64)
def _encoded(sql: str, encoding: str) -> bytes:
    return sql.encode(encoding)


@functools.lru_cache(maxsize=64)
def _insert_sql(n: int) -> str:
    head, row = Q["insert_job"].split("VALUES", 1)
    return f"{head}VALUES {','.join([row.strip()] * n)}"


def insert_unique_job(cur, row: dict[str, Any]) -> tuple[int, bool]:
    """(id, created): an existing pending job with the same dedup key returns its own id."""
    cur.execute(Q["insert_unique_job"], row)
    return cur.lastrowid, cur.rowcount == 1


# ---------------------------------------------------------------- claim

@dataclass
class Claim:
    jobs: list[Job]
    token: int
    drained: bool  # every ready job seen was taken (by us or a peer): nothing left behind
    paused: bool


def claim(session: Session, queue: str, owner: str, batch_size: int, lease_s: float,
          as_watcher: bool = False) -> Claim:
    """Claim up to batch_size jobs: candidates -> lock by PK with SKIP LOCKED -> mark -> commit.

    Three round trips: the candidate read; the locking read (one per window, usually one);
    the mark with its COMMIT in one multi-statement query (Session.commit_with).
    as_watcher: the watcher's claim. It reads the queue's enqueue count in the candidates'
    round trip, as a statement of its own just before them (READ COMMITTED: a fresh snapshot
    per statement, so every job that count includes is visible to the candidate read), and if
    the claim drains the queue it records that count as watched, in the claim's own COMMIT:
    the next watcher then does not wake for work already taken.
    """
    token = secrets.randbits(63)
    limit = batch_size * OVERFETCH

    def body(cur) -> Claim:
        params = {"queue": queue, "limit": limit}
        seen_seq = None
        if as_watcher:
            statements = [cur.mogrify(Q[name], params) for name in ("signal_total", "claim_candidates")]
            cur.execute(";\n".join(statements))  # one round trip, two statements
            seen_seq = int(cur.fetchone()[0])
            cur.nextset()
        else:
            cur.execute(Q["claim_candidates"], params)
        candidates, paused = [], False
        for job_id, prio_key, run_at in cur.fetchall():
            if job_id == 0:
                paused = True
            else:
                candidates.append((prio_key, run_at, job_id))
        if paused:
            return Claim([], token, True, True)
        candidates.sort()
        ordered = [c[2] for c in candidates]
        locked: list[tuple] = []
        tried = 0
        # Lock windows in priority order, each exactly as large as what is still missing: no
        # LIMIT on the locking read, so InnoDB's primary-key order can never pick a low-priority
        # job over a higher one. Under contention the next window takes over skipped rows.
        while len(locked) < batch_size and tried < len(ordered):
            window = ordered[tried: tried + batch_size - len(locked)]
            tried += len(window)
            cur.execute(Q["claim_lock"], {"ids": Ids(window)})
            locked.extend(cur.fetchall())
        drained = len(candidates) < limit and tried == len(ordered)
        last: list[tuple[str, dict[str, Any]]] = []
        if locked:
            last.append((Q["claim_mark"], {"ids": Ids([r[0] for r in locked]), "owner": owner,
                                           "token": token, "lease_us": microseconds(lease_s)}))
        if drained and seen_seq is not None:
            # Last before COMMIT: the queue row's lock is held only for the commit itself, not
            # also while claim_mark rewrites the batch (a ringing producer updates that row too).
            last.append((Q["mark_watched"], {"queue": queue, "seq": seen_seq}))
        if last:
            session.commit_with(cur, last)
        rank = {job_id: i for i, job_id in enumerate(ordered)}
        locked.sort(key=lambda r: rank[r[0]])
        jobs = [
            Job(id=r[0], queue=queue, payload=r[1], priority=r[2], attempts=r[3] + 1,
                max_attempts=r[4], run_at=r[5], created_at=r[6], dedup_key=r[7])
            for r in locked
        ]
        return Claim(jobs, token, drained, False)

    runs = 0

    def once(cur) -> Claim:
        nonlocal runs
        runs += 1
        if runs > 1:
            # A rerun after a lost connection: if the earlier COMMIT did land, its rows carry
            # this token; hand them back first, or they would sit claimed until their lease ends.
            cur.execute(Q["unclaim_token"], {"owner": owner, "token": token})
        return body(cur)

    return session.run(once, what=f"claim {queue}")


# ---------------------------------------------------------------- outcomes

def ack(session: Session, ids: list[int], token: int, keep: bool) -> int:
    """Success for `ids`; returns how many rows this claim still owned (the rest were lost)."""
    if not ids:
        return 0

    def body(cur) -> int:  # with its COMMIT in one round trip: fenced by token, so idempotent
        statement = Q["ack_keep" if keep else "ack_delete"]
        return session.commit_with(cur, [(statement, {"ids": Ids(ids), "token": token})])[0]

    return session.run(body, what="ack")


def fail(session: Session, queue: str, token: int, failures: list[tuple[int, float | None, str]]) -> int:
    """failures: (id, delay_s or None for dead, error). Returns rows still owned."""
    if not failures:
        return 0

    def body(cur) -> int:
        owned = 0
        retried = 0
        for job_id, delay_s, error in failures:
            if delay_s is None:
                cur.execute(Q["bury"], {"id": job_id, "token": token, "error": error[:65000]})
            else:
                cur.execute(Q["retry_later"], {
                    "id": job_id, "token": token, "error": error[:65000], "delay_us": microseconds(delay_s)})
                retried += cur.rowcount
            owned += cur.rowcount
        if retried:
            bump_signal(cur, queue, retried)  # the watcher's next-due deadline must learn of it
        return owned

    return session.run(body, what="fail")


def give_back(session: Session, queue: str, ids: list[int], token: int) -> int:
    if not ids:
        return 0

    def body(cur) -> int:
        cur.execute(Q["give_back"], {"ids": ids, "token": token})
        if cur.rowcount:
            bump_signal(cur, queue, cur.rowcount)
        return cur.rowcount

    return session.run(body, what="give back")


def extend_lease(session: Session, ids: list[int], token: int, lease_s: float) -> int:
    def body(cur) -> int:
        cur.execute(Q["extend_lease"], {"ids": ids, "token": token, "lease_us": microseconds(lease_s)})
        return cur.rowcount

    return session.run(body, what="extend lease")


# ---------------------------------------------------------------- advisory locks (lock session)

def one_value(session: Session, name: str, params: dict[str, Any], what: str) -> Any:
    def body(cur):
        cur.execute(Q[name], params)
        row = cur.fetchone()
        return row[0] if row else None

    return session.run(body, what=what)


def get_lock(session: Session, name: str, wait_s: float) -> int | None:
    """1 got it, 0 timed out, None interrupted (KILL QUERY) or error. Never a negative wait."""
    return one_value(session, "get_lock", {"name": name, "wait_s": max(0.0, wait_s)}, "get_lock")


def release_lock(session: Session, name: str) -> int | None:
    return one_value(session, "release_lock", {"name": name}, "release_lock")


def release_lock_later(session: Session, name: str) -> None:
    """RELEASE_LOCK without waiting for the reply (Session.send_later)."""
    session.send_later(Q["release_lock_later"], {"name": name})


def lock_holder(session: Session, name: str) -> int | None:
    """The connection id holding `name`, or None."""
    return one_value(session, "lock_holder", {"name": name}, "lock_holder")


def kill_query(session: Session, conn_id: int) -> bool:
    """Interrupt another session's statement (our own user's only, unless CONNECTION ADMIN)."""
    try:
        session.conn.cursor().execute(Q["kill_query"], {"conn_id": int(conn_id)})
        return True
    except MySQLdb.Error as e:
        if error_code(e) in (1094, 1095):  # no such thread / not ours: nothing to wake
            return False
        raise


@dataclass
class WatchState:
    total: int
    watched: int
    paused: bool
    bell: int
    reap: int
    due_in_s: float | None
    waited: int | None


def watch(session: Session, queue: str, bells: tuple[str, str], wait_s: float,
          use_bell: bool = True) -> WatchState:
    def body(cur) -> WatchState:
        try:
            cur.execute(Q["watch"], {"queue": queue, "bell0": bells[0], "bell1": bells[1],
                                     "wait_s": max(0.0, wait_s), "use_bell": int(use_bell)})
        except MySQLdb.OperationalError as e:
            if error_code(e) != 1317:
                raise
            # KILL QUERY interrupted our SLEEP: a wake-up (or a stop), not an error to retry.
            return WatchState(-1, 0, False, 0, 0, None, None)
        row = cur.fetchone()
        if row is None:  # queue row missing (a fresh database): make it and report nothing new
            ensure_queue(cur, queue)
            return WatchState(0, 0, False, 0, 0, None, None)
        total, watched, paused, bell, reap, due_in_us, waited = row
        return WatchState(int(total), int(watched), bool(paused), int(bell), int(reap or 0),
                          None if due_in_us is None else due_in_us / 1e6,
                          None if waited is None else int(waited))

    return session.run(body, what="watch")


def poll_signal(session: Session, queue: str) -> tuple[int, bool, float | None]:
    """(enqueue count, paused, seconds until the earliest scheduled job or None)."""
    def body(cur):
        cur.execute(Q["poll_signal"], {"queue": queue})
        total, paused, due_in_us = cur.fetchone()
        return int(total), bool(paused), None if due_in_us is None else due_in_us / 1e6

    return session.run(body, what="poll signal")


HOLD_SESSION_S = 7 * 86400  # a lock session may idle this long (a vanished host: TCP keepalive)


def hold_session(session: Session) -> None:
    session.run(lambda cur: cur.execute(Q["hold_session"], {"wait_s": HOLD_SESSION_S}),
                what="hold session")


def read_bell(cur, queue: str) -> int:
    cur.execute(Q["read_bell"], {"queue": queue})
    row = cur.fetchone()
    return int(row[0]) if row else 0


def set_bell(cur, queue: str, bell: int) -> None:
    cur.execute(Q["set_bell"], {"queue": queue, "bell": bell})


def set_paused(session: Session, queue: str, paused: bool) -> bool:
    """Pause or resume; True when the queue did not exist before (it is created in that state)."""
    def body(cur):
        created = ensure_queue(cur, queue)
        cur.execute(Q["set_paused"], {"queue": queue, "paused": int(paused)})
        if not paused:
            bump_signal(cur, queue, 1)  # wake the watcher: there may be work waiting
        return created

    return session.run(body, what="pause" if paused else "resume")


# ---------------------------------------------------------------- consumers and the reaper

def register_consumer(session: Session, consumer_id: str, lock_name: str, host: str, pid: int,
                      queues: list[str], wakeup: str) -> None:
    def body(cur):
        for queue in queues:
            ensure_queue(cur, queue)
        cur.execute(Q["register_consumer"], {
            "id": consumer_id, "lock_name": lock_name, "host": host[:255], "pid": pid,
            "queues": ",".join(queues)[:1024], "wakeup": wakeup})

    session.run(body, what="register consumer")


def touch_consumer(session: Session, consumer_id: str, wakeup: str) -> None:
    session.run(lambda cur: cur.execute(Q["touch_consumer"], {"id": consumer_id, "wakeup": wakeup}),
                what="touch consumer")


def unregister_consumer(session: Session, consumer_id: str) -> None:
    session.run(lambda cur: cur.execute(Q["unregister_consumer"], {"id": consumer_id}),
                what="unregister consumer")


def reap_needed(session: Session) -> int:
    return int(one_value(session, "reap_needed", {}, "reap check") or 0)


def dead_consumers(session: Session) -> list[tuple[str, str, list[str]]]:
    def body(cur):
        cur.execute(Q["dead_consumers"])
        return [(cid, lock, [q for q in queues.split(",") if q]) for cid, lock, queues in cur.fetchall()]

    return session.run(body, what="find dead consumers")


def reclaim_owner(session: Session, consumer_id: str, queues: list[str]) -> int:
    """Return a dead consumer's claimed jobs and drop its registration, in one transaction."""
    def body(cur) -> int:
        cur.execute(Q["reclaim_owner"], {"owner": consumer_id,
                                         "error": "consumer died; out of attempts"})
        n = cur.rowcount
        for queue in queues:  # wake the watchers even for n == 0: a dead claim may have hidden work
            bump_signal(cur, queue, max(n, 1))
        cur.execute(Q["unregister_consumer"], {"id": consumer_id})
        return n

    return session.run(body, what="reclaim dead consumer")


def reclaim_expired(session: Session) -> int:
    def body(cur) -> int:
        cur.execute(Q["expired_leases"])
        rows = cur.fetchall()
        if not rows:
            return 0
        cur.execute(Q["reclaim_expired"], {"ids": [r[0] for r in rows],
                                           "error": "lease expired; out of attempts"})
        n = cur.rowcount
        for queue in {r[1] for r in rows}:
            bump_signal(cur, queue, max(n, 1))
        return n

    return session.run(body, what="reclaim expired leases")
