"""Schema versions: `notifyq init` creates or upgrades; everything else refuses a mismatch."""

from __future__ import annotations

import dataclasses
import logging
import re

import MySQLdb

from notifyq import errors
from notifyq.config import DSN
from notifyq.store import locks
from notifyq.store.db import Session
from notifyq.store.driver import describe, error_code
from notifyq.store.sql import QUERIES as Q
from notifyq.store.sql import migrations, split_statements

log = logging.getLogger("notifyq.schema")


# The tables a migration creates, read from its text: an upgrade names them (per-table grants).
# A hand-kept list forgot version 5's nq_dedup.
_CREATES = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+)", re.IGNORECASE)


def new_tables(text: str) -> list[str]:
    """The tables a migration's text creates, in order."""
    return _CREATES.findall(text)


def code_version() -> int:
    return migrations()[-1][0]


def check_server(version: str) -> None:
    """SKIP LOCKED is the whole claim design: MySQL 8.0.1+, MariaDB 10.6+."""
    # MariaDB 10.x greets as "5.5.5-10.x.y-MariaDB"; libmysqlclient (unlike Connector/C) keeps it.
    version = re.sub(r"^5\.5\.5-(?=\d+\.\d+\.\d+.*mariadb)", "", version, flags=re.I)
    if "tidb" in version.lower():
        raise errors.UnsupportedServer(
            f"TiDB ({version}) ignores SKIP LOCKED (a plain read): notifyq would run jobs twice")
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if not m:
        return
    major, minor, patch = map(int, m.groups())
    if "mariadb" in version.lower():
        if (major, minor) < (10, 6):
            raise errors.UnsupportedServer(
                f"MariaDB {major}.{minor} has no SKIP LOCKED: notifyq needs MariaDB 10.6 or newer")
    elif (major, minor, patch) < (8, 0, 1):
        raise errors.UnsupportedServer(
            f"MySQL {major}.{minor}.{patch} has no SKIP LOCKED: notifyq needs MySQL 8.0.1 or newer")


def current_version(session: Session) -> int | None:
    return session.run(_version, what="read schema version")


def require_current(session: Session) -> None:
    """Refuse to run against a schema this code was not written for."""
    check_server(session.server_version or "")
    have, want = current_version(session), code_version()
    if have is None:
        raise errors.SchemaError(
            f"database {session.dsn.database!r} has no notifyq schema: run `notifyq init`")
    if have < want:
        raise errors.SchemaError(
            f"schema version {have} is older than this notifyq's {want}: run `notifyq init` to upgrade")
    if have > want:
        raise errors.SchemaError(
            f"schema version {have} is newer than this notifyq's {want}: upgrade notifyq on this host")


def init(dsn: DSN, retry_s: float = 30.0, retry_log_level: int = logging.WARNING) -> tuple[int | None, int]:
    """Create the database if we may, then apply missing migrations under an advisory lock.

    Two hosts running `init` at once serialise on the lock; the second finds nothing to do.
    Returns (version before, version after).
    """
    _create_database(dsn, retry_s, retry_log_level)
    session = Session(dsn, autocommit=True, retry_s=retry_s, name="init", retry_log_level=retry_log_level)
    try:
        check_server(session.conn.get_server_info())
        return migrate(session.cursor(), dsn.database)
    except MySQLdb.Error as e:
        raise errors.DatabaseError(f"init failed: {describe(e)}") from None
    finally:
        session.close()


def migrate(cur, database: str, upto: int | None = None) -> tuple[int | None, int]:
    """Apply the missing migrations up to version `upto` (all: None) on `cur`, a cursor of an
    autocommit MySQLdb connection to `database` (`init`'s own, or a framework's: contrib.django's
    migrations run notifyq's through this). Returns (version before, version after)."""
    upto = code_version() if upto is None else upto
    name = locks.migrate_lock(database)
    cur.execute(Q["get_lock"], {"name": name, "wait_s": 120})
    if cur.fetchone()[0] != 1:
        raise errors.DatabaseError("another `notifyq init` has held the migration lock for 120 s")
    try:
        before = _version(cur)
        if before is not None and before > code_version():
            raise errors.SchemaError(f"schema version {before} is newer than this notifyq's {code_version()}")
        for version, text in migrations():
            if (before is not None and version <= before) or version > upto:
                continue
            log.info("applying migration version=%d", version)
            for statement in split_statements(text):
                cur.execute(statement)
            cur.execute(Q["set_schema_version"], {"version": str(version)})
            tables = new_tables(text)
            if tables and before is not None:
                log.warning("schema %d adds tables %s: a runtime user granted table by table needs DML on "
                            "it before consumers of this version start (`notifyq init --print-grants USER` "
                            "prints the lines)", version, ", ".join(tables))
        return before, max(before or 0, upto)
    finally:
        cur.execute(Q["release_lock"], {"name": name})


def _version(cur) -> int | None:
    try:
        cur.execute(Q["schema_version"])
    except MySQLdb.ProgrammingError as e:
        if error_code(e) == 1146:  # no nq_meta table: never initialised
            return None
        raise
    row = cur.fetchone()
    return int(row[0]) if row else None


def _create_database(dsn: DSN, retry_s: float, retry_log_level: int) -> None:
    """CREATE DATABASE IF NOT EXISTS, connected without a default database (it may not exist yet)."""
    session = Session(dsn, autocommit=True, retry_s=retry_s, name="init", retry_log_level=retry_log_level,
                      use_database=False)
    try:
        # The name was validated by DSN.parse (letters, digits, underscore): safe to quote.
        session.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{dsn.database}` CHARACTER SET utf8mb4")
    except MySQLdb.Error as e:
        if error_code(e) not in (1044, 1142):  # no CREATE privilege: the DBA made it already
            raise errors.DatabaseError(f"cannot create database {dsn.database!r}: {describe(e)}") from None
    finally:
        session.close()


# A database the demo created: its own prefix and a random suffix, so it never names a user's.
DEMO_DATABASE = re.compile(r"^notifyq_demo_[0-9a-f]{12}$")


def create_demo_database(dsn: DSN, retry_s: float = 10.0) -> tuple[DSN, str]:
    """A new database for `notifyq demo` on dsn's server, marked with a random token.

    Plain CREATE DATABASE (no IF NOT EXISTS): an existing database of that name is an error,
    so the database is provably this call's. Returns (its DSN, the token drop_database needs).
    """
    import secrets  # here: a consumer's start-up need not load it

    target = dataclasses.replace(dsn, database=f"notifyq_demo_{secrets.token_hex(6)}")
    token = secrets.token_hex(16)
    server = Session(target, autocommit=True, retry_s=retry_s, name="demo", use_database=False)
    try:
        # The name is DEMO_DATABASE's: letters, digits, underscore, safe to quote.
        server.cursor().execute(f"CREATE DATABASE `{target.database}` CHARACTER SET utf8mb4")
    except MySQLdb.Error as e:
        raise errors.DatabaseError(f"cannot create the demo database: {describe(e)}") from None
    finally:
        server.close()
    session = Session(target, autocommit=True, retry_s=retry_s, name="demo")
    try:
        session.run(lambda cur: (cur.execute(Q["demo_marker_create"]),
                                 cur.execute(Q["demo_marker_set"], {"token": token})), what="mark demo database")
    finally:
        session.close()
    return target, token


def drop_database(dsn: DSN, token: str) -> None:
    """DROP DATABASE, for the demo's own database only: its name matches DEMO_DATABASE and its
    marker table holds `token`, written by create_demo_database. Anything else is refused."""
    if not DEMO_DATABASE.match(dsn.database):
        raise errors.InputError(f"refusing to drop database {dsn.database!r}: not a demo database")
    session = Session(dsn, autocommit=True, retry_s=10.0, name="demo")
    try:
        def marked(cur) -> bool:
            try:
                cur.execute(Q["demo_marker_get"])
            except MySQLdb.ProgrammingError as e:
                if error_code(e) == 1146:  # no marker table: not made by the demo
                    return False
                raise
            return any(row[0] == token for row in cur.fetchall())

        if not session.run(marked, what="check demo marker"):
            raise errors.InputError(f"refusing to drop database {dsn.database!r}: "
                                    "it does not carry this demo run's marker")
        # The name matched DEMO_DATABASE above: safe to quote.
        session.cursor().execute(f"DROP DATABASE `{dsn.database}`")
    finally:
        session.close()


def grants(database: str, user: str) -> list[str]:
    """The least a runtime user needs: DML on notifyq's tables, nothing else."""
    if not re.match(r"^[A-Za-z0-9_.@%'-]{1,100}$", user):
        raise errors.InputError(f"invalid user {user!r}: expected 'name'@'host' or name")
    if "@" not in user:
        user = f"'{user}'@'%'"
    tables = ("nq_job", "nq_dedup", "nq_queue", "nq_signal", "nq_consumer", "nq_periodic", "nq_attempt",
              "nq_rate", "nq_rate_hold", "nq_step", "nq_flow_key", "nq_edge")
    out = [f"GRANT SELECT ON `{database}`.`nq_meta` TO {user};"]
    out += [f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{database}`.`{t}` TO {user};" for t in tables]
    return out
