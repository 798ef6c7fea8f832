"""Dedup keys (nq_dedup): which pending job holds a queue's key. Only jobs that carry a key
touch the table, so a plain insert writes no index entry for keys.

A key row names the job that took the key last; the key is held while that job exists and is
pending (ready, scheduled, claimed). A job that ends (done, dead, deleted) frees its key without
a write, and the next job to take the key overwrites the row. Run on the caller's cursor, inside
the transaction that inserts or retries the job: the key's row lock is held until it commits.
"""

from __future__ import annotations

from notifyq.jobs import Status
from notifyq.store.db import Session
from notifyq.store.driver import cut_short
from notifyq.store.sql import QUERIES as Q

SWEEP_CHUNK = 1000
_UNCLAIMED = (int(Status.READY), int(Status.SCHEDULED))


def holder(cur, queue: str, key: str) -> int | None:
    """Lock the key (its row is made if new), then the pending job holding it, or None: free."""
    params = {"queue": queue, "dedup_key": key}
    cur.execute(Q["dedup_lock"], params)
    cur.execute(Q["dedup_holder"], params)
    row = cur.fetchone()
    return None if row is None else int(row[0])


def replaceable(cur, queue: str, key: str) -> int | None:
    """For a put that replaces: lock the key (as holder() does), then the pending job holding
    it; that job's id if it is ready or scheduled (the put replaces it), else None (the key is
    free, or its job is claimed: it runs as it is, and the new job is put beside it)."""
    params = {"queue": queue, "dedup_key": key}
    cur.execute(Q["dedup_lock"], params)
    cur.execute(Q["dedup_replaceable"], params)
    row = cur.fetchone()
    return int(row[0]) if row is not None and int(row[1]) in _UNCLAIMED else None


def drop_replaced(cur, queue: str, key: str, old_id: int, new_id: int, host: str) -> None:
    """Under replaceable()'s locks: the job it found is gone, its record saying by which job
    (`jobs show` and result() tell a caller holding its id), and the key is new_id's."""
    # Plain tuples: on a caller's connection (conn=) there is no Ids converter
    cur.execute(Q["job_record_gone"], {"ids": (old_id,), "statuses": _UNCLAIMED, "outcome": "replaced",
                                       "host": host, "why": f"replaced by job {new_id}, a newer put of dedup key {key!r}"})
    cur.execute(Q["dedup_replaced"], {"id": old_id})
    if cur.rowcount != 1:  # the row is locked and was unclaimed: only a KILL QUERY's OK leaves it
        raise cut_short(f"replaced job {old_id} not deleted")
    take(cur, queue, key, new_id)


def take(cur, queue: str, key: str, job_id: int) -> None:
    """The key is job_id's now; under holder()'s lock, in the same transaction."""
    params = {"queue": queue, "dedup_key": key}
    cur.execute(Q["dedup_take"], {**params, "id": job_id})
    if cur.rowcount == 1:
        return
    # No row changed: the key was this job's already (an operator's retry of it), or a KILL
    # QUERY answered the UPDATE it cut short with OK, which would leave the key free
    cur.execute(Q["dedup_key_job"], params)
    row = cur.fetchone()
    if row is None or int(row[0]) != job_id:
        raise cut_short(f"dedup key of job {job_id} not taken")


def sweep(session: Session, queue: str, after: str = "", chunk: int = SWEEP_CHUNK) -> tuple[int, str]:
    """Delete up to `chunk` key rows of `queue` whose job ended, in key order after `after`:
    (deleted, where the next sweep starts; "" once the queue's keys are all read)."""
    def body(cur) -> tuple[int, str]:
        cur.execute(Q["dedup_free_keys"], {"queue": queue, "after": after, "limit": chunk})
        keys = [row[0] for row in cur.fetchall()]
        if not keys:
            return 0, ""
        cur.execute(Q["dedup_drop_free"], {"queue": queue, "keys": keys})
        return cur.rowcount, keys[-1] if len(keys) == chunk else ""

    return session.run(body, what=f"sweep dedup keys {queue}")
