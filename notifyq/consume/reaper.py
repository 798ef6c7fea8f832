"""Dead-peer recovery: a consumer's session holds its liveness lock; a free lock means it died.

Any consumer may run a pass, but only one at a time cluster-wide (the reaper lock). A dead
consumer's jobs are taken back only while the reaper holds that consumer's own lock, so a
consumer that is merely slow to register can never be robbed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from notifyq.store import locks, queries
from notifyq.store.db import Session

log = logging.getLogger("notifyq.reaper")


@dataclass
class ReapResult:
    dead_consumers: int = 0
    reclaimed: int = 0
    expired: int = 0


def reap(lock_session: Session, work_session: Session, database: str) -> ReapResult | None:
    """One pass; None when another consumer is running one right now."""
    name = locks.reaper_lock(database)
    if queries.get_lock(lock_session, name, 0) != 1:
        return None
    result = ReapResult()
    try:
        for consumer_id, lock_name, queues in queries.dead_consumers(work_session):
            if queries.get_lock(lock_session, lock_name, 0) != 1:
                continue  # its session is back, or another reaper beat us to it
            try:
                n = queries.reclaim_owner(work_session, consumer_id, queues)
            finally:
                queries.release_lock(lock_session, lock_name)
            result.dead_consumers += 1
            result.reclaimed += n
            log.warning("consumer died, jobs returned consumer=%s jobs=%d queues=%s",
                        consumer_id, n, ",".join(queues))
        result.expired = queries.reclaim_expired(work_session)
        if result.expired:
            log.warning("leases expired, jobs returned jobs=%d", result.expired)
    finally:
        queries.release_lock(lock_session, name)
    return result
