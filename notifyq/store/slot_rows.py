"""A queue's 16 counter slot rows (nq_signal), made before its first bump, outside any caller's
transaction: on a session of their own, once per process and queue.

Why: a bump takes the first slot row no other transaction holds (signal.bump), and a slot row
used to be made only when a bump drew it. A new queue then had few rows, and an open
transaction that made or bumped one (an application's own transaction that put a job, a
producer stopped before its COMMIT) held it: a bump that found no row nobody held took its
random slot and, drawing that one (about 1 in 16), waited on it for the lock wait timeout. A
retry, a due job's promotion or a workflow's release cannot make a row of their own the way
put() on MariaDB does (they bump in one statement, or inside a claim's COMMIT). With all 16
rows committed, a bump finds one nobody holds unless 16 open transactions hold one each.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterable
from typing import Any

from notifyq.config import DSN, validate_queue_name
from notifyq.errors import DatabaseError
from notifyq.store.db import Session
from notifyq.store.driver import error_code
from notifyq.store.signal import SIGNAL_SLOTS
from notifyq.store.sql import QUERIES as Q

# (the server's addresses, the database, the queue) whose rows this process made or found.
# Rows are never deleted, so once made they stay made: the steady state asks nothing.
_MADE: set[tuple[Any, ...]] = set()
# Making the rows is best effort, and bounded: a bump works without them (it takes its random
# slot, as before they were made). An outside attack held the key range of nq_signal with a
# locking read that found nothing (a gap lock): every INSERT of a new queue's row waits on it,
# and the first put(conn=...) of the queue failed after the producer's retries; with the
# producer's DSN unreachable (put(conn=) writes on the caller's connection) it failed too.
RETRY_S = 1.0  # the most the rows' session retries a connect or a refused INSERT
TRY_AGAIN_S = 60.0  # a queue whose rows could not be made is not tried again before this
_NOT_BEFORE: dict[tuple[Any, ...], float] = {}  # such queues: when they may be tried again
LOCK_WAIT_TIMEOUT = 1205
# A slot row made (and held) by another open transaction between the read and the INSERT:
# read again. Each try finds at least one more row, so 16 always end it.
TRIES = SIGNAL_SLOTS

log = logging.getLogger(__name__)


def make(dsn: DSN, queues: Iterable[str], **session_args: Any) -> bool:
    """Each queue's 16 slot rows, each made unless it is there (committed or not), on a session
    of their own in autocommit (one for all the queues not made yet): never inside the caller's
    transaction, which may be open on its own connection (put(conn=...)) and would otherwise
    hold the rows it made until it ends.

    Never waits on a row another transaction holds: the rows are read with their uncommitted
    ones (READ UNCOMMITTED, no lock) and only those missing are inserted, with the least lock
    wait the server takes (MariaDB 0; MySQL 1 s, only when another transaction made the same
    slot's row between the read and the INSERT). A row held so is that transaction's to commit.
    session_args: Session's (retry_setting: the setting named in its errors); its retries last
    RETRY_S at most. Rows it could not make (the server unreachable, a lock that outlasts the
    retries) are logged, not raised, and their queue is not tried again for TRY_AGAIN_S: its
    bumps take their random slot meanwhile, as they did before rows were made. True: every
    queue's rows are made."""
    queues = list(queues)
    place = (dsn.servers, dsn.unix_socket, dsn.database)
    now = time.monotonic()
    missing = [validate_queue_name(queue) for queue in queues
               if (*place, queue) not in _MADE and _NOT_BEFORE.get((*place, queue), 0.0) <= now]
    if not missing:
        return all((*place, queue) in _MADE for queue in queues)
    session_args["retry_s"] = min(RETRY_S, session_args.get("retry_s", RETRY_S))
    session_args["retry_log_level"] = logging.DEBUG  # (one warning below says what it came to)
    # No lock between threads: two makers of one queue at once cost a round trip or two (the
    # second's INSERT meets the first's rows, refused or waited on until its autocommit ends)
    session = Session(dsn, autocommit=True, name="slot rows", **session_args)
    try:
        for queue in missing:
            session.run(functools.partial(_make_rows, queue=queue), what=f"make {queue}'s signal slot rows")
            _MADE.add((*place, queue))
            _NOT_BEFORE.pop((*place, queue), None)
    except DatabaseError as e:
        left = [queue for queue in missing if (*place, queue) not in _MADE]
        for queue in left:
            _NOT_BEFORE[(*place, queue)] = time.monotonic() + TRY_AGAIN_S
        log.warning("signal slot rows of %s not made (%s): their bumps take their random slot, which an "
                    "open transaction may hold; tried again in %.0f s", ", ".join(left), e, TRY_AGAIN_S)
        return False
    finally:
        session.close()
    return True


def _make_rows(cur, queue: str) -> None:
    mariadb = "MariaDB" in cur.connection.get_server_info()  # from the handshake: no round trip
    cur.execute(Q["slot_rows_lock_wait"], {"s": 0 if mariadb else 1})
    for tried in range(1, TRIES + 1):
        cur.execute(Q["slot_rows_dirty"])
        cur.execute(Q["slot_rows_made"], {"queue": queue})
        there = {int(row[0]) for row in cur.fetchall()}
        missing = [{"queue": queue, "slot": slot} for slot in range(SIGNAL_SLOTS) if slot not in there]
        if not missing:
            return
        try:
            cur.executemany(Q["slot_row_make"], missing)
            return
        except Exception as e:  # noqa: BLE001 - the driver's error class; told apart by its code
            if error_code(e) != LOCK_WAIT_TIMEOUT or tried == TRIES:
                raise
            log.debug("slot rows of %s: an INSERT refused a lock wait (a row another open transaction made "
                      "meanwhile, or a lock on their key range); reading again", queue)
