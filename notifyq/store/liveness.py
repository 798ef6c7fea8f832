"""Consumer registration and liveness: the nq_consumer rows, the polling heartbeat, and the
reaper's questions (who is dead, who is stale), and taking back what the dead held
(reclaim_owner, reclaim_expired).

A consumer is judged by what it has: a lock-mode consumer by its liveness lock (its session
holds it; free means the session is gone), a polling consumer by its heartbeat (no lock was
ever taken: IS_FREE_LOCK would call it dead while it runs).

Advisory locks are local to one server. On a Galera cluster a consumer records the server its
lock lives on (`node`), a reaper judges by the lock only the consumers whose lock lives on its
own server, and the others by their heartbeat, which lock-mode consumers on a Galera node beat
as polling ones do (consume/heartbeat.py). The SQL compares `node` with the reaper session's own
CONCAT(@@hostname, ':', @@port) (db.NODE_IDENTITY_SQL), so no query needs to be told its server.
On a Galera node even the reaper that shares the consumer's node takes a free lock for death only
once the heartbeat is silent too (GALERA_LOCK_GRACE_S): a node that leaves the primary
component and comes back breaks its clients' connections, and frees the locks of processes alive
and reconnecting.
"""

from __future__ import annotations

from notifyq.store import queries
from notifyq.store.db import Session
from notifyq.store.driver import Ids, cut_short
from notifyq.store.queries import microseconds
from notifyq.store.signal import bump_signal
from notifyq.store.sql import QUERIES as Q

# A consumer without a liveness lock (polling) is dead once its heartbeat is this old. Its
# heartbeat (consume/heartbeat.py) beats several times inside it.
POLLING_STALE_S = 30.0
# On a Galera node a lock-mode consumer whose lock is free is dead only once its heartbeat (which
# every consumer on a Galera node beats, every 5 s: consume/heartbeat.py) is also this old. Its
# liveness session's connection breaks when its node leaves the primary component or is KILLed,
# and for the moment the session takes to come back the lock is free while the process lives;
# its heartbeat, which goes on beating on its own session, says so. Three beats: an outage
# shorter than a beat may miss the reaper's own beats (so that it judges on) and still hold up a
# peer's for as long plus its reconnect, about two beats in all. An outage that silences every
# heartbeat, the reaper's too, is the reaper's to allow for (reaper.reap, judge_silence).
# The price: a consumer that died on a Galera node has its jobs back this much later.
GALERA_LOCK_GRACE_S = 15.0


def lock_grace_us(session: Session) -> int:
    """How long, on the session's server, a free liveness lock must go with the heartbeat silent
    too before it means death: GALERA_LOCK_GRACE_S on a Galera node, else 0 (the lock's word)."""
    return microseconds(GALERA_LOCK_GRACE_S) if session.galera else 0


def restarted_since_s(session: Session, cur, grace_s: float) -> int | None:
    """If the session's server started less than `grace_s` ago (a reaper's restart grace:
    consume/reaper.py), the first whole second of its clock that began after it started (since
    the epoch): a last_seen from then on was written to this server, not to the one before the
    restart. Else None. Asked on `cur` inside a transaction's body, so that a body rerun on a new
    connection asks the server it now talks to.

    The server counts its Uptime from the second it started to the second of the statement, both
    on its own clock: read between two reads of its clock in the same second, that second less
    the Uptime is the second it started in (across a second's turn, twice in a row, one later:
    never sooner). The second after it, not the start itself: the server before a restart may
    have written rows in the second the restarted one started in. A consumer that took its lock
    back in that first second says so by a touch after it (Presence: RETOUCH_AFTER_S). (A
    reaper's estimate from Uptime alone, Session.server_up_s, is up to two seconds short:
    consumers that came back then kept the grace, and those that died their jobs until it ended.)"""
    if session.server_up_s() >= grace_s:
        return None  # (short of the truth: no statement once the grace has surely ended)
    for _ in range(2):
        cur.execute(Q["server_clock"])
        before_s = int(cur.fetchone()[0])
        cur.execute(Q["server_uptime"])
        uptime_s = int(cur.fetchone()[1])
        cur.execute(Q["server_clock"])
        after_s = int(cur.fetchone()[0])
        if after_s == before_s:
            break
    return after_s - uptime_s + 1


def first_second_left_s(session: Session) -> float | None:
    """How long until the session's server's clock reaches restarted_since_s, if the server
    started less than two seconds ago (else None): a row written to it before then may read to a
    reaper as written before a restart (Presence touches its row again then)."""
    def body(cur) -> float | None:
        since_s = restarted_since_s(session, cur, 2.0)  # (server_up_s is up to two seconds short)
        if since_s is None:
            return None
        cur.execute(Q["server_clock_us"])
        return max(0.0, since_s - float(cur.fetchone()[0]))

    return session.run(body, what="server start")


def register_consumer(session: Session, consumer_id: str, lock_name: str, host: str, pid: int,
                      queues: list[str], wakeup: str, node: str = "", flow: str | None = None) -> None:
    """node: the server the liveness lock lives on (the lock session's Session.node); flow: the
    flow settings it applies per queue, JSON (None: not recorded, shown as unknown)."""
    def body(cur):
        for queue in queues:
            queries.ensure_queue(cur, queue)
        cur.execute(Q["register_consumer"], {
            "id": consumer_id, "lock_name": lock_name, "host": host[:255], "pid": pid,
            "queues": ",".join(queues)[:1024], "wakeup": wakeup,
            "node": node[:320], "flow": flow})

    session.run(body, what="register consumer")


def record_consumer_flow(session: Session, consumer_id: str, flow: str) -> None:
    """The flow settings a registered consumer applies from now on (after a reload changed them)."""
    session.run(lambda cur: cur.execute(Q["record_consumer_flow"], {"id": consumer_id, "flow": flow}),
                what="record consumer flow settings")


def touch_consumer(session: Session, consumer_id: str, wakeup: str) -> None:
    session.run(lambda cur: cur.execute(Q["touch_consumer"], {"id": consumer_id, "wakeup": wakeup}),
                what="touch consumer")


def unregister_unclaiming(session: Session, consumer_id: str) -> bool:
    """A consumer's row gone at its exit, unless it still holds claims (then False): the reaper
    takes them back once its lock is free (queries.sql, claims_left)."""
    def body(cur) -> bool:
        cur.execute(Q["claims_left"], {"id": consumer_id})
        if cur.fetchone()[0]:
            return not _row_exists(cur, consumer_id)  # (a reaper took the row already)
        cur.execute(Q["unregister_consumer"], {"id": consumer_id})
        return True

    return session.run(body, what="unregister consumer")


def mark_stopping(session: Session, consumer_id: str) -> None:
    """The consumer was asked to stop (queries.sql, mark_stopping)."""
    session.run(lambda cur: cur.execute(Q["mark_stopping"], {"id": consumer_id}), what="mark stopping")


def heartbeat(session: Session, consumer_id: str, wakeup: str) -> bool:
    """A polling consumer's beat: its row's last_seen (no lease: heartbeat.py says why). False
    when the row is gone (a reaper judged it dead): the worker must re-register."""
    def body(cur) -> bool:
        cur.execute(Q["heartbeat"], {"id": consumer_id, "wakeup": wakeup})
        if cur.rowcount == 0 and not _row_exists(cur, consumer_id):
            return False  # (rowcount is 0 as well when last_seen did not change)
        return True

    return session.run(body, what="heartbeat")


def _row_exists(cur, consumer_id: str) -> bool:
    cur.execute(Q["consumer_exists"], {"id": consumer_id})
    return cur.fetchone() is not None


def reap_needed(session: Session) -> int:
    return int(queries.one_value(session, "reap_needed", {"stale_us": microseconds(POLLING_STALE_S)},
                         "reap check") or 0)


def dead_consumers(session: Session, restart_grace_s: float = 0.0) -> list[tuple[str, str, list[str]]]:
    """Lock-mode consumers whose liveness lock is free: (id, lock name, queues). On a server that
    started less than restart_grace_s ago, only those that talked to it since."""
    def body(cur):
        cur.execute(Q["dead_consumers"], {"grace_us": lock_grace_us(session),
                                          "since_s": restarted_since_s(session, cur, restart_grace_s)})
        return [(cid, lock, _queues(queues)) for cid, lock, queues in cur.fetchall()]

    return session.run(body, what="find dead consumers")


def stale_consumers(session: Session, restart_grace_s: float = 0.0) -> list[tuple[str, list[str]]]:
    """Polling consumers whose heartbeat stopped: (id, queues). restart_grace_s: as in dead_consumers."""
    def body(cur):
        cur.execute(Q["stale_consumers"], {"stale_us": microseconds(POLLING_STALE_S),
                                           "since_s": restarted_since_s(session, cur, restart_grace_s)})
        return [(cid, _queues(queues)) for cid, queues in cur.fetchall()]

    return session.run(body, what="find stale consumers")


def gone_claims_due_s(session: Session, queue: str) -> float | None:
    """Seconds until the earliest lease of `queue`'s jobs held by an owner that is gone runs out
    (0 if one has already); None when no gone owner holds any (queries.sql, gone_claims_due)."""
    def body(cur) -> float | None:
        cur.execute(Q["gone_claims_due"], {"queue": queue})
        row = cur.fetchone()
        return None if row is None or row[0] is None else max(0.0, int(row[0]) / 1_000_000)

    return session.run(body, what="find claims of gone consumers")


def _queues(text: str) -> list[str]:
    return [q for q in text.split(",") if q]


# ---------------------------------------------------------------- taking back what the dead held

def take_back(cur, held: list[tuple[int, int]], why: str, stopping: bool = False) -> int:
    """Return claimed jobs, locked by the caller: held is (id, claim token) rows.

    A job alone of its claim keeps its attempt (out of attempts: dead); jobs of one claim taken
    back together are not charged. Every one becomes a suspect, claimed alone from then on.
    stopping: their consumer had been asked to stop (a deploy) when it died: none is charged,
    each attempt recorded 'interrupted' (a crash with no stop asked is charged as above, so a
    job that kills its consumer every time still ends dead)."""
    per_claim: dict[int, list[int]] = {}
    for job_id, token in held:
        per_claim.setdefault(token, []).append(job_id)
    alone = [] if stopping else [ids[0] for ids in per_claim.values() if len(ids) == 1]
    shared = [job_id for ids in per_claim.values() if len(ids) > 1 or stopping for job_id in ids]
    reasons = {"error": f"{why}; out of attempts", "cancelled": f"cancelled; {why} while it ran"}
    n = 0
    for name, ids in (("return_alone", alone), ("return_shared", shared)):
        if ids:
            # the attempt's record first (issue 29): alone it is charged, together it is not
            if stopping:
                record = {"why": f"interrupted: {why} after it was asked to stop, not charged",
                          "outcome": "interrupted"}
            elif name == "return_alone":
                record = {"why": why, "outcome": "taken back"}
            else:
                record = {"why": f"{why}; taken back with its claim, not charged", "outcome": "taken back"}
            cur.execute(Q["attempt_taken_back"], {"ids": Ids(ids), **record})
            cur.execute(Q[name], {"ids": Ids(ids), **reasons})
            if cur.rowcount != len(ids):
                # Locked by the caller, claimed: each one changes. Fewer is a KILL QUERY's OK
                # reply to a statement it cut short: its records must not commit without it.
                raise cut_short(f"take back {len(ids)} jobs: {cur.rowcount} returned")
            n += cur.rowcount
    counted = [job_id for job_id, token in held if queries.counted_token(token)]
    if counted:
        queries.forget_counters_of_jobs(cur, counted)
    return n


def lock_whole_claims(cur, seen: list[tuple[int, int]], statement: str, params: dict) -> tuple[list[tuple[int, int]], bool]:
    """Lock the claimed rows a plain read found (`seen`: (id, claim token)) by primary key with
    `statement`, skipping any that another transaction holds: a peer's ack or extension under
    way, another reaper's pass, a process stopped with its transaction open (never waited for:
    a wait here held up every other claim a pass takes back, for the lock wait timeout). Of each
    claim, all its rows seen or none (take_back charges a job alone of its claim): a claim with
    a row skipped, gone or claimed anew is left to a later pass, its other rows unlocked at the
    COMMIT. Returns (the rows locked, of whole claims; whether a claim was left)."""
    if not seen:
        return [], False
    cur.execute(Q[statement], {**params, "ids": Ids(sorted(job_id for job_id, _ in seen))})
    locked = dict(cur.fetchall())
    per_claim: dict[int, list[int]] = {}
    for job_id, token in seen:
        per_claim.setdefault(token, []).append(job_id)
    whole = [(job_id, token) for token, ids in per_claim.items()
             if all(locked.get(job_id) == token for job_id in ids) for job_id in ids]
    return whole, len(whole) < len(seen)


def reclaim_owner(session: Session, consumer_id: str, queues: list[str],
                  lock_name: str | None = None, restart_grace_s: float = 0.0) -> int | None:
    """Return a dead consumer's claimed jobs and drop its registration, in one transaction.

    The verdict is taken inside that transaction, on its session, so it cannot go stale before
    the COMMIT: with `lock_name` (a lock-mode consumer) GET_LOCK(lock, 0) must succeed, and the
    lock is held until after the COMMIT (the caller releases it); without (a polling consumer)
    its row must still be stale when deleted. If the session reconnects midway, the transaction
    is rolled back and the lock gone together, and the rerun judges again: a consumer that took
    its lock back meanwhile keeps its jobs. (The lock on another session would be lost by that
    session's reconnect while the reclaim went on.) Never waits: nobody
    queues for a liveness lock, so holding one next to row locks cannot hide a deadlock.
    None: the consumer is alive after all.
    """
    def body(cur) -> int | None:
        if lock_name is not None:
            cur.execute(Q["get_lock"], {"name": lock_name, "wait_s": 0})
            if cur.fetchone()[0] != 1:
                return None
            cur.execute(Q["consumer_alive_after_all"], {
                "id": consumer_id, "grace_us": lock_grace_us(session),
                "since_s": restarted_since_s(session, cur, restart_grace_s)})
            if cur.fetchone() is not None:
                return None  # its lock lives on another server now, or its heartbeat is fresh (liveness.py)
        else:
            cur.execute(Q["drop_stale_consumer"], {"id": consumer_id,
                                                   "stale_us": microseconds(POLLING_STALE_S),
                                                   "since_s": restarted_since_s(session, cur, restart_grace_s)})
            if cur.rowcount == 0:
                return None
        cur.execute(Q["consumer_stopping"], {"id": consumer_id})
        row = cur.fetchone()
        stopping = bool(row and row[0])  # asked to stop first: its jobs were interrupted, not crashed on
        cur.execute(Q["claims_of_owner"], {"owner": consumer_id})
        held, left = lock_whole_claims(cur, list(cur.fetchall()), "claims_lock", {"owner": consumer_id})
        n = take_back(cur, held, "consumer died", stopping)
        for queue in queues:  # wake the watchers even for n == 0: a dead claim may have hidden work
            bump_signal(cur, queue, max(n, 1))
        if not left:  # else its registration stays: the next pass judges it again, for the rest
            # (a polling consumer's went with its verdict: the rest come back as orphans or by lease)
            cur.execute(Q["unregister_consumer"], {"id": consumer_id})
        return n

    return session.run(body, what="reclaim dead consumer")


def orphans_exist(session: Session) -> bool:
    return bool(queries.one_value(session, "orphans_exist", {}, "orphan check"))


def orphan_owners(session: Session) -> list[str]:
    """Owners of claimed jobs that have no registration (queries.sql, orphan_owners)."""
    def body(cur) -> list[str]:
        cur.execute(Q["orphan_owners"])
        return [owner for (owner,) in cur.fetchall()]

    return session.run(body, what="find orphan claims")


def reclaim_orphan(session: Session, owner: str, lock_name: str) -> int | None:
    """Return the claimed jobs of an owner with no registration whose liveness lock is free:
    it left (or was judged dead) and nobody holds its id. The verdict in the transaction, as in
    reclaim_owner: GET_LOCK(lock, 0) must succeed (held until after the COMMIT; the caller
    releases it), so a consumer that is taking that id back right now (its lock first, then its
    row: Presence._register) either holds the lock, and keeps its claims, or cannot take it
    until they are back. Its row must still be missing. None: not an orphan after all.
    Only for owners in lock mode's sense: a polling consumer holds no lock, and an alive one
    has a row (one whose row a reaper took has been judged dead already)."""
    def body(cur) -> int | None:
        cur.execute(Q["get_lock"], {"name": lock_name, "wait_s": 0})
        if cur.fetchone()[0] != 1:
            return None
        if _row_exists(cur, owner):
            return None
        cur.execute(Q["orphan_claims"], {"owner": owner})
        rows = cur.fetchall()
        held, _ = lock_whole_claims(cur, [(job_id, token) for job_id, token, _ in rows], "claims_lock",
                                    {"owner": owner})  # a claim left stays an orphan: a later pass
        n = take_back(cur, held, "its consumer is gone")
        for queue in sorted({queue for _, _, queue in rows}):
            bump_signal(cur, queue, max(n, 1))
        return n

    return session.run(body, what="reclaim orphan claims")


def reclaim_expired(session: Session, taken: list[tuple[int, str]] | None = None) -> int:
    """Take back the claims whose lease ran out; returns how many jobs. taken: a list that
    receives each job taken back, (id, its owner), as committed (for the reaper's line)."""
    def body(cur) -> int:
        if taken is not None:
            del taken[:]  # (a rerun's: only the committed attempt's count)
        cur.execute(Q["expired_leases"])
        rows = cur.fetchall()
        if not rows:
            return 0
        owners = tuple({r[0] for r in rows})
        cur.execute(Q["claims_expired"], {"owners": owners})
        seen = cur.fetchall()
        held, _ = lock_whole_claims(cur, [(job_id, token) for job_id, token, _ in seen], "claims_expired_lock", {})
        stopping: set[str] = set()
        if held:  # (nothing to take back: no owner to ask about)
            cur.execute(Q["owners_stopping"], {"owners": owners})
            stopping = {owner for (owner,) in cur.fetchall()}
        # A consumer asked to stop whose jobs were left claimed (it exited unsettled, the server
        # away at its grace's end): interrupted by a deploy, not charged, as at its death
        interrupted = {job_id for job_id, _, owner in seen if owner in stopping}
        n = take_back(cur, [r for r in held if r[0] not in interrupted], "lease expired")
        n += take_back(cur, [r for r in held if r[0] in interrupted], "lease expired", stopping=True)
        if taken is not None:
            owner_of = {job_id: owner for job_id, _, owner in seen}
            taken.extend((job_id, owner_of[job_id]) for job_id, _ in held)
        for queue in {r[1] for r in rows}:
            bump_signal(cur, queue, max(n, 1))
        return n

    return session.run(body, what="reclaim expired leases")
