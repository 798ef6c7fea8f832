"""job.transaction() and job.complete_in(conn) as a worker hands them to its jobs: the store's
Completion (store/completion.py), with the caller's connection of complete_in unwrapped as
put(conn=...) unwraps it (a SQLAlchemy Session or Connection, Django's connection, a DB-API
connection: produce/conns.py)."""

from __future__ import annotations

from typing import Any

from notifyq import errors
from notifyq.jobs import Job
from notifyq.produce import conns
from notifyq.store import completion


class Completion(completion.Completion):
    def complete_in(self, job: Job, conn: Any, result: Any = None, rollback: bool = True) -> None:
        raw = conns.dbapi(conn)
        try:
            super().complete_in(job, raw, result, rollback=rollback and raw is conn)
        except errors.ClaimLost:
            if rollback and raw is not conn:
                # A framework's transaction rolls back as ClaimLost leaves its block; doomed
                # now, it also lands nothing when the handler catches the error inside it.
                conns.doom(conn, raw)
            raise
