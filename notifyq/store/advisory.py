"""Statements on advisory locks and on other sessions: GET_LOCK with a wait the server keeps,
the watch lock's hand-on, who holds a lock, KILL QUERY / KILL CONNECTION of our own sessions,
and the settings of a session that holds locks for long."""

from __future__ import annotations

import math

import MySQLdb

from notifyq.store.db import Session
from notifyq.store.driver import QUERY_INTERRUPTED, DriverError, error_code
from notifyq.store.queries import connection_is_ours, one_value
from notifyq.store.sql import QUERIES as Q

def lock_wait_s(session: Session, wait_s: float) -> float:
    """A GET_LOCK timeout the server keeps. Never negative (a negative one waits forever).
    MariaDB keeps a fraction; MySQL rounds the timeout to whole seconds, so a wait under half a
    second would return at once and an idle watcher would spin at round-trip rate: there it
    waits whole seconds, rounded up (a grant still ends the wait at once; only a timeout, a
    poll's turn, comes later, by under a second)."""
    wait_s = max(0.0, wait_s)
    if wait_s and "mariadb" not in session.server_version.lower():
        return float(math.ceil(wait_s))
    return wait_s


def get_lock(session: Session, name: str, wait_s: float, *, on_generation: int | None = None) -> int | None:
    """1 got it, 0 timed out, None interrupted (KILL QUERY) or error.
    on_generation: the session's connection the wait is meant for (Session.generation): rerun
    on a newer one (the session reconnected midway), the statement does not wait (a wait of 0)."""
    def body(cur) -> int | None:
        try:
            cur.execute(Q["get_lock"], {"name": name, "wait_s": lock_wait_s(
                session, wait_s if on_generation is None or on_generation == session.generation else 0.0)})
        except DriverError as e:
            if error_code(e) != QUERY_INTERRUPTED:
                raise
            # MySQL answers a KILL QUERY in GET_LOCK with error 1317 (MariaDB returns NULL):
            # the interruption the caller asked for (a stop), not an error to run again.
            return None
        row = cur.fetchone()
        return row[0] if row else None

    return session.run(body, what="get_lock", wait_s=math.ceil(max(0.0, wait_s)))  # (MySQL rounds up)


def release_lock(session: Session, name: str) -> int | None:
    return one_value(session, "release_lock", {"name": name}, "release_lock")


def hand_watch_on(session: Session, name: str, queue: str, claimed: int | None = None) -> None:
    """Release the watch lock once the claim's COMMIT is done, without waiting for either
    (Pipeline.send_later; the statement says how). `claimed`: a job the claim took, whose row
    lock its COMMIT frees (hand_watch_on_claimed). If its share lock fails, the lock is released
    anyway: the session may hold the process's liveness lock, which a reconnect would free."""
    if claimed is None:
        sql, params = Q["hand_watch_on"], {"name": name, "queue": queue}
    else:
        sql, params = Q["hand_watch_on_claimed"], {"name": name, "job": claimed}
    session.pipeline.send_later(sql, params, fallback=Q["release_lock"])


def lock_holder(session: Session, name: str) -> int | None:
    """The connection id holding `name`, or None."""
    return one_value(session, "lock_holder", {"name": name}, "lock_holder")


def lock_holder_and_me(cur, name: str) -> tuple[int | None, int]:
    """(the connection id holding `name` or None, this session's id as the server knows it: a
    proxy's handshake gives another, and then its ids are not the server's to KILL)."""
    cur.execute(Q["lock_holder_and_me"], {"name": name})
    holder, me = cur.fetchone()
    return holder, int(me)


KILL_DENIED = 1095  # ER_KILL_DENIED_ERROR: "You are not owner of thread", another user's session
NO_SUCH_THREAD = 1094


def kill_query(cur, conn_id: int) -> str:
    """KILL QUERY another session's statement: "sent", "gone" (it ended meanwhile) or "refused"
    (a session of another database user, and we lack CONNECTION ADMIN)."""
    try:
        cur.execute(Q["kill_query"], {"conn_id": int(conn_id)})
    except MySQLdb.Error as e:
        if error_code(e) == KILL_DENIED:
            return "refused"
        if error_code(e) == NO_SUCH_THREAD:
            return "gone"
        raise
    return "sent"


def session_state(session: Session, conn_id: int) -> tuple[str, bool, int] | None:
    """(its command, whether it runs a statement now, whole seconds in that state) of one of our
    own sessions, as the server lists it; None when the server has no such session."""
    def body(cur) -> tuple[str, bool, int] | None:
        cur.execute(Q["session_state"], {"conn_id": int(conn_id)})
        row = cur.fetchone()
        return None if row is None else (str(row[0]), bool(row[1]), int(row[2] or 0))

    return session.run(body, what="session state")


def kill_connection(session: Session, conn_id: int, owner: Session | None = None) -> bool:
    """End one of our own sessions (its client's read returns at once); False if it is gone.
    owner: the session that had the connection, whose client port it must still show (the id
    may be another client's after a server restart: queries.connection_is_ours)."""
    def body(cur) -> bool:
        if owner is not None and not connection_is_ours(cur, owner, conn_id):
            return False
        try:
            cur.execute(Q["kill_connection"], {"conn_id": int(conn_id)})
            return True
        except MySQLdb.Error as e:
            if error_code(e) in (NO_SUCH_THREAD, KILL_DENIED):
                return False
            raise

    return session.run(body, what="kill connection")


HOLD_SESSION_S = 7 * 86400  # a producer's bell session may idle this long, waiting for input


def hold_session(session: Session) -> None:
    session.run(lambda cur: cur.execute(Q["hold_session"], {"wait_s": HOLD_SESSION_S}),
                what="hold session")


def keep_alive(session: Session) -> None:
    session.run(lambda cur: cur.execute(Q["keep_alive"]), what="keepalive")
