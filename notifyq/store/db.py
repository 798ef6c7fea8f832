"""Connections, error classes and the one retry policy for database work.

Retries wrap whole transactions, never single statements: after a deadlock the earlier
statements of the transaction are gone, after a lock wait timeout they are still there.
Either way the only safe move is ROLLBACK (or a new connection) and run the whole thing again.
On Galera a certification conflict is 1213 as well, at COMMIT or at any statement after the
conflicting write set arrived: the same rerun, counted (Session.conflicts).

A multi-host DSN names the nodes of one Galera cluster. A session connects to the first node of
the list that answers and is ready (Synced, in the primary component); all sessions of a process
share which node that is (WriterChoice), so they move together when it dies and stay on the new
one when the old one comes back: one writer, no certification conflicts between our own sessions.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import MySQLdb
import MySQLdb.converters
from MySQLdb.constants import FIELD_TYPE

from notifyq import errors
from notifyq.config import DSN
from notifyq.store.sql import QUERIES

if TYPE_CHECKING:
    import tenacity

log = logging.getLogger("notifyq.db")
T = TypeVar("T")

# Run the transaction again on a live connection.
RERUN_CODES = frozenset({1205, 1213, 1020, 3058, 1317})
# The connection is gone or the server cannot serve us right now: reconnect, then run again.
# 1180 (an error during COMMIT): on Galera, a node that dropped out of the primary component
# (a membership change, a node resuming after a pause) refuses the COMMIT; nothing was stored.
RECONNECT_CODES = frozenset({2002, 2003, 2006, 2013, 2055, 1927, 4031, 1290, 1792, 1053, 1047, 1040, 1180})
ACCESS_DENIED = frozenset({1044, 1045, 1698})
UNKNOWN_DATABASE = 1049
DEADLOCK = 1213  # on Galera also a certification conflict: another node wrote the same rows
NOT_READY = 1047  # a Galera node outside the primary component, or not synced yet
# A steady rate of conflicts: this many in CONFLICT_WINDOW_S on one session gets a warning.
CONFLICT_WARN_COUNT = 10
CONFLICT_WINDOW_S = 60.0
# Identity of the server a session runs on: what a consumer records as the node holding its
# liveness lock, compared in SQL by the reaper's queries (queries.sql uses the same expression).
NODE_IDENTITY_SQL = "CONCAT(@@hostname, ':', @@port)"
# A multi-host DSN: a writer node that is paused (SIGSTOP, a frozen VM, a network that drops
# packets) keeps its sockets open and answers nothing, so a session learns of it only from its
# own timeouts. Reads give up after FAILOVER_READ_TIMEOUT_S (above innodb_lock_wait_timeout, 10 s,
# and Galera's eviction stall of ~6.5 s, the longest a healthy node keeps a statement waiting),
# and a connect after FAILOVER_CONNECT_TIMEOUT_S (a paused node accepts the TCP connection but
# never greets): a session moves to the next ready node within about the sum of the two.
FAILOVER_READ_TIMEOUT_S = 12
FAILOVER_CONNECT_TIMEOUT_S = 4
# The server's uptime (a reaper's restart grace: reaper.reap) and its wsrep state.
_SERVER_STATUS = ("SHOW GLOBAL STATUS WHERE Variable_name IN ('Uptime', "
                 "'wsrep_provider_name', 'wsrep_ready', 'wsrep_local_state_comment', 'wsrep_cluster_status')")


# The driver's base error class, for the parts above the store that must catch database
# errors without importing the driver (only store/ imports MySQLdb; an import contract holds it).
DriverError = MySQLdb.Error
# Lock functions refused: Galera with wsrep_on (1235, NotSupportedError), or a proxy. Not retried.
LOCKS_UNAVAILABLE = frozenset({1235, 1105})


def connect(**connect_args: Any) -> MySQLdb.connections.Connection:
    """One plain driver connection, for tools that manage a server rather than a queue
    (run/localserver.py). Queue work goes through Session."""
    return MySQLdb.connect(**connect_args)


def error_code(exc: BaseException) -> int | None:
    if isinstance(exc, MySQLdb.Error) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


def is_transient(exc: BaseException) -> bool:
    return error_code(exc) in RERUN_CODES | RECONNECT_CODES


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
                 stop: threading.Event | None = None) -> tenacity.Retrying:
    """The infrastructure policy: full-jitter exponential backoff on transient errors only.

    One log line per backoff step; one-shot commands pass DEBUG, so that an unreachable server
    costs them one error line, not one line per attempt. `stop` (a daemon's stop request) ends
    the retrying at once, in the middle of a backoff sleep: SIGTERM is not made to wait for a
    server that is gone (the last error is raised, as at the deadline)."""
    import tenacity  # here: most processes never retry, and it costs a few ms of start-up

    backoff = tenacity.wait_random_exponential(multiplier=0.05, max=5.0)

    def wait(rs: tenacity.RetryCallState) -> float:
        # Never sleep past the deadline: the last attempt comes at it, not up to 5 s after.
        return min(backoff(rs), max(0.0, give_up_after_s - rs.seconds_since_start))

    give_up = tenacity.stop_after_delay(give_up_after_s)
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


def address(dsn: DSN) -> str:
    """Where the server is expected: host:port (each of them), or the socket path."""
    if dsn.unix_socket:
        return f"socket {dsn.unix_socket}"
    return ",".join(f"{h}:{p}" for h, p in dsn.servers)


class WriterChoice:
    """Which node of a multi-host DSN this process writes through: one per process and host list.

    Shared by every session of the process (a consumer has several, a reaper opens one per pass):
    a session that finds the writer gone moves the choice, and the others follow at their next
    connect instead of each walking the list from the top. Starting from the current choice, not
    from the first host, is what keeps a process from failing back on its own to a node that
    returned: it stays where it is until that node fails in turn. A session holding a lock it
    must keep (Session.follows_writer False) does not follow while its own connection works.
    This is the one piece of process-wide state in the store; it holds only an index.
    """

    _choices: dict[tuple[tuple[str, int], ...], "WriterChoice"] = {}
    _guard = threading.Lock()

    def __init__(self) -> None:
        self.index = 0
        self.chosen = False  # a session of this process has connected through `index`
        self.lock = threading.Lock()

    @classmethod
    def of(cls, dsn: DSN) -> "WriterChoice":
        with cls._guard:
            return cls._choices.setdefault(dsn.servers, cls())

    def order(self, count: int) -> list[int]:
        """Indexes to try: the current writer, then the list from the top."""
        first = self.index
        return [first] + [i for i in range(count) if i != first]


def oneshot_session(dsn: DSN, retry_s: float, name: str) -> Session:
    """A session for a command that answers and exits (status, pause, jobs ...): its retries
    are logged at DEBUG only, so an unreachable server costs one error line, not one a step."""
    return Session(dsn, retry_s=retry_s, name=name, retry_log_level=logging.DEBUG)


def _require_tls(conn: MySQLdb.connections.Connection, dsn: DSN) -> None:
    """TLS was asked for: refuse a session without it. The driver alone does not (with MariaDB
    Connector/C, mysqlclient's ssl_mode does not make a server without TLS an error), so ask
    the session itself. Not retried: a server without TLS does not grow it in 30 s."""
    cur = conn.cursor()
    try:
        cur.execute(QUERIES["tls_cipher"])
        row = cur.fetchone()
    finally:
        cur.close()
    if not row or not row[1]:
        conn.close()
        raise errors.DatabaseError(f"the server at {dsn.masked()} does not use TLS, which the TLS "
                                   "options ask for (remove them only if plaintext is acceptable)")


def _datetime(text):
    """DATETIME/TIMESTAMP decoder: the C `fromisoformat` instead of mysqlclient's pure-Python
    parser, which was a fifth of a consumer's CPU (three datetimes per claimed job). Anything
    it does not take (zero dates, odd precision) goes to the original, so results are equal."""
    if 19 <= len(text) <= 26:  # 'YYYY-MM-DD hh:mm:ss[.ffffff]'
        try:
            return dt.datetime.fromisoformat(text.decode() if isinstance(text, bytes) else text)
        except ValueError:
            pass
    return MySQLdb.converters.DateTime_or_None(text)


class Ids(tuple):
    """Job ids for `IN %(ids)s`, rendered `(1,2,3)` in one step. A plain list goes through
    literal() once per element, about 1 us an id, three times per claimed batch. int() on
    every element keeps it a bound value: anything but an integer raises."""


def _ids_literal(ids: Ids, _conversions) -> str:
    return "(" + ",".join(map(str, map(int, ids))) + ")"


CONVERSIONS = {**MySQLdb.converters.conversions, FIELD_TYPE.DATETIME: _datetime,
               FIELD_TYPE.TIMESTAMP: _datetime, Ids: _ids_literal}


class Pending:
    """A statement sent without waiting for its reply (Session.send_later, send_commit).

    The reply is read before the session's next statement, or by Session.settle(). `failed`
    is known once `settled`: for a COMMIT it means the transaction is not ours to count on,
    whether the server refused it or the connection was lost before the reply (then its outcome
    is unknown, and whatever it would have made ours must be treated as possibly someone else's)."""

    __slots__ = ("what", "commit", "replied", "settled", "error", "fallback", "rowcounts")

    def __init__(self, what: str, commit: bool, fallback: str | None = None):
        self.what = what
        self.commit = commit
        self.fallback = fallback  # send_later: a statement, bound already, to run if it failed
        self.replied = 0  # replies of the query read already (send_commit, wait_replies)
        self.rowcounts: list[int] = []  # each statement's affected rows, as its reply is read
        self.settled = False
        self.error: BaseException | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


class Session:
    """One MySQLdb connection that knows how to rebuild itself.

    `autocommit=False` sessions run claims and acks as explicit short transactions in READ
    COMMITTED; `autocommit=True` sessions hold advisory locks and wait in GET_LOCK, and must
    never hold row locks (a row-lock/user-lock cycle is not detected by the server).
    """

    def __init__(self, dsn: DSN, *, autocommit: bool = False, read_timeout_s: int = 60,
                 retry_s: float = 60.0, name: str = "work", retry_log_level: int = logging.WARNING,
                 use_database: bool = True, idle_timeout_s: int | None = None,
                 stop: threading.Event | None = None, follows_writer: bool = True):
        self.dsn = dsn
        # Set (the daemon stops): a connect retry ends at once, so SIGTERM does not wait for a
        # server that is gone. Only connects: a transaction whose server answers (a deadlock, a
        # lock wait, one lost connection that reconnects at once) is still retried, as the drain's
        # acks and give-backs must be.
        self.stop = stop
        self.autocommit = autocommit
        # Waits inside statements (GET_LOCK, the watch's SLEEP) are bounded by this (wakeup.py).
        self.read_timeout_s = (min(read_timeout_s, FAILOVER_READ_TIMEOUT_S) if len(dsn.servers) > 1
                               else read_timeout_s)
        # The server ends the session after this long without a statement (wait_timeout), and
        # frees its advisory locks: for short-lived sessions that hold a lock others need, so a
        # client host that vanished without closing its connection blocks them only this long.
        self.idle_timeout_s = idle_timeout_s
        self.retry_s = retry_s
        self.name = name
        self.retry_log_level = retry_log_level
        self.use_database = use_database  # False: `init`, before CREATE DATABASE
        self._conn: MySQLdb.connections.Connection | None = None
        # A multi-host DSN: the process's writer choice, and the index of the node this session's
        # connection is on. When another session moved the choice, this one follows at its next
        # transaction instead of finding out from its own read timeout (a paused node).
        self._choice = WriterChoice.of(dsn) if len(dsn.servers) > 1 else None
        # False for a session holding a lock it must keep (a consumer's liveness lock): leaving
        # a connection that works frees its locks, which to a reaper on that node is the sign of
        # death. It moves only when its own connection fails.
        self.follows_writer = follows_writer
        self._server_index = -1
        self.generation = 0  # bumped on every new connection: advisory locks died with the old one
        self.server_version = ""
        self.max_allowed_packet = 0  # the server's limit on one statement, read at every connect
        self.connection_id: int | None = None  # readable from other threads (the stopper)
        self._pending: Pending | None = None  # a statement whose reply is still on the wire
        self.failed_commits = 0  # COMMITs sent ahead (send_commit) that failed or were lost
        self._attempt_idempotent = True
        self._committed_in_body = False
        self._committing_in_body = False  # inside commit_then_read's COMMIT
        self._body_result: Any = None  # what the body returns after commit_then_read's COMMIT
        self._rendered: dict[tuple, str] = {}  # commit_then_read's statements, bound
        self.node = ""  # the server's identity (NODE_IDENTITY_SQL) since the last connect
        self.galera = False  # the server is a Galera node (wsrep provider loaded)
        self._server_started_at = -math.inf  # monotonic, from the server's Uptime at connect
        # Monotonic time at which the last transaction that succeeded was sent: the connection (of
        # this generation, if it did not reconnect since) was open then, and with it its locks.
        self.answered_at = -math.inf
        self.conflicts = 0  # transactions rerun after 1213: deadlocks, certification conflicts
        self._conflict_times: list[float] = []

    def server_up_s(self) -> float:
        """How long the server has been up, never more than the truth: its Uptime, read at
        connect, is a difference of whole-second clock readings, up to a second over (a server
        0.3 s old said 1), so a second less than it."""
        return time.monotonic() - self._server_started_at

    @property
    def connected(self) -> bool:
        """False while (re)connecting, or before the first connect: for health views."""
        return self._conn is not None

    @property
    def conn(self) -> MySQLdb.connections.Connection:
        if self._conn is None:
            self.connect()
        if self._pending is not None:
            self.settle()
            if self._conn is None:  # the reply was a lost connection
                self.connect()
        assert self._conn is not None
        return self._conn

    def connect(self) -> None:
        self.discard()
        started = time.monotonic()
        what = f"connect {self.name}"
        try:
            _, attempts, _ = self._retrying(self._open_into, what, started, self.stop)
        except MySQLdb.Error as e:
            if self.stop is not None and self.stop.is_set():
                raise errors.TransientDBError(f"stopped while connecting to {address(self.dsn)}: "
                                              f"{describe(e)}") from None
            waited = f" (retried for {self.retry_s:g} s: connect_retry_s)" if self.retry_s else ""
            raise errors.DatabaseError(
                f"cannot reach the database server at {address(self.dsn)}: {describe(e)}{waited}"
            ) from None
        self._say_back(attempts, started, what)
        self.generation += 1

    def _open_into(self) -> None:
        self._conn = self._open()

    def _retrying(self, step: Callable[[], T], what: str, started: float,
                  stop: threading.Event | None = None) -> tuple[T, int, bool]:
        """Run `step` under the retry policy: (its result, attempts taken, whether the first
        failure was a lost connection).

        The first attempt runs bare: building and iterating a tenacity.Retrying costs ~85 us,
        as much as a round trip, on every claim, ack and put, and importing tenacity a few ms
        of every process's start. Only a transient failure enters the policy, which is handed
        that failure as its attempt 1, so the backoff, the log lines and the give-up deadline
        (counted from `started`) are what they were."""
        try:
            return step(), 1, False
        except MySQLdb.Error as e:
            if not is_transient(e):
                raise
            first: MySQLdb.Error | None = e
            lost = is_connection_lost(e)
        remaining_s = max(0.0, self.retry_s - (time.monotonic() - started))
        for attempt in retry_policy(remaining_s, what, self.retry_log_level, stop):
            with attempt:
                if first is not None:
                    failed, first = first, None
                    self._count_conflict(failed, what)
                    raise failed
                try:
                    result = step()
                except MySQLdb.Error as e:
                    self._count_conflict(e, what)
                    raise
                return result, attempt.retry_state.attempt_number, lost
        raise AssertionError("unreachable")

    def _say_back(self, attempts: int, started: float, what: str) -> None:
        """After retrying, one line that the server answers again (the retries each logged one)."""
        if attempts > 1:
            log.log(self.retry_log_level, "database reachable again what=%s attempts=%d seconds=%.1f",
                    what, attempts, time.monotonic() - started)

    def _open(self) -> MySQLdb.connections.Connection:
        servers = self.dsn.servers
        if len(servers) == 1:
            return self._open_server(0, check_ready=False)
        choice = self._choice
        last: MySQLdb.Error | None = None
        for index in choice.order(len(servers)):
            try:
                conn = self._open_server(index, check_ready=True)
            except MySQLdb.Error as e:
                if not is_connection_lost(e):
                    raise
                last = e
                continue
            self._server_index = index
            with choice.lock:
                if choice.index != index and choice.chosen:
                    old = servers[choice.index]
                    log.warning("database writer node changed from=%s:%d to=%s:%d session=%s",
                                old[0], old[1], servers[index][0], servers[index][1], self.name)
                elif choice.index != index:
                    log.info("database writer node host=%s:%d (the ones before it in the DSN are down "
                             "or not ready)", servers[index][0], servers[index][1])
                choice.index, choice.chosen = index, True
            return conn
        assert last is not None
        raise last

    def _open_server(self, index: int, check_ready: bool) -> MySQLdb.connections.Connection:
        """One connection to servers[index]; check_ready: refuse a Galera node that is not a
        Synced member of the primary component (as a 1047, which the retry policy retries)."""
        args = self.dsn.connect_args(index)
        if not self.use_database:
            args.pop("database")
        try:
            conn = MySQLdb.connect(
                **args,
                autocommit=self.autocommit,
                # One attempt never outlasts the retry budget by much (a one-shot command's
                # few seconds), nor 10 s (a host that drops packets), nor, with several nodes
                # to choose from, FAILOVER_CONNECT_TIMEOUT_S (a paused node).
                connect_timeout=min(10 if len(self.dsn.servers) == 1 else FAILOVER_CONNECT_TIMEOUT_S,
                                    max(3, math.ceil(self.retry_s))),
                read_timeout=self.read_timeout_s,
                write_timeout=30,
                conv=CONVERSIONS,
            )
        except MySQLdb.OperationalError as e:
            code = error_code(e)
            if code in ACCESS_DENIED:
                raise errors.DatabaseError(
                    f"the server refused user {self.dsn.user!r}: check the password and grants"
                ) from None
            if code == UNKNOWN_DATABASE:
                raise errors.SchemaError(
                    f"database {self.dsn.database!r} does not exist: run `notifyq init`"
                ) from None
            raise
        if self.dsn.tls_mode:
            _require_tls(conn, self.dsn)
        cur = conn.cursor()
        # One round trip: the session's settings, then the server, its identity and its wsrep
        # state (empty values on a server without Galera; MySQL has the status names too, or
        # none: both read as not Galera). READ COMMITTED: every statement sees fresh commits (a
        # long RR snapshot would hide new jobs) and locking reads take no gap locks that block
        # producers.
        settings, params = "time_zone = '+00:00', innodb_lock_wait_timeout = 10", ()
        if self.idle_timeout_s is not None:
            settings, params = f"{settings}, wait_timeout = %s", (int(self.idle_timeout_s),)
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; "
                    f"SET SESSION {settings}; "
                    f"SELECT VERSION(), @@max_allowed_packet, {NODE_IDENTITY_SQL}; {_SERVER_STATUS}", params or None)
        cur.nextset()  # past the two SETs' results, each an error if the statement failed
        cur.nextset()
        self.server_version, self.max_allowed_packet, self.node = cur.fetchone()
        cur.nextset()
        wsrep = {str(name).lower(): str(value) for name, value in cur.fetchall()}
        cur.close()
        self._server_started_at = time.monotonic() - max(0.0, float(wsrep.get("uptime", "inf")) - 1)
        self.galera = bool(wsrep.get("wsrep_provider_name"))
        if check_ready and self.galera and not _ready(wsrep):
            conn.close()
            host, port = self.dsn.servers[index]
            raise MySQLdb.OperationalError(NOT_READY, f"node {host}:{port} is not ready (state "
                                           f"{wsrep.get('wsrep_local_state_comment')}, component "
                                           f"{wsrep.get('wsrep_cluster_status')})")
        self.connection_id = conn.thread_id()
        return conn

    def discard(self) -> None:
        if self._pending is not None:  # its reply is never read: a COMMIT's outcome is unknown
            self._fail_pending(MySQLdb.OperationalError(2013, "connection discarded before the reply"))
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # already broken: nothing to clean up
                pass
            self._conn = None
            self.connection_id = None

    def close(self) -> None:
        if self._pending is not None and self._conn is not None:
            self.settle()  # a COMMIT sent ahead is read, not left to an unknown outcome
        self.discard()

    def cursor(self):
        return self.conn.cursor()

    def send_later(self, sql: str, params: dict[str, Any], fallback: str | None = None) -> None:
        """Send statements and return without waiting for their reply.

        The server acts on them as soon as they arrive; the reply is read (and any rows
        discarded) before this session's next statement. For the watch hand-off: the next idle
        consumer is granted the watch lock while this one already runs its batch, a round trip
        sooner. Only on autocommit sessions. If they fail (the server stops a multi-statement
        query at its first error), `fallback`, bound with the same params, runs in their place
        when the reply is read: it must do what matters of theirs (release a lock). Without
        one, or if it fails too, the connection ends, which frees every advisory lock it held:
        never for a session holding a lock it must keep (a consumer's liveness lock).
        """
        assert self.autocommit
        conn = self.conn
        cur = conn.cursor()
        try:
            query = cur.mogrify(sql, params)
            fallback_query = cur.mogrify(fallback, params) if fallback is not None else None
        finally:
            cur.close()
        try:
            conn.send_query(query.encode(conn.encoding))
        except MySQLdb.Error as e:
            self._after_error(e)
            return
        self._pending = Pending("send later", commit=False, fallback=fallback_query)

    @property
    def commit_rides_along(self) -> bool:
        """Whether a COMMIT may share a multi-statement query with other statements (one round
        trip). Not on a Galera node: there a COMMIT inside a multi-statement query returned OK
        for transactions a certification conflict had rolled back (writers on two nodes: 357 of
        2,400 jobs acknowledged and not stored), so it goes alone, a round trip more."""
        return not self.galera

    def send_commit(self, cur, statements: list[tuple[str, dict[str, Any]]], what: str,
                    wait_replies: bool = False) -> Pending:
        """A transaction's last statements and its COMMIT as one multi-statement query, sent and
        not waited for: every reply is read before this session's next statement, or by settle().
        wait_replies: the statements' replies are read here (their errors are the body's, and
        rerun it), so that the row locks they take are held when this returns; only the
        COMMIT's is left on the wire.

        For the claim: its rows are locked by the time this is called, so its jobs may start at
        once, while the server writes the mark and the COMMIT's fsync runs (about 3 ms on a plain
        disk). If a statement or the COMMIT then fails, or the connection is lost, the rows unlock
        and may be claimed again elsewhere: a duplicate run of the kind a crash allows under
        at-least-once, and the claim token fences this claim's acks (a mark that never landed
        leaves rows no ack of ours matches). So the failure is not retried (nothing would run the
        work again here): it is recorded in the returned Pending, counted (failed_commits) and
        logged. On a Galera node the COMMIT goes alone (commit_rides_along), so there the
        statements' replies are read here first. Closes `cur`: the COMMIT is the transaction's
        last word. Only in an idempotent Session.run body.
        """
        if not self._attempt_idempotent or self.autocommit or not statements:
            raise AssertionError("send_commit is for idempotent transactions with statements")
        query = ";\n".join([cur.mogrify(sql, params) for sql, params in statements]
                           + (["COMMIT"] if self.commit_rides_along else []))
        cur.close()  # now: closing it later would read the connection while the reply is due
        conn = self.conn
        pending = Pending(what, commit=True)
        conn.send_query(query.encode(conn.encoding))
        self._pending = pending
        if wait_replies or not self.commit_rides_along:
            try:
                conn.read_query_result()
                pending.rowcounts.append(conn.affected_rows())
                for _ in statements[1:]:
                    conn.next_result()
                    pending.rowcounts.append(conn.affected_rows())
                if not self.commit_rides_along:
                    conn.send_query(b"COMMIT")  # once the statements answered
            except BaseException:
                self._pending = None  # a statement failed: the server ran nothing after it
                raise
            pending.replied = len(statements) if self.commit_rides_along else 0
        self._committed_in_body = True
        return pending

    def settle(self) -> None:
        """Read the reply of a statement sent ahead, if one is on the wire. Never raises: a
        COMMIT's failure is its Pending's (and counted); a statement sent later that failed
        is replaced by its fallback, or else ends the connection, as a lost one would."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        conn = self._conn
        try:
            if pending.replied:
                conn.next_result()  # the COMMIT's, after the statements' replies read already
            else:
                conn.read_query_result()
                pending.rowcounts.append(conn.affected_rows())
                conn.discard_result()
            while conn.next_result() == 0:  # the rest of a multi-statement query
                pending.rowcounts.append(conn.affected_rows())
                conn.discard_result()
        except MySQLdb.Error as e:
            self._fail_pending(e, pending)
            if pending.commit:
                self._after_error(e)  # lost: discard; else ROLLBACK, so the rows unlock now
            elif not self._run_fallback(e, pending):
                self.discard()
        finally:
            pending.settled = True

    def _run_fallback(self, exc: MySQLdb.Error, pending: Pending) -> bool:
        """A statement sent later failed on a connection that still answers: run its fallback
        there. False when the connection must end instead."""
        if pending.fallback is None or is_connection_lost(exc):
            return False
        log.debug("a statement sent ahead failed session=%s error=%s: running its fallback",
                  self.name, describe(exc))
        try:
            cur = self._conn.cursor()
            try:
                cur.execute(pending.fallback)
            finally:
                cur.close()
        except MySQLdb.Error:
            return False
        return True

    def _fail_pending(self, exc: BaseException, pending: Pending | None = None) -> None:
        if pending is None:
            pending, self._pending = self._pending, None
        if pending is None or pending.settled:
            return
        pending.error, pending.settled = exc, True
        if pending.commit:
            self.failed_commits += 1
            log.warning("a COMMIT sent ahead failed what=%s session=%s error=%r: the transaction is "
                        "not ours to count on (the claim's jobs may run again elsewhere; its acks "
                        "are fenced)", pending.what, self.name, describe(exc))

    def commit_with(self, cur, statements: list[tuple[str, dict[str, Any]]]) -> list[int]:
        """A transaction's last statements and its COMMIT, sent as one multi-statement query.

        One round trip instead of len(statements) + 1 (mysqlclient enables multi-statement
        queries by default; every value is bound by mogrify, as in execute). Returns each
        statement's rowcount. Only inside an idempotent Session.run body: a connection lost
        here leaves the COMMIT's outcome unknown, and the body must be safe to run again.
        """
        if not self._attempt_idempotent or self.autocommit:
            raise AssertionError("commit_with is for idempotent transactions only")
        query = ";\n".join([cur.mogrify(sql, params) for sql, params in statements]
                           + (["COMMIT"] if self.commit_rides_along else []))
        cur.execute(query)
        rowcounts = [cur.rowcount]
        while cur.nextset():
            rowcounts.append(cur.rowcount)
        if not self.commit_rides_along:
            cur.connection.commit()
        self._committed_in_body = True
        return rowcounts[:len(statements)]

    def commit_then_read(self, cur, sql: str, params: dict[str, Any], *, result: Any = None) -> tuple | None:
        """COMMIT, and one read that must see the world after it, as one multi-statement query:
        one round trip, as a bare COMMIT. Returns the read's first row, or None if the read
        failed after the COMMIT succeeded (the read is advice: the transaction is done, and
        must not be run again for it). A lost connection during the COMMIT leaves its outcome
        unknown: Session.run treats it as it treats a lost COMMIT after the body (a rerun of an
        idempotent body; else its `committed` test, asked about `result`, the value the body
        returns after this call; else OutcomeUnknown)."""
        if self.autocommit:
            raise AssertionError("commit_then_read is for transactions")
        # Bound once per statement and values: a producer sends the same look after every put,
        # and mogrify per put was a tenth of its CPU.
        key = (sql, tuple(sorted(params.items())))
        query = self._rendered.get(key)
        if query is None:
            query = self._rendered[key] = ("COMMIT;\n" if self.commit_rides_along else "") + cur.mogrify(sql, params)
        self._committing_in_body, self._body_result = True, result
        if self.commit_rides_along:
            cur.execute(query)  # the COMMIT's result: raises if the COMMIT failed
        else:
            cur.connection.commit()
        self._committing_in_body = False
        self._committed_in_body = True
        try:
            if self.commit_rides_along:
                cur.nextset()
            else:
                cur.execute(query)
            row = cur.fetchone()
            while cur.nextset():
                pass
            return row
        except MySQLdb.Error:
            try:
                cur.close()
            except MySQLdb.Error:
                pass
            self.discard()  # out of step with the server, or gone: the next run reconnects
            return None

    def run(self, body: Callable[[Any], T], *, what: str, idempotent: bool = True,
            committed: Callable[[Any, T], bool] | None = None) -> T:
        """Run `body(cursor)` as one transaction (or one autocommit step), retrying it whole.

        A lost connection during COMMIT leaves the outcome unknown: idempotent bodies (every
        claim, ack and retry statement is fenced by status and claim token) just run again;
        others raise OutcomeUnknown rather than risk doing the work twice, unless they say how
        to find out: `committed(cursor, result)` asks, on a new connection (on Galera, the next
        node, after it applied everything the cluster committed), whether the transaction that
        returned `result` is stored; if so its result stands, if not it is run again.
        """
        try:
            return self._run(body, what=what, idempotent=idempotent, committed=committed)
        except MySQLdb.Error as e:
            if is_transient(e):
                raise errors.TransientDBError(f"{what} failed after retrying: {describe(e)}") from e
            raise

    def _run(self, body: Callable[[Any], T], *, what: str, idempotent: bool,
             committed: Callable[[Any, T], bool] | None) -> T:
        started = time.monotonic()
        result, attempts, lost = self._retrying(lambda: self._attempt(body, idempotent, committed),
                                                what, started)
        if lost:  # a deadlock retried is no outage: nothing to announce
            self._say_back(attempts, started, what)
        return result

    def _count_conflict(self, exc: BaseException, what: str) -> None:
        """Count a 1213 (the transaction is rerun whole). One now and then is a deadlock; a steady
        rate on a Galera cluster means writes through a second node conflict with ours."""
        if error_code(exc) != DEADLOCK:
            return
        self.conflicts += 1
        now = time.monotonic()
        self._conflict_times = [t for t in self._conflict_times if now - t < CONFLICT_WINDOW_S] + [now]
        if len(self._conflict_times) >= CONFLICT_WARN_COUNT:
            self._conflict_times = []
            log.warning("transactions rerun after deadlocks or certification conflicts at a steady rate "
                        "count=%d seconds=%g what=%s session=%s: on a Galera cluster another node takes "
                        "writes to the queue tables; point every notifyq process at the same node "
                        "(one multi-host DSN in the same order, or one HAProxy backend)",
                        CONFLICT_WARN_COUNT, CONFLICT_WINDOW_S, what, self.name)

    def _attempt(self, body: Callable[[Any], T], idempotent: bool,
                 committed: Callable[[Any, T], bool] | None = None) -> T:
        committing = False
        sent_at = time.monotonic()
        self._attempt_idempotent, self._committed_in_body = idempotent, False
        self._committing_in_body, self._body_result = False, None
        if (self._choice is not None and self.follows_writer and self._conn is not None
                and self._choice.index != self._server_index):
            self.discard()  # another session of this process failed over: follow it (never mid-transaction)
        try:
            cur = self.conn.cursor()
            try:
                result = body(cur)
            finally:
                cur.close()
            if not self.autocommit and not self._committed_in_body:
                committing = True
                self.conn.commit()
            self.answered_at = sent_at
            return result
        except BaseException as e:
            # Any exception, not only the driver's: a body that fails halfway (bad input found
            # after its first statement, a bug, an interrupt) must not leave its statements in
            # an open transaction for the session's next COMMIT to make permanent.
            self._after_error(e)
            in_body = self._committing_in_body  # commit_then_read's COMMIT: its `result` stands in
            committing = committing or in_body
            if committing and is_connection_lost(e) and not idempotent and committed is not None:
                if in_body:
                    result = self._body_result
                if self._landed(committed, result):
                    return result
                raise  # not stored: the policy runs it again
            if committing and is_connection_lost(e) and not idempotent:
                raise errors.OutcomeUnknown(
                    f"connection lost during COMMIT ({describe(e)}): the outcome is unknown"
                ) from None
            raise

    def _landed(self, committed: Callable[[Any, T], bool], result: T) -> bool:
        """After a COMMIT whose reply was lost: is its transaction stored? On a new connection,
        retried like any read; on Galera the read first waits until this node has applied every
        write set the cluster committed (wsrep_sync_wait), so one that made it is seen."""
        def ask(cur) -> bool:
            if self.galera:
                cur.execute("SET SESSION wsrep_sync_wait = 1")
            try:
                return committed(cur, result)
            finally:
                if self.galera:
                    cur.execute("SET SESSION wsrep_sync_wait = 0")

        try:
            landed = self._run(ask, what="check an unacknowledged commit", idempotent=True, committed=None)
        except MySQLdb.Error as e:
            raise errors.OutcomeUnknown(f"connection lost during COMMIT, and the server could not be "
                                        f"asked whether it was stored ({describe(e)})") from None
        if landed:
            log.warning("connection lost during COMMIT; the transaction was stored, not run again")
        else:
            log.warning("connection lost during COMMIT; the transaction was not stored: running it again")
        return landed

    def _after_error(self, exc: BaseException) -> None:
        if is_connection_lost(exc) or self._conn is None:
            self.discard()
            return
        try:
            self._conn.rollback()
        except Exception:  # out of sync or gone: closing the connection rolls back too
            self.discard()


def _ready(wsrep: dict[str, str]) -> bool:
    """A Galera node that may take our writes: ready, Synced, in the primary component."""
    return (wsrep.get("wsrep_ready") == "ON" and wsrep.get("wsrep_local_state_comment") == "Synced"
            and wsrep.get("wsrep_cluster_status") == "Primary")
