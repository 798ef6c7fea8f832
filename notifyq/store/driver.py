"""The driver's side of the store: which errors mean what, the one retry policy, and how values
cross the wire (the DATETIME decoder, job ids for `IN`).

Retries wrap whole transactions, never single statements: after a deadlock the earlier
statements of the transaction are gone, after a lock wait timeout they are still there.
Either way the only safe move is ROLLBACK (or a new connection) and run the whole thing again.
On Galera a certification conflict is 1213 as well, at COMMIT or at any statement after the
conflicting write set arrived: the same rerun, counted (Conflicts).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import MySQLdb
import MySQLdb.converters
from MySQLdb.constants import FIELD_TYPE

if TYPE_CHECKING:
    import tenacity

log = logging.getLogger("notifyq.db")

# Run the transaction again on a live connection.
RERUN_CODES = frozenset({1205, 1213, 1020, 3058, 1317})
# The connection is gone or the server cannot serve us right now: reconnect, then run again.
# 1180 (an error during COMMIT): on Galera, a node that dropped out of the primary component
# (a membership change, a node resuming after a pause) refuses the COMMIT; nothing was stored.
RECONNECT_CODES = frozenset({2002, 2003, 2006, 2013, 2055, 1927, 4031, 1290, 1792, 1053, 1047, 1040, 1180})
ACCESS_DENIED = frozenset({1044, 1045, 1698})
# A statement refused for want of a privilege: on a table or column (1142, 1143), a database
# (1044), a routine (1370), or a global one such as SUPER (1227). Not retried (errors.GrantMissing).
# (A refused login, 1045, is the connect's: errors.DatabaseError, exit 5.)
PRIVILEGE_DENIED = frozenset({1044, 1142, 1143, 1227, 1370})
UNKNOWN_DATABASE = 1049
RSA_KEY_NEEDED = 2061  # caching_sha2_password without TLS and without the server's public key
DEADLOCK = 1213  # on Galera also a certification conflict: another node wrote the same rows
NOT_READY = 1047  # a Galera node outside the primary component, or not synced yet
QUERY_INTERRUPTED = 1317  # KILL QUERY: a wait ended on purpose (a wake-up, a stop)
# A steady rate of conflicts: this many in CONFLICT_WINDOW_S on one session gets a warning.
CONFLICT_WARN_COUNT = 10
CONFLICT_WINDOW_S = 60.0

# The driver's base error class, for the parts above the store that must catch database
# errors without importing the driver (only store/ imports MySQLdb; an import contract holds it).
DriverError = MySQLdb.Error
# Lock functions refused: Galera with wsrep_on (1235, NotSupportedError), or a proxy. Not retried.
LOCKS_UNAVAILABLE = frozenset({1235, 1105})


def connect(**connect_args: Any) -> MySQLdb.connections.Connection:
    """One plain driver connection, for tools that manage a server rather than a queue
    (run/localserver.py). Queue work goes through Session."""
    return MySQLdb.connect(**connect_args)


def cut_short(what: str) -> MySQLdb.OperationalError:
    """The error for a statement whose reply says it did less than it must have (a KILL QUERY
    can end a statement with an OK reply and no row changed, or a subquery read as NULL): its
    transaction is rolled back and run again, as after a KILL QUERY's own 1317."""
    return MySQLdb.OperationalError(QUERY_INTERRUPTED, f"cut short without an error: {what}")


def error_code(exc: BaseException) -> int | None:
    if isinstance(exc, MySQLdb.Error) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


def is_transient(exc: BaseException) -> bool:
    return error_code(exc) in RERUN_CODES | RECONNECT_CODES


def is_lost_rerun(exc: BaseException) -> bool:
    """The server answered, and the transaction lost to another (a deadlock or certification
    conflict, a lock wait timeout) or was interrupted (RERUN_CODES): nothing to reconnect, and
    a transaction that is safe to run again (a claim) may simply be run again later."""
    return error_code(exc) in RERUN_CODES


def locks_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, MySQLdb.NotSupportedError) or error_code(exc) in LOCKS_UNAVAILABLE


def is_connection_lost(exc: BaseException) -> bool:
    return error_code(exc) in RECONNECT_CODES


def describe(exc: BaseException) -> str:
    """One line for the user. Server messages name user@host, never the password."""
    code = error_code(exc)
    if code is None:
        return str(exc)
    return f"MySQL error {code}: {exc.args[1] if len(exc.args) > 1 else ''}"


def retry_policy(give_up_after_s: float, what: str, log_level: int = logging.WARNING,
                 stop: threading.Event | None = None, lost_past_deadline: int = 0) -> tenacity.Retrying:
    """The infrastructure policy: full-jitter exponential backoff on transient errors only.

    One log line per backoff step; one-shot commands pass DEBUG, so that an unreachable server
    costs them one error line, not one line per attempt. `stop` (a daemon's stop request) ends
    the retrying at once, in the middle of a backoff sleep: SIGTERM is not made to wait for a
    server that is gone (the last error is raised, as at the deadline). `lost_past_deadline`:
    how many lost connections found past the deadline are tried again (on a new connection,
    whose connect has a budget of its own) rather than raised: a process paused longer than
    the deadline comes back to one with the server up."""
    import tenacity  # here: most processes never retry, and it costs a few ms of start-up

    backoff = tenacity.wait_random_exponential(multiplier=0.05, max=5.0)

    def wait(rs: tenacity.RetryCallState) -> float:
        # Never sleep past the deadline: the last attempt comes at it, not up to 5 s after.
        return min(backoff(rs), max(0.0, give_up_after_s - rs.seconds_since_start))

    past_deadline = 0

    def give_up(rs: tenacity.RetryCallState) -> bool:
        nonlocal past_deadline
        if rs.seconds_since_start is None or rs.seconds_since_start < give_up_after_s:
            return False
        if past_deadline < lost_past_deadline and is_connection_lost(rs.outcome.exception()):
            past_deadline += 1
            return False
        return True

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        wait=wait,
        stop=give_up if stop is None else tenacity.stop_any(give_up, lambda rs: stop.is_set()),
        sleep=time.sleep if stop is None else stop.wait,
        before_sleep=lambda rs: log.log(
            log_level, "database error, retrying what=%s attempt=%d error=%r",
            what, rs.attempt_number, describe(rs.outcome.exception()),
        ),
        reraise=True,
    )



class Conflicts:
    """Transactions of one session rerun after 1213. One now and then is a deadlock; a steady rate
    on a Galera cluster means writes through a second node conflict with ours: warned about."""

    def __init__(self) -> None:
        self.count = 0
        self._times: list[float] = []

    def record(self, exc: BaseException, what: str, session_name: str) -> None:
        if error_code(exc) != DEADLOCK:
            return
        self.count += 1
        now = time.monotonic()
        self._times = [t for t in self._times if now - t < CONFLICT_WINDOW_S] + [now]
        if len(self._times) >= CONFLICT_WARN_COUNT:
            self._times = []
            log.warning("transactions rerun after deadlocks or certification conflicts at a steady rate "
                        "count=%d seconds=%g what=%s session=%s: on a Galera cluster another node takes "
                        "writes to the queue tables; point every notifyq process at the same node "
                        "(one multi-host DSN in the same order, or one HAProxy backend)",
                        CONFLICT_WARN_COUNT, CONFLICT_WINDOW_S, what, session_name)


_fromisoformat = dt.datetime.fromisoformat  # (bound once: two per claimed job)


def _datetime(text):
    """DATETIME/TIMESTAMP decoder: the C `fromisoformat` instead of mysqlclient's pure-Python
    parser, which a consumer ran three times per claimed job. Anything
    it does not take (zero dates, odd precision) goes to the original, so results are equal."""
    if 19 <= len(text) <= 26:  # 'YYYY-MM-DD hh:mm:ss[.ffffff]'
        try:
            return _fromisoformat(text if text.__class__ is str else text.decode())
        except ValueError:
            pass
    return MySQLdb.converters.DateTime_or_None(text)


class Ids(tuple):
    """Job ids for `IN %(ids)s`, rendered `(1,2,3)` in one step. A plain list goes through
    literal() once per element, three times per claimed batch. Every element written as an
    integer keeps it a bound value: anything else raises. An ack's ids are rendered for four
    statements: the text is kept on the tuple (immutable)."""


def _ids_literal(ids: Ids, _conversions) -> str:
    try:
        return ids.__dict__["sql"]
    except KeyError:
        sql = ids.__dict__["sql"] = "(" + _int_list_literal(ids, _conversions) + ")"
        return sql


class IntList(tuple):
    """Integers for a list inside a call, `FIELD(id, %(ids)s)`: rendered `1,2,3`, no parentheses."""


def _int_list_literal(values: tuple, _conversions) -> str:
    # One format for the whole list: a third of the time of ",".join(map(str, map(int, ...))),
    # which ran for every list of every claim and ack (a batch's ids, the attempts' ages).
    # What `%d` refuses (a number as text) goes through int() as before: taken, or refused.
    try:
        return ("%d," * len(values))[:-1] % values
    except TypeError:
        return ",".join(map(str, map(int, values)))


CONVERSIONS = {**MySQLdb.converters.conversions, FIELD_TYPE.DATETIME: _datetime,
               FIELD_TYPE.TIMESTAMP: _datetime, Ids: _ids_literal, IntList: _int_list_literal}

