"""Dead-peer recovery: what a consumer that is gone still holds comes back to the queue.

A lock-mode consumer's session holds its liveness lock; a free lock means it died. A polling
consumer holds no lock (wakeup.use_locks = false, or the server refused locks): it is judged by
its heartbeat (heartbeat.py), and never by the free lock
of a lock it never took. Any lease that runs out comes back as well, whoever held it.

Any consumer may run a pass. A pass runs on a session of its own, opened for the pass and
closed after it, whose server-side idle timeout is short (REAPER_IDLE_TIMEOUT_S): a host that
vanishes mid-pass (power loss, no FIN) frees the reaper lock, and any dead peer's lock it took,
within that bound instead of the server's wait_timeout (8 h by default). The reaper lock only
keeps passes from repeating each other's work; correctness never rests on it: each verdict
is taken inside the reclaim's own transaction (liveness.reclaim_owner), so two passes, or a
pass whose session reconnected, cannot take back the jobs of a consumer that is alive.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from notifyq.config import DSN
from notifyq.store import advisory, liveness, locks, workflows
from notifyq.store.db import Session

log = logging.getLogger("notifyq.reaper")

# A pass's statements follow each other at once; a pass session idle this long belongs to a
# host that stalled or vanished. Too short costs nothing but a repeated pass.
REAPER_IDLE_TIMEOUT_S = 10
# A pass runs for milliseconds: a reaper lock one session has held this long is a stalled
# process's (SIGSTOP, a host frozen mid-pass), whose session the server ends only after
# REAPER_IDLE_TIMEOUT_S of silence. Passes then go on without the lock (it only keeps them from
# repeating each other's work): in the fault schedule's long run, stalled processes that held it
# one after another kept a dead consumer's jobs claimed for 22 s.
PASS_STUCK_S = 2.0


class HeldLock:
    """A process's view of the reaper lock when its passes found it taken: which session held it,
    since when (monotonic)."""

    def __init__(self) -> None:
        self.holder: int | None = None
        self.since = 0.0

    def stuck(self, holder: int | None, now: float) -> bool:
        """Whether `holder`, holding the lock now, has held it for PASS_STUCK_S as far as this
        process has seen (a new holder starts the count)."""
        if holder is None or holder != self.holder:
            self.holder, self.since = holder, now
            return False
        return now - self.since >= PASS_STUCK_S


@dataclass
class ReapResult:
    """What one reaper pass did."""

    dead_consumers: int = 0
    reclaimed: int = 0
    expired: int = 0
    settled: int = 0  # workflow parents whose ends the sweep settled


REAPER_RETRY_S = 10.0  # a pass's connect retry, at most: the next pass is due soon anyway
EXPIRED_SHOWN = 50  # the jobs a "leases expired" line names (with their owners)


def open_session(dsn: DSN) -> Session:
    return Session(dsn, name="reaper", retry_s=REAPER_RETRY_S, idle_timeout_s=REAPER_IDLE_TIMEOUT_S)


def reap_once(dsn: DSN, use_locks: bool = True, judge_silence: bool = True, *,
              own_id: str = "", restart_grace_s: float = 0.0, held: HeldLock | None = None,
              retry_s: float = REAPER_RETRY_S) -> ReapResult | None:
    """One pass on a fresh session; None when another consumer is running one right now.
    retry_s: its connect retry at most (a consumer's connect_retry_s, when shorter: a pass on
    a worker's thread must not keep it past the process's own give-up)."""
    session = open_session(dsn)
    session.retry_s = min(session.retry_s, retry_s)
    try:
        return reap(session, dsn.database, use_locks, judge_silence,
                    own_id=own_id, restart_grace_s=restart_grace_s, held=held)
    finally:
        session.close()


def reap(session: Session, database: str, use_locks: bool = True, judge_silence: bool = True, *,
         own_id: str = "", restart_grace_s: float = 0.0, held: HeldLock | None = None) -> ReapResult | None:
    """One pass on `session`. use_locks=False (no advisory locks on this server, or not wanted):
    stale polling consumers and expired leases only; dead lock-mode consumers then come back
    through their leases.

    judge_silence=False: the calling process's own heartbeat has not landed steadily for long
    (Heartbeat.steady_s): it has just come out of an outage, which, as a rule, silenced the
    others too (a server restart, a Galera cluster without a primary component). Then nobody is
    judged by silence: not by heartbeat, and on a Galera node not by a free lock either (which
    needs a silent heartbeat there, liveness.GALERA_LOCK_GRACE_S). Free locks on one server, and
    expired leases, are still judged.

    own_id: the calling process's own consumer id, never judged. A process running a pass is
    alive whatever its liveness lock says: the lock reads as free while the process's liveness
    session is lost or reconnecting, and a pass run then (a reap hint that came on another
    session) took the process's own jobs back while its handlers still ran them.

    restart_grace_s: a server up for less than this judges by a free lock or a silent heartbeat
    only the consumers that talked to it since it started. A restart frees every liveness lock
    at once, and a busy consumer takes its own back only when its liveness session next talks
    (a keeper ping, every session_idle_s / 4): a reaper that came back first took two live
    consumers' running jobs back. One that died since the start, or before it but has not come
    back within the grace, is judged as ever; expired leases need no liveness session.

    held: what this process saw of the reaper lock before; with it, a lock one session has held
    for PASS_STUCK_S (a stalled process's) does not stop the pass."""
    name = locks.reaper_lock(database)
    locked = use_locks and advisory.get_lock(session, name, 0) == 1
    if use_locks and not locked:
        holder = advisory.lock_holder(session, name)
        if held is None or not held.stuck(holder, time.monotonic()):
            return None
        log.info("the reaper lock is held by a pass that has not ended for %g s or more (its process "
                 "stalled): this pass goes on without it holder=%s", PASS_STUCK_S, holder)
    result = ReapResult()
    try:
        if use_locks and (judge_silence or not session.galera):
            for consumer_id, lock_name, queues in liveness.dead_consumers(session, restart_grace_s):
                if consumer_id == own_id:
                    continue
                try:
                    n = liveness.reclaim_owner(session, consumer_id, queues, lock_name=lock_name,
                                              restart_grace_s=restart_grace_s)
                finally:
                    advisory.release_lock(session, lock_name)
                _count(result, consumer_id, queues, n, "consumer died")
        for consumer_id, queues in liveness.stale_consumers(session, restart_grace_s) if judge_silence else ():
            if consumer_id == own_id:
                continue
            n = liveness.reclaim_owner(session, consumer_id, queues, restart_grace_s=restart_grace_s)
            _count(result, consumer_id, queues, n, "polling consumer's heartbeat stopped")
        if use_locks and not session.galera and session.server_up_s() >= restart_grace_s:
            _reap_orphans(session, database, own_id, result)
        taken: list[tuple[int, str]] = []
        result.expired = liveness.reclaim_expired(session, taken)
        if result.expired:
            # Which jobs, and whose claims (a live consumer's, its outcomes late, runs them twice):
            # from=OWNER:ID,ID;OWNER:ID
            by_owner: dict[str, list[int]] = {}
            for job_id, owner in taken[:EXPIRED_SHOWN]:
                by_owner.setdefault(owner, []).append(job_id)
            log.warning("leases expired, jobs returned jobs=%d from=%s", result.expired,
                        ";".join(f"{owner}:{','.join(map(str, ids))}" for owner, ids in sorted(by_owner.items())))
        # Workflow children whose parents ended with no transaction settling them (a burial
        # here, a cancel before a start, a release a KILL QUERY cut short): settled now
        result.settled = workflows.settle(session)
        if result.settled:
            log.info("workflow parents settled by the sweep parents=%d", result.settled)
    finally:
        if locked:
            advisory.release_lock(session, name)
    return result


def _reap_orphans(session: Session, database: str, own_id: str, result: ReapResult) -> None:
    """Claims whose owner has no registration and whose lock is free: a consumer that left
    holding them ("Nothing stays claimed by a consumer that is gone"), not only when their lease
    runs out. Judged by the lock only on its own server, so never on a Galera node (a lock on
    another node reads free here: those come back by their lease), nor within a restart grace
    (every lock is free then while live consumers take theirs back)."""
    for owner in liveness.orphan_owners(session):
        if owner == own_id:
            continue
        lock_name = locks.consumer_lock(database, owner)
        try:
            n = liveness.reclaim_orphan(session, owner, lock_name)
        finally:
            advisory.release_lock(session, lock_name)
        if n is not None:
            result.reclaimed += n
            log.warning("jobs claimed by a consumer that is gone returned consumer=%s jobs=%d", owner, n)


def _count(result: ReapResult, consumer_id: str, queues: list[str], n: int | None, why: str) -> None:
    if n is None:
        return  # alive after all (its session is back, or another reaper beat us to it)
    result.dead_consumers += 1
    result.reclaimed += n
    log.warning("%s, jobs returned consumer=%s jobs=%d queues=%s", why, consumer_id, n, ",".join(queues))
