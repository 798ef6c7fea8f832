"""`put(conn=...)`: the caller's connection as the framework hands it over, unwrapped to the
DB-API connection its transaction lives on. The frameworks are never imported here: an object
of theirs is recognised by its type's module, so the core install needs none of them."""

from __future__ import annotations

from typing import Any

from notifyq import errors
from notifyq.config import values


def dbapi(conn: Any) -> Any:
    """The MySQLdb connection behind `conn`: a SQLAlchemy 2.x `Session` or `Connection`, Django's
    connection wrapper (`django.db.connection`, `connections[alias]`), or a DB-API connection."""
    module = type(conn).__module__
    if module.startswith("sqlalchemy."):
        return _sqlalchemy(conn)
    if module.startswith("django.") and callable(getattr(conn, "ensure_connection", None)):
        return _django(conn)
    return conn


def doom(conn: Any, raw: Any) -> None:
    """The caller's transaction on `conn` (its DB-API connection: `raw`) must not commit
    (job.complete_in: the claim was lost). Rolled back now on the server, whole (savepoints
    too), so a handler that catches the error inside its framework's block commits nothing of
    its writes: the framework's COMMIT then finds no transaction open, and a savepoint's
    RELEASE fails. Django, inside transaction.atomic(), is also marked so that it rolls back
    at the block's end and refuses queries until then, as after a database error in the block.
    A SQLAlchemy Session is rolled back too: the objects added but not flushed yet are expunged
    (its next flush would write them in a new transaction), and inside `session.begin()` it
    refuses further statements, and the block's end raises, as Django does."""
    raw.rollback()
    module = type(conn).__module__
    if module.startswith("django.") and getattr(conn, "in_atomic_block", False):
        conn.needs_rollback = True
    elif module.startswith("sqlalchemy.orm"):
        conn.rollback()


def _sqlalchemy(conn: Any) -> Any:
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if isinstance(conn, Session):
        conn = conn.connection()  # begins the session's transaction if none is open
    if not isinstance(conn, Connection):
        raise errors.InputError(f"conn: expected a SQLAlchemy Session or Connection, got {values.shown(conn)}")
    _check_dialect(conn.dialect.name, conn)
    if not conn.in_transaction():
        # SQLAlchemy 2.x "commit as you go": its commit() commits only a transaction it began.
        # Begin it here, so the caller's conn.commit() commits the job (and rollback() drops it).
        conn.begin()
    return conn.connection.dbapi_connection


def _django(conn: Any) -> Any:
    _check_dialect(conn.vendor, conn)
    conn.ensure_connection()
    return conn.connection


def _check_dialect(name: str, conn: Any) -> None:
    if name not in ("mysql", "mariadb"):
        raise errors.InputError(f"conn: a {name} connection; notifyq's tables live in MySQL or MariaDB "
                                f"(got {values.shown(conn)})")
