"""A session: one connection to the queue's database that knows how to rebuild itself, and runs
transactions whole under the one retry policy (store/driver.py). What it sends ahead of the
replies is its Pipeline's (store/pipeline.py); which Galera node it writes through, its
WriterChoice's (store/writer.py).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import MySQLdb

from notifyq import errors
from notifyq.config import DSN
from notifyq.store.driver import (ACCESS_DENIED, CONVERSIONS, NOT_READY, PRIVILEGE_DENIED, RSA_KEY_NEEDED,
                                  UNKNOWN_DATABASE, Conflicts, describe, error_code, is_connection_lost, is_transient,
                                  retry_policy)
from notifyq.store import server_role
from notifyq.store.pipeline import Attempt, Pipeline, Waiting
from notifyq.store.reach import Reach
from notifyq.store.sql import QUERIES
from notifyq.store.writer import FAILOVER_CONNECT_TIMEOUT_S, FAILOVER_READ_TIMEOUT_S, WriterChoice, ready_for_writes

log = logging.getLogger("notifyq.db")
T = TypeVar("T")

# Identity of the server a session runs on: what a consumer records as the node holding its
# liveness lock, compared in SQL by the reaper's queries (queries.sql uses the same expression).
NODE_IDENTITY_SQL = "CONCAT(@@hostname, ':', @@port)"
# The server's uptime (a reaper's restart grace: reaper.reap) and its wsrep state.
_SERVER_STATUS = ("SHOW GLOBAL STATUS WHERE Variable_name IN ('Uptime', "
                 "'wsrep_provider_name', 'wsrep_ready', 'wsrep_local_state_comment', 'wsrep_cluster_status')")


def address(dsn: DSN) -> str:
    """Where the server is expected: host:port (each of them), or the socket path."""
    if dsn.unix_socket:
        return f"socket {dsn.unix_socket}"
    return ",".join(f"{h}:{p}" for h, p in dsn.servers)


def oneshot_session(dsn: DSN, retry_s: float, name: str, retry_setting: str | None = "connect_retry_s") -> Session:
    """A session for a command that answers and exits (status, pause, jobs ...): its retries
    are logged at DEBUG only, so an unreachable server costs one error line, not one a step.
    retry_setting: the setting retry_s comes from (None: a budget of the code's own)."""
    return Session(dsn, retry_s=retry_s, name=name, retry_log_level=logging.DEBUG, retry_setting=retry_setting)


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


SERVER_RUN_SLACK_S = 0.2  # a connect's Uptime reading against the monotonic time taken after it
SAME_RUN_S = 2.0  # how far apart two Uptime readings of one server run may place its start


class Session:
    """One MySQLdb connection that knows how to rebuild itself.

    `autocommit=False` sessions run claims and acks as explicit short transactions in READ
    COMMITTED; `autocommit=True` sessions hold advisory locks and wait in GET_LOCK, and must
    never hold row locks (a row-lock/user-lock cycle is not detected by the server).
    """

    def __init__(self, dsn: DSN, *, autocommit: bool = False, read_timeout_s: int = 60,
                 retry_s: float = 60.0, name: str = "work", retry_log_level: int = logging.WARNING,
                 use_database: bool = True, idle_timeout_s: int | None = None,
                 idle_in_transaction_s: int | None = None,
                 stop: threading.Event | None = None, follows_writer: bool = True,
                 retry_setting: str | None = None, no_caller_deadline: bool = False):
        self.dsn = dsn
        # Set (the daemon stops): a connect retry ends at once, so SIGTERM does not wait for a
        # server that is gone. Only connects, and waits on purpose (GET_LOCK, the watch's SLEEP:
        # _run): a transaction whose server answers (a deadlock, a lock wait, one lost connection
        # that reconnects at once) is still retried, as the drain's acks and give-backs must be.
        self.stop = stop
        self.autocommit = autocommit
        # Waits inside statements (GET_LOCK, the watch's SLEEP) are bounded by this (wakeup/waiter.py).
        self.read_timeout_s = (min(read_timeout_s, FAILOVER_READ_TIMEOUT_S) if len(dsn.servers) > 1
                               else read_timeout_s)
        # The server ends the session after this long without a statement (wait_timeout), and
        # frees its advisory locks: for short-lived sessions that hold a lock others need, so a
        # client host that vanished without closing its connection blocks them only this long.
        self.idle_timeout_s = idle_timeout_s
        # The server ends the session after this long without a statement inside a transaction
        # (MariaDB's idle_transaction_timeout; MySQL has none): for sessions whose transactions
        # are notifyq's own, statements that follow each other at once. A process frozen
        # (SIGSTOP, a paused VM) or a host vanished between two of them would otherwise keep the
        # rows it changed locked until wait_timeout (8 h by default), and every reaper pass
        # waiting on them. Never for a session a handler's transaction runs on (the work session).
        self.idle_in_transaction_s = idle_in_transaction_s
        # How long a connect retries an unreachable server, counted from the process's first
        # failure to reach it (Reach): a call after another call's retry gave up retries no more.
        self.retry_s = retry_s
        # The setting retry_s comes from, named when the connect gives up (None: a budget of
        # the code's own, a housekeeping session's)
        self.retry_setting = retry_setting
        # Whose deadline a transaction's retries keep. A caller's own (False: a console page's
        # 14 s): the budget counts from the call's start. None (True: a consumer's claims, acks
        # and waits): it counts from the call's first failure, and a lost connection found past
        # it is tried again on a new connection (LOST_PAST_BUDGET times), whose connect gives up
        # by the outage's own budget (Reach). A process paused (SIGSTOP, a frozen VM) longer
        # than the budget, in the middle of a call or of its retries, while the server
        # restarted, comes back to a lost connection with the server up: it gave up at once
        # and its worker ended (exit 5). A server that stays away still ends it in time.
        self.no_caller_deadline = no_caller_deadline
        self.reach = Reach.of(dsn)
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
        # While connect() retries: when the outage's budget ends (bounds each attempt's timeout)
        self._connect_deadline = math.inf
        self.generation = 0  # bumped on every new connection: advisory locks died with the old one
        self.server_version = ""
        self.max_allowed_packet = 0  # the server's limit on one statement, read at every connect
        self.connection_id: int | None = None  # readable from other threads (the stopper)
        # The connection's socket, (descriptor, inode), read at connect: what cut_socket shuts down
        # from another thread (the driver refuses fileno() while a read is under way, and a
        # descriptor's number is reused once closed; an inode names one socket).
        self._socket: tuple[int, int] | None = None
        # A duplicate of that socket's descriptor, kept while the connection is, which
        # closed_by_server polls (made at its first call: only a consumer's liveness session asks)
        self._watch: SocketWatch | None = None
        # The client port of each connection id this session has had (the last few; None: a unix
        # socket): the server lists it in the session's host, and ids start again from 1 after a
        # server restart, so an id alone may name another client's session by then (port_of).
        self._ports: dict[int, int | None] = {}
        self.pipeline = Pipeline(self)
        self.attempt = Attempt()  # the transaction being run (Session.run)
        # The call waiting for the server's reply now, None between calls: read by the consumer's
        # stall watch (another thread), which says when a reply is overdue (consume/stall.py).
        self.waiting: Waiting | None = None
        self.node = ""  # the server's identity (NODE_IDENTITY_SQL) since the last connect
        self.galera = False  # the server is a Galera node (wsrep provider loaded)
        self._server_started_at = -math.inf  # monotonic, from the server's Uptime at connect
        self._server_started_no_earlier = -math.inf  # monotonic: the same reading's other bound
        # Monotonic time at which the last transaction that succeeded was sent: the connection (of
        # this generation, if it did not reconnect since) was open then, and with it its locks.
        self.answered_at = -math.inf
        # Monotonic time the current connection was last known open (it answered then): what a
        # later KILL of its id is weighed against (restarted_after). Not answered_at: a
        # connection from before a restart may be sent a statement after it, and fail.
        self.open_at = -math.inf
        self.conflicts = Conflicts()  # transactions rerun after 1213: deadlocks, certification conflicts

    def server_up_s(self) -> float:
        """How long the server has been up, never more than the truth: its Uptime, read at
        connect, is a difference of two whole-second clock readings (the statement's and the
        server's start, each rounded down), up to a second over or under (a server 0.3 s old
        said 1; one 1.9 s old, 1), so a second less than it."""
        return time.monotonic() - self._server_started_at

    @property
    def server_run(self) -> float:
        """Which run of the server the current connection is of: the lower bound of its start
        (monotonic) read at connect, a second before what Uptime says (it may be a second
        under). Two readings of one run lie within two seconds of each other
        (SERVER_RUN_SLACK_S more for the readings' own round trips)."""
        return self._server_started_no_earlier

    def restarted_after(self, t: float, run: float | None = None) -> bool:
        """Whether the server started, for sure, after monotonic time `t` (a restart since then),
        or (`run`: the server_run of the connection alive at `t`) is another run than the one
        connected now: a connection of ours alive at `t` is gone, and its id may name another
        client's session now. The server started no earlier than server_run; that bound alone
        cannot tell a restart within two seconds of `t` (a crash, the server back 0.3 s later),
        which the two runs' readings can: they are as far apart as the old run was long.
        Two readings of one run up to two seconds apart are one run: taken for two (a second
        was once the bound), a timed-out handler's connection was left open, its locks held."""
        if run is not None and self._server_started_no_earlier - run > SAME_RUN_S + SERVER_RUN_SLACK_S:
            return True
        return self._server_started_no_earlier > t

    @property
    def connected(self) -> bool:
        """False while (re)connecting, or before the first connect: for health views."""
        return self._conn is not None

    @property
    def current_conn(self) -> MySQLdb.connections.Connection | None:
        """The connection as it is, None between connections: never connects nor reads a reply
        sent ahead (the Pipeline reads that reply on it)."""
        return self._conn

    @property
    def conn(self) -> MySQLdb.connections.Connection:
        if self._conn is None:
            self.connect()
        if self.pipeline.pending is not None:
            self.pipeline.read_reply()
            if self._conn is None:  # the reply was a lost connection
                self.connect()
        assert self._conn is not None
        return self._conn

    def connect(self) -> None:
        self.discard()
        started = time.monotonic()
        what = f"connect {self.name}"
        try:
            # The budget counts from the outage's start: another session of this process may
            # have retried it already (Reach)
            since = self.reach.since(started)
            self._connect_deadline = since + self.retry_s
            _, attempts, _ = self._retrying(self._open_into, what, since, self.stop)
        except MySQLdb.Error as e:
            if self.stop is not None and self.stop.is_set():
                raise errors.TransientDBError(f"stopped while connecting to {address(self.dsn)}: "
                                              f"{describe(e)}") from None
            if is_connection_lost(e):
                self._gave_up()
            raise errors.DatabaseError(
                f"cannot reach the database server at {address(self.dsn)}: {describe(e)}{self._retried()}"
            ) from None
        finally:
            self._connect_deadline = math.inf
        self._log_reachable_again(attempts, started, what)
        self.generation += 1

    def _gave_up(self) -> None:
        """Retrying an unreachable server ended, with this session's budget (Reach.gave_up: a
        consumer whose own budget is used up exits, whatever its workers are doing)."""
        self.reach.gave_up(self.retry_s, time.monotonic())

    def _retried(self) -> str:
        """How long a lost server was retried, and the setting that says so, for the error."""
        setting = f": {self.retry_setting}" if self.retry_setting else ""
        return f" (retried for {self.retry_s:g} s{setting})" if self.retry_s else ""

    def _open_into(self) -> None:
        attempted_at = time.monotonic()
        try:
            self._conn = self._open()
        except MySQLdb.Error as e:
            if is_connection_lost(e):
                self.reach.failed(attempted_at)
            raise
        self.reach.answered()

    def _retrying(self, step: Callable[[], T], what: str, started: float | None,
                  stop: threading.Event | None = None, lost_past_budget: int = 0) -> tuple[T, int, bool]:
        """Run `step` under the retry policy: (its result, attempts taken, whether the first
        failure was a lost connection).

        The first attempt runs bare: building and iterating a tenacity.Retrying costs ~85 us,
        as much as a round trip, on every claim, ack and put, and importing tenacity a few ms
        of every process's start. Only a transient failure enters the policy, which is handed
        that failure as its attempt 1, so the backoff and the log lines are what they were.
        The give-up deadline counts from `started`, or (None) from the first failure."""
        try:
            return step(), 1, False
        except MySQLdb.Error as e:
            if not is_transient(e):
                raise
            first: MySQLdb.Error | None = e
            lost = is_connection_lost(e)
        remaining_s = self.retry_s if started is None else max(0.0, self.retry_s - (time.monotonic() - started))
        for attempt in retry_policy(remaining_s, what, self.retry_log_level, stop, lost_past_budget):
            with attempt:
                if first is not None:
                    failed, first = first, None
                    self.conflicts.record(failed, what, self.name)
                    raise failed
                try:
                    result = step()
                except MySQLdb.Error as e:
                    self.conflicts.record(e, what, self.name)
                    raise
                return result, attempt.retry_state.attempt_number, lost
        raise AssertionError("unreachable")

    def _log_reachable_again(self, attempts: int, started: float, what: str) -> None:
        """After retrying, one line that the server answers again (the retries each logged one)."""
        if attempts > 1:
            log.log(self.retry_log_level, "database reachable again what=%s attempts=%d seconds=%.1f",
                    what, attempts, time.monotonic() - started)

    def _open(self) -> MySQLdb.connections.Connection:
        if self._choice is None:
            return self._open_server(0, check_ready=False)
        self._server_index, conn = self._choice.open(
            self.dsn.servers, lambda index: self._open_server(index, check_ready=True), self.name)
        return conn

    def _connect_timeout_s(self) -> int:
        """One attempt never outlasts the retry budget by much (a one-shot command's few
        seconds), nor 10 s (a host that drops packets), nor, with several nodes to choose from,
        FAILOVER_CONNECT_TIMEOUT_S (a paused node); nor the outage's budget by more than
        CONNECT_PAST_BUDGET_S: against a server that accepts and never answers (frozen) the last
        attempt overran it by up to 10 s, and a daemon's exit 5 came that much later."""
        timeout = min(10 if len(self.dsn.servers) == 1 else FAILOVER_CONNECT_TIMEOUT_S,
                      max(3, math.ceil(self.retry_s)))
        left_s = self._connect_deadline - time.monotonic()
        return timeout if left_s >= timeout else max(CONNECT_PAST_BUDGET_S, math.ceil(left_s))

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
                connect_timeout=self._connect_timeout_s(),
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
            if code == RSA_KEY_NEEDED:
                raise errors.DatabaseError(
                    f"the server asks user {self.dsn.user!r} for caching_sha2_password's RSA exchange "
                    "over a connection without TLS: use TLS (ssl_mode=REQUIRED), or give the server's "
                    "public key with ?server_public_key=PATH in the DSN"
                ) from None
            if code == UNKNOWN_DATABASE:
                raise errors.SchemaError(
                    f"database {self.dsn.database!r} does not exist: run `notifyq init`"
                ) from None
            raise
        if self.dsn.tls_mode:
            _require_tls(conn, self.dsn)
        self.server_version, self.max_allowed_packet, self.node, wsrep, variables = _prepare(
            conn, self.idle_timeout_s, self.idle_in_transaction_s)
        host, port = self.dsn.servers[index]
        # At every connect, so also after a failover moved the DSN's address to another server
        _refuse_unless_writer(conn, variables, f"{host}:{port}" if len(self.dsn.servers) > 1 else address(self.dsn))
        now, uptime = time.monotonic(), float(wsrep.get("uptime", "inf"))
        self._server_started_at = now - max(0.0, uptime - 1)
        self._server_started_no_earlier = now - uptime - 1  # Uptime may be a second under, too
        self.open_at = now
        self.galera = bool(wsrep.get("wsrep_provider_name"))
        if check_ready and self.galera and not ready_for_writes(wsrep):
            conn.close()
            raise MySQLdb.OperationalError(NOT_READY, f"node {host}:{port} is not ready (state "
                                           f"{wsrep.get('wsrep_local_state_comment')}, component "
                                           f"{wsrep.get('wsrep_cluster_status')})")
        self.connection_id = conn.thread_id()
        self._socket = socket_of(conn)
        self._ports[self.connection_id] = client_port(self._socket)
        while len(self._ports) > PORTS_KEPT:
            del self._ports[next(iter(self._ports))]
        return conn

    def discard(self) -> None:
        if self.pipeline.pending is not None:  # its reply is never read: a COMMIT's outcome is unknown
            self.pipeline.fail_pending(MySQLdb.OperationalError(2013, "connection discarded before the reply"))
        if self._conn is not None:
            self._socket = None
            watch, self._watch = self._watch, None
            if watch is not None:  # first: the connection's socket closes with its own descriptor
                watch.close()
            try:
                self._conn.close()
            except Exception:  # already broken: nothing to clean up
                pass
            self._conn = None
            self.connection_id = None

    def port_of(self, conn_id: int) -> int | None:
        """The client port this session's connection `conn_id` had, if it had that id lately
        and spoke TCP; None otherwise."""
        return self._ports.get(conn_id)

    def closed_by_server(self) -> bool:
        """Whether the server has ended this session's connection while it sat idle (a KILL of
        it, the server's shutdown): no call of ours waits for a reply and none was sent ahead,
        yet the socket has something to read (the server's close). One poll of the socket, no
        statement. False when it cannot tell: a call under way makes the socket readable too."""
        mine = self._socket
        if mine is None or self.waiting is not None or self.pipeline.pending is not None:
            return False
        watch = self._watch
        if watch is None or watch.mine is not mine:
            # Asked before every job a consumer starts: one duplicate per connection, polled,
            # where a duplicate made, checked and closed per call cost 3-8 µs a job
            watch = self._watch = SocketWatch(mine)
            if self._socket is not mine:  # discarded meanwhile: hold nothing of the old socket
                watch.close()
                return False
        return watch.readable()

    def cut_socket(self) -> bool:
        """Shut this session's socket down on the client's side, from another thread (the stall
        watch): a read blocked on it returns at once, as a lost connection (2013), and the session
        reconnects at its next call. A KILL CONNECTION alone ends the server's side, whose close
        never reaches a client behind a black-holed network path: its read waited out its read
        timeout. False: nothing cut (see shut_down)."""
        return shut_down(self._socket)

    def close(self) -> None:
        if self.pipeline.pending is not None and self._conn is not None:
            self.pipeline.read_reply()  # a COMMIT sent ahead is read, not left to an unknown outcome
        self.discard()

    def cursor(self):
        return self.conn.cursor()

    def run(self, body: Callable[[Any], T], *, what: str, idempotent: bool = True,
            committed: Callable[[Any, T, float], bool] | None = None, wait_s: float = 0.0) -> T:
        """Run `body(cursor)` as one transaction (or one autocommit step), retrying it whole.

        A lost connection during COMMIT leaves the outcome unknown: idempotent bodies (every
        claim, ack and retry statement is fenced by status and claim token) just run again;
        others raise OutcomeUnknown rather than risk doing the work twice, unless they say how
        to find out: `committed(cursor, result, written_by)` asks, on a new connection (on
        Galera, the next node, after it applied everything the cluster committed), whether the
        transaction that returned `result` is stored; if so its result stands, if not it is run
        again. Its rows, if stored, were written by `written_by` on time.monotonic()'s clock (as
        its COMMIT went out, give or take the clocks' drift): a row of the same key written later
        is another transaction's (crash recovery may give a lost transaction's AUTO_INCREMENT ids
        again).
        wait_s: how long the body may wait on the server on purpose (GET_LOCK, SLEEP): its reply
        is overdue only after that (Session.waiting).
        """
        try:
            return self._run(body, what=what, idempotent=idempotent, committed=committed, wait_s=wait_s)
        except MySQLdb.Error as e:
            if is_transient(e):
                if wait_s > 0 and self.stop is not None and self.stop.is_set():
                    raise errors.TransientDBError(f"{what} ended by the stop, not retried: {describe(e)}") from e
                # A lost connection was retried for the session's retry_s: named, as a connect's is
                waited = self._retried() if is_connection_lost(e) else ""
                if is_connection_lost(e):
                    self._gave_up()
                raise errors.TransientDBError(f"{what} failed after retrying: {describe(e)}{waited}") from e
            if error_code(e) in PRIVILEGE_DENIED:
                raise errors.GrantMissing(f"{what}: a grant is missing ({describe(e)}): as an admin, apply "
                                          f"what `notifyq init --print-grants USER` prints") from e
            raise

    def _run(self, body: Callable[[Any], T], *, what: str, idempotent: bool,
             committed: Callable[[Any, T, float], bool] | None, wait_s: float = 0.0) -> T:
        started = time.monotonic()
        # A wait on purpose (an idle wait for work, a lock wait) is not run again once the daemon
        # stops: the stop interrupts such waits, and on a server that does not answer the stall
        # watch cuts them; a retry would only connect (up to 10 s on a frozen server) to wait
        # for nothing. Other calls (the drain's acks and give-backs) are retried as ever.
        stop = self.stop if wait_s > 0 else None
        result, attempts, lost = self._retrying(lambda: self._attempt(body, idempotent, committed, what, wait_s),
                                                what, None if self.no_caller_deadline else started, stop,
                                                LOST_PAST_BUDGET if self.no_caller_deadline else 0)
        if lost:  # a deadlock retried is no outage: nothing to announce
            self._log_reachable_again(attempts, started, what)
        return result

    def _attempt(self, body: Callable[[Any], T], idempotent: bool,
                 committed: Callable[[Any, T, float], bool] | None = None, what: str = "", wait_s: float = 0.0) -> T:
        committing = False
        sent_at = time.monotonic()
        self.attempt = attempt = Attempt(idempotent)
        if (self._choice is not None and self.follows_writer and self._conn is not None
                and self._choice.index != self._server_index):
            self.discard()  # another session of this process failed over: follow it (never mid-transaction)
        try:
            cur = self.conn.cursor()
            # (after the connect and any reply sent ahead: a connect retry logs on its own)
            self.waiting = Waiting(time.monotonic(), wait_s, what)
            try:
                result = body(cur)
            finally:
                cur.close()
            if not self.autocommit and not attempt.committed:
                committing = True
                attempt.commit_sent_at = time.monotonic()
                self.conn.commit()
            self.waiting = None
            self.answered_at, self.open_at = sent_at, time.monotonic()
            self.reach.answered()  # the server answers: an outage another session found is over
            return result
        except BaseException as e:
            self.waiting = None
            # Any exception, not only the driver's: a body that fails halfway (bad input found
            # after its first statement, a bug, an interrupt) must not leave its statements in
            # an open transaction for the session's next COMMIT to make permanent.
            self._after_error(e)
            in_body = attempt.committing  # commit_then_read's COMMIT: its `result` stands in
            committing = committing or in_body
            if committing and is_connection_lost(e) and not idempotent and committed is not None:
                if in_body:
                    result = attempt.result
                if _landed(self, committed, result, attempt.commit_sent_at):
                    return result
                raise  # not stored: the policy runs it again
            if committing and is_connection_lost(e) and not idempotent:
                raise errors.OutcomeUnknown(
                    f"connection lost during COMMIT ({describe(e)}): the outcome is unknown"
                ) from None
            raise

    def rollback_after(self, exc: BaseException) -> None:
        """A transaction run outside Session.run (store/completion.py), or a reply sent ahead
        (the Pipeline's), failed: roll back, or drop the connection if it is gone or out of step."""
        self._after_error(exc)

    def _after_error(self, exc: BaseException) -> None:
        if is_connection_lost(exc) or self._conn is None:
            self.discard()
            return
        try:
            self._conn.rollback()
        except Exception:  # out of sync or gone: closing the connection rolls back too
            self.discard()


def socket_of(conn: Any) -> tuple[int, int] | None:
    """A DB-API connection's socket as (descriptor, inode), for shut_down from another thread
    (the driver refuses fileno() while a read is under way, and a descriptor's number is reused
    once closed; an inode names one socket): MySQLdb's, PyMySQL's; None for another driver's."""
    try:
        fileno = getattr(conn, "fileno", None)
        if callable(fileno):
            fd = int(fileno())
        else:
            sock = getattr(conn, "_sock", None)  # PyMySQL
            if sock is None:
                return None
            fd = sock.fileno()
        return fd, os.fstat(fd).st_ino
    except (OSError, ValueError, TypeError, MySQLdb.Error):
        return None


PORTS_KEPT = 32  # connection ids a session remembers the client port of
# Lost connections past the retry budget that a session with no caller deadline tries again on a
# new connection: a few, so that a server that takes every connection's statement down (a crash
# on it, a KILL each time) still ends the retries.
LOST_PAST_BUDGET = 3
# The shortest connect attempt at the end of an outage's budget (a connect's timeout is whole
# seconds; a loaded server may take one to accept)
CONNECT_PAST_BUDGET_S = 2


@contextlib.contextmanager
def _duplicate(mine: tuple[int, int] | None) -> Iterator[Any]:
    """A socket object on a duplicate of a connection's descriptor (socket_of), or None if it
    is not that socket any more (closed meanwhile, its number reused: an inode names one socket).
    Closing it closes the duplicate only: the connection's own descriptor stays open."""
    import socket  # here: the consumer's start path does not load it (tests/unit/test_imports.py)

    sock = None
    if mine is not None:
        number, inode = mine
        try:
            fd = os.dup(number)
        except OSError:  # closed meanwhile
            fd = -1
        if fd >= 0:
            try:
                if os.fstat(fd).st_ino == inode:
                    sock = socket.socket(fileno=fd)
            except OSError:
                pass
            if sock is None:
                os.close(fd)
    try:
        yield sock
    finally:
        if sock is not None:
            sock.close()


def client_port(mine: tuple[int, int] | None) -> int | None:
    """The local port of a connection's socket (socket_of); None for a unix socket or if unknown."""
    import socket

    with _duplicate(mine) as sock:
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        try:
            return int(sock.getsockname()[1])
        except OSError:
            return None


class SocketWatch:
    """A duplicate of a connection's descriptor (socket_of), held until close(), and a poll of
    it: whether the socket has something to read, at one system call. While the duplicate is
    open its number names this socket and no other, so the poll never asks about a file that
    took a closed descriptor's number; close() and the poll take turns (another thread may
    close it). If the descriptor is not that socket any more when it is made, it polls nothing
    (False)."""

    __slots__ = ("mine", "_fd", "_poller", "_lock")

    def __init__(self, mine: tuple[int, int]):
        import select  # here: the consumer's start path does not load it (tests/unit/test_imports.py)

        self.mine = mine
        self._lock = threading.Lock()
        self._fd = -1
        self._poller = select.poll()
        number, inode = mine
        try:
            fd = os.dup(number)
        except OSError:  # closed meanwhile
            return
        try:
            if os.fstat(fd).st_ino == inode:
                self._poller.register(fd, select.POLLIN | select.POLLPRI)
                self._fd, fd = fd, -1
        except OSError:
            pass
        finally:
            if fd >= 0:
                os.close(fd)

    def readable(self) -> bool:
        with self._lock:
            return self._fd >= 0 and bool(self._poller.poll(0))

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, -1
            if fd >= 0:
                os.close(fd)  # the duplicate only: the connection's own descriptor is the driver's

    def __del__(self) -> None:  # a session dropped without close(): its socket must not live on here
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def shut_down(mine: tuple[int, int] | None) -> bool:
    """Shut a connection's socket (socket_of) down on the client's side, from another thread: a
    read blocked on it returns at once, as a lost connection. Done on a duplicate of the
    descriptor, and only if it is still that socket (the connection may be closed meanwhile and
    its number reused). False: nothing cut."""
    import socket

    with _duplicate(mine) as sock:
        if sock is None:
            return False
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # not connected any more
            return False
        return True


# _landed's margins: how much younger than this process's clock says a stored transaction's rows
# may look on the server's clock. One server: its clock against ours over seconds (drift is parts
# per million; a step of the server's clock meanwhile makes a stored put look unstored, run again:
# a duplicate, never a loss). Galera: the next node's clock against the writer's (NTP keeps them
# within milliseconds; a failover takes the eviction timeout, seconds).
CLOCK_MARGIN_S = 0.1
CLUSTER_CLOCK_MARGIN_S = 1.0


def _landed(session: Session, committed: Callable[[Any, T, float], bool], result: T,
            commit_sent_at: float | None) -> bool:
    """After a COMMIT whose reply was lost: is its transaction stored? On a new connection,
    retried like any read; on Galera the read first waits until this node has applied every
    write set the cluster committed (wsrep_sync_wait), so one that made it is seen.

    `committed` is told by when the transaction's rows were written, on time.monotonic()'s
    clock: before the COMMIT went out, plus a margin for the clocks' drift (on Galera the next
    node's clock, not the one that wrote them). A server restarted meanwhile may have given the
    lost transaction's AUTO_INCREMENT ids to another one, whose rows are younger than that: a
    restart and a reconnect take far longer than the margin."""
    margin_s = CLUSTER_CLOCK_MARGIN_S if session.galera else CLOCK_MARGIN_S
    written_by = (time.monotonic() if commit_sent_at is None else commit_sent_at) + margin_s

    def ask(cur) -> bool:
        if session.galera:
            cur.execute("SET SESSION wsrep_sync_wait = 1")
        try:
            return committed(cur, result, written_by)
        finally:
            if session.galera:
                cur.execute("SET SESSION wsrep_sync_wait = 0")

    try:
        landed = session._run(ask, what="check an unacknowledged commit", idempotent=True, committed=None)
    except (MySQLdb.Error, errors.DatabaseError) as e:
        # DatabaseError too: the reconnect gave up (connect: the server stays away past the
        # retry budget, a producer's 5 s). Raised as it is, it said "nothing stored" of a
        # transaction that may have been, and a sharded dealer moved its jobs to another shard.
        raise errors.OutcomeUnknown(f"connection lost during COMMIT, and the server could not be "
                                    f"asked whether it was stored ({describe(e)})") from None
    if landed:
        log.warning("connection lost during COMMIT; the transaction was stored, not run again")
    else:
        log.warning("connection lost during COMMIT; the transaction was not stored: running it again")
    return landed


def _prepare(conn: MySQLdb.connections.Connection, idle_timeout_s: int | None,
             idle_in_transaction_s: int | None = None) -> tuple[str, int, str, dict, dict]:
    """A new connection's settings, and what it says of its server: (version, max_allowed_packet,
    identity, wsrep and uptime status, the variables that say whether it may be the writer)."""
    asks_writer = server_role.has_writer_variables(conn.get_server_info())
    cur = conn.cursor()
    # One round trip: the session's settings, then the server, its identity and its wsrep
    # state (empty values on a server without Galera; MySQL has the status names too, or
    # none: both read as not Galera), and on MySQL the variables that say whether it may be
    # the writer (server_role.py; MariaDB has none, known from the handshake: nothing is
    # sent). READ COMMITTED: every statement sees fresh commits (a long RR snapshot would hide
    # new jobs) and locking reads take no gap locks that block producers. No statement time limit a DBA may have set server-wide (MariaDB's
    # max_statement_time, MySQL's max_execution_time, each in a comment only its server runs):
    # it would kill a watcher's long GET_LOCK with an error nothing expects.
    settings = ("time_zone = '+00:00', innodb_lock_wait_timeout = 10"
                " /*M!100108 , max_statement_time = 0 */ /*!50708 , max_execution_time = 0 */")
    params: tuple = ()
    if idle_timeout_s is not None:
        settings, params = f"{settings}, wait_timeout = %s", (*params, int(idle_timeout_s))
    if idle_in_transaction_s is not None:  # MariaDB 10.3+ only: in a comment only it runs
        settings, params = (f"{settings} /*M!100300 , idle_transaction_timeout = %s */",
                            (*params, int(idle_in_transaction_s)))
    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; "
                f"SET SESSION {settings}; "
                f"SELECT VERSION(), @@max_allowed_packet, {NODE_IDENTITY_SQL}; {_SERVER_STATUS}"
                + ("; " + QUERIES["writer_variables"] if asks_writer else ""), params or None)
    cur.nextset()  # past the two SETs' results, each an error if the statement failed
    cur.nextset()
    version, max_packet, node = cur.fetchone()
    cur.nextset()
    wsrep = {str(name).lower(): str(value) for name, value in cur.fetchall()}
    variables: dict[str, str] = {}
    if asks_writer:
        cur.nextset()
        variables = {str(name).lower(): str(value) for name, value in cur.fetchall()}
    cur.close()
    return version, max_packet, node, wsrep, variables


def _refuse_unless_writer(conn: MySQLdb.connections.Connection, variables: dict[str, str], where: str) -> None:
    """Close `conn` and raise WriterRefused if its server may not be notifyq's writer
    (store/server_role.py); a member of a replication group is asked its role first, the one
    round trip more that only such a server costs."""
    member = None
    if server_role.in_group(variables):
        cur = conn.cursor()
        try:
            cur.execute(QUERIES["group_member"])
            member = cur.fetchone()
        finally:
            cur.close()
    why = server_role.refusal(variables, member)
    if why is not None:
        conn.close()
        raise errors.WriterRefused(f"notifyq refuses the server at {where}: {why}")
