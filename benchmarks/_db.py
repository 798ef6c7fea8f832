"""One statement on a fresh connection, and the server's process id: the benchmarks' admin side."""

from __future__ import annotations

from pathlib import Path

import MySQLdb


def sql_once(conn_args: dict, statement: str, params=None) -> list[tuple]:
    """`statement` on a connection of its own (autocommit), its rows if it returns any."""
    conn = MySQLdb.connect(**conn_args, autocommit=True)
    try:
        cur = conn.cursor()
        cur.execute(statement, params)
        return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


def server_pid(conn_args: dict) -> int | None:
    """The server's process id, from its pid file (None: not readable here, another machine)."""
    try:
        return int(Path(sql_once(conn_args, "SELECT @@pid_file")[0][0]).read_text().strip())
    except (OSError, ValueError):
        return None
