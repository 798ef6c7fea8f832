"""The statements of notifyq.testing (sql/testing.sql): an app's tests look at a queue's jobs,
make its delayed jobs due, see where the jobs a drain ran ended, and clear a queue between tests.

Apart from the named queries of queries.sql on purpose: nothing here is on a consumer's or a
producer's path, and the unit test that every statement there has a runner stays about them.
Every value is bound; queue names were checked by the caller (config.validate_queue_name).
"""

from __future__ import annotations

import os
from typing import Any

from notifyq.store import sql
from notifyq.store.db import Session
from notifyq.store.driver import Ids

with open(os.path.join(os.path.dirname(sql.__file__), "testing.sql"), encoding="utf-8") as _f:
    STATEMENTS = sql.parse(_f.read())

JOB_FIELDS = ("id", "queue", "status", "priority", "run_at", "attempts", "max_attempts", "dedup_key",
              "payload", "last_error", "created_at", "key")
_CLEARS = ("testing_clear_jobs", "testing_clear_attempts", "testing_clear_dedup", "testing_clear_periodic",
           "testing_resume")


def _jobs_params(queue: str, statuses: tuple[int, ...], limit: int) -> dict[str, Any]:
    # A plain tuple, rendered `(0,1)` by mysqlclient: the caller's connection has no Ids converter.
    return {"queue": queue, "statuses": tuple(int(s) for s in statuses), "limit": int(limit)}


def jobs(session: Session, queue: str, statuses: tuple[int, ...], limit: int) -> list[tuple]:
    """Rows of JOB_FIELDS, oldest first, on notifyq's own session (committed jobs only)."""
    def body(cur) -> list[tuple]:
        cur.execute(STATEMENTS["testing_jobs"], _jobs_params(queue, statuses, limit))
        return list(cur.fetchall())

    return session.run(body, what="list jobs")


def jobs_on(raw_conn: Any, queue: str, statuses: tuple[int, ...], limit: int) -> list[tuple]:
    """The same read on the caller's DB-API connection, inside whatever transaction it has open
    (its own uncommitted puts included); nothing is committed or rolled back here."""
    cur = raw_conn.cursor()
    try:
        cur.execute(STATEMENTS["testing_jobs"], _jobs_params(queue, statuses, limit))
        return list(cur.fetchall())
    finally:
        cur.close()


def statuses(session: Session, ids: list[int]) -> dict[int, tuple[int, int]]:
    """id -> (status, attempts) of the jobs that still have a row."""
    if not ids:
        return {}

    def body(cur) -> dict[int, tuple[int, int]]:
        cur.execute(STATEMENTS["testing_statuses"], {"ids": Ids(ids)})
        return {int(r[0]): (int(r[1]), int(r[2])) for r in cur.fetchall()}

    return session.run(body, what="read job statuses")


def run_delayed(session: Session, queue: str) -> int:
    """The queue's scheduled jobs fall due now; how many."""
    def body(cur) -> int:
        cur.execute(STATEMENTS["testing_run_delayed"], {"queue": queue})
        return cur.rowcount

    return session.run(body, what="run delayed jobs now")


def clear(session: Session, queue: str | None) -> int:
    """Delete a queue's jobs, attempt records, dedup keys and periodic ticks, and resume it if
    paused; every queue's when `queue` is None. One transaction. Returns the jobs deleted."""
    params = {"every": queue is None, "queue": queue or ""}

    def body(cur) -> int:
        deleted = 0
        for name in _CLEARS:
            cur.execute(STATEMENTS[name], params)
            if name == "testing_clear_jobs":
                deleted = cur.rowcount
        return deleted

    return session.run(body, what="clear queue")
