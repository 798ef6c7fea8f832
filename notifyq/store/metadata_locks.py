"""Who holds and who waits on notifyq's advisory locks, as the server's
performance_schema.metadata_locks lists them (`notifyq status --locks`; what each lock means:
ops/locks.py). Read on demand only, never on the hot path.

Where the server cannot show them (no such table, performance_schema off, the metadata-lock
instrument off, or the user may not read performance_schema) the reading says why in one line
instead: status then works as before, never failing for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from notifyq.store.db import Session
from notifyq.store.driver import PRIVILEGE_DENIED, DriverError, error_code
from notifyq.store.sql import QUERIES as Q

NO_SUCH_VARIABLE = 1193  # a server built without performance_schema
NO_SUCH_TABLE = 1146  # a server whose performance_schema has no metadata_locks (MariaDB < 10.5)
INSTRUMENT = "wait/lock/metadata/sql/mdl"


@dataclass(frozen=True)
class LockRow:
    """One session's grant of, or wait for, one lock."""

    name: str
    granted: bool  # False: it waits (PENDING)
    connection: int | None  # its connection id (None: a background thread)
    user: str | None
    host: str | None  # the client's host, without its port
    for_s: int | None  # seconds in its current state: how long a waiter has waited


@dataclass(frozen=True)
class Reading:
    rows: list[LockRow]
    unavailable: str | None = None  # why the server shows none; None: `rows` are what it holds


def read(session: Session, names: list[str]) -> Reading:
    """The grants and waits on `names` (lock names, store/locks.py), or why the server shows none."""
    def body(cur) -> Reading:
        try:
            cur.execute(Q["mdl_schema_on"])
            (on,) = cur.fetchone()
            if not int(on):
                return Reading([], "performance_schema is OFF on this server (start it with performance_schema=ON"
                                   f" and, on MariaDB, performance_schema_instrument='{INSTRUMENT}=ON')")
            cur.execute(Q["mdl_instrument"])
            enabled = cur.fetchone()
            if enabled is None or str(enabled[0]).upper() != "YES":
                return Reading([], f"the {INSTRUMENT} instrument is off (performance_schema_instrument="
                                   f"'{INSTRUMENT}=ON' at the server's start, or enable it in "
                                   "performance_schema.setup_instruments)")
            cur.execute(Q["mdl_locks"], {"names": sorted(set(names)) or [""]})
            rows = cur.fetchall()
        except DriverError as e:
            code = error_code(e)
            if code in (NO_SUCH_VARIABLE, NO_SUCH_TABLE):
                return Reading([], "this server has no performance_schema.metadata_locks (MySQL 8.0, MariaDB 10.5+)")
            if code in PRIVILEGE_DENIED:
                return Reading([], f"user {session.dsn.user} may not read performance_schema "
                                   "(GRANT SELECT ON performance_schema.* to show them)")
            raise
        return Reading([LockRow(str(name), status == "GRANTED", None if conn is None else int(conn),
                                user, host, None if time_s is None else int(time_s))
                        for name, status, conn, user, host, time_s in rows])

    return session.run(body, what="read metadata locks")
