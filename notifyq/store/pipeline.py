"""What a session sends ahead of its replies, and the COMMITs that share a round trip.

A claim's COMMIT goes out with its last statements and its jobs start before the reply comes
back (send_commit); a watcher's hand-on goes out without waiting (send_later); a due job's
promotion and its COMMIT go as one query (commit_with); a ringing producer's COMMIT carries the
bell's look (commit_then_read). The reply still on the wire is read before the session's next
statement (Session.conn), or by read_reply(); what it said lands in its Pending. Statements
that together exceed the server's max_allowed_packet (an ack's kept results) go as several
queries of one transaction, each within it (sized).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import MySQLdb

from notifyq.store.driver import QUERY_INTERRUPTED, cut_short, describe, error_code, is_connection_lost

log = logging.getLogger("notifyq.db")

# What a query holds besides its statements (the protocol's own bytes, a COMMIT, the joins),
# kept free of max_allowed_packet, as inserts.py keeps it.
PACKET_MARGIN_BYTES = 4096
FALLBACK_TRIES = 10  # a fallback a KILL QUERY interrupted runs again, up to this often in all


class Pending:
    """A statement sent without waiting for its reply (Pipeline.send_later, send_commit).

    The reply is read before the session's next statement, or by Pipeline.read_reply(). `failed`
    is known once `settled`: for a COMMIT it means the transaction is not ours to count on,
    whether the server refused it or the connection was lost before the reply (then its outcome
    is unknown, and whatever it would have made ours must be treated as possibly someone else's).
    It is failed too when its statements' row counts fail its `check`: the COMMIT went with
    statements a KILL QUERY cut short (an OK reply, fewer rows changed than meant)."""

    __slots__ = ("what", "commit", "replied", "settled", "error", "fallback", "rowcounts", "check", "on_row")

    def __init__(self, what: str, commit: bool, fallback: str | None = None,
                 check: Callable[[list[int]], bool] | None = None,
                 on_row: Callable[[tuple | None], None] | None = None):
        self.what = what
        self.commit = commit
        self.fallback = fallback  # send_later: a statement, bound already, to run if it failed
        self.on_row = on_row  # send_later: gets the first row of its (one) statement's reply
        self.check = check  # send_commit: whether the statements' row counts say each did its part
        self.replied = 0  # replies of the query read already (send_commit, wait_replies)
        self.rowcounts: list[int] = []  # each statement's affected rows, as its reply is read
        self.settled = False
        self.error: BaseException | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


class Waiting(NamedTuple):
    """A call of a session waiting for the server's reply (Session.waiting): since when (monotonic),
    how long it may wait on purpose (a GET_LOCK's or a SLEEP's wait; 0: an answer is due at once),
    and what it is. A tuple: one is made per call, and the stall watch compares them by identity."""

    since: float
    wait_s: float
    what: str


@dataclass
class Attempt:
    """One run of a Session.run body: what the session needs to know of it when it fails."""

    idempotent: bool = True
    committed: bool = False  # the body sent its own COMMIT (send_commit, commit_with, commit_then_read)
    committing: bool = False  # inside commit_then_read's COMMIT: its outcome is unknown if the connection is lost
    result: Any = None  # what the body returns after commit_then_read's COMMIT
    commit_sent_at: float | None = None  # time.monotonic() as its COMMIT went out (Session's _landed)


class Carrier(Protocol):
    """The session a pipeline sends on (store/db.py's Session), as the pipeline sees it: the seam
    runs one way, the session owns its pipeline and this module never imports the session's."""

    autocommit: bool
    galera: bool  # a COMMIT goes alone there (Pipeline.commit_rides_along)
    name: str
    max_allowed_packet: int  # the server's limit on one query (Pipeline.sized)
    attempt: Attempt  # the Session.run body running now
    waiting: Waiting | None  # set while a reply sent ahead is read: the stall watch sees the read

    @property
    def conn(self) -> Any:
        """The connection, connected, with any reply sent ahead read first."""

    @property
    def current_conn(self) -> Any:
        """The connection as it is, None between connections: never connects nor reads a reply."""

    def rollback_after(self, exc: BaseException) -> None:
        """Roll back after a failure, or drop the connection if it is gone or out of step."""

    def discard(self) -> None:
        """Close the connection: the next statement reconnects."""


class Pipeline:
    """A session's statements sent ahead of their replies (one per session, Session.pipeline)."""

    def __init__(self, session: Carrier):
        self._session = session
        self.pending: Pending | None = None  # a statement whose reply is still on the wire
        self.failed_commits = 0  # COMMITs sent ahead (send_commit) that failed or were lost

    def send_later(self, sql: str, params: dict[str, Any], fallback: str | None = None,
                   on_row: Callable[[tuple | None], None] | None = None) -> None:
        """Send statements and return without waiting for their reply.

        The server acts on them as soon as they arrive; the reply is read (and any rows
        discarded) before this session's next statement. For the watch hand-off: the next idle
        consumer is granted the watch lock while this one already runs its batch, a round trip
        sooner. Only on autocommit sessions. If they fail (the server stops a multi-statement
        query at its first error), `fallback`, bound with the same params, runs in their place
        when the reply is read: it must do what matters of theirs (release a lock). `on_row`
        gets the first row of the reply (None: no row) when it is read, before the rest. Without
        one, or if it fails too, the connection ends, which frees every advisory lock it held:
        never for a session holding a lock it must keep (a consumer's liveness lock).
        On a session another may KILL QUERY (the watcher's: the instant wake), send one statement:
        a KILL landing between two statements of one query makes the server drop the rest unanswered
        after a reply that says more follow, and the read waits out the read timeout.
        """
        assert self._session.autocommit
        conn = self._session.conn
        cur = conn.cursor()
        try:
            query = cur.mogrify(sql, params)
            fallback_query = cur.mogrify(fallback, params) if fallback is not None else None
        finally:
            cur.close()
        try:
            conn.send_query(query.encode(conn.encoding))
        except MySQLdb.Error as e:
            self._session.rollback_after(e)
            return
        self.pending = Pending("send later", commit=False, fallback=fallback_query, on_row=on_row)

    @property
    def commit_rides_along(self) -> bool:
        """Whether a COMMIT may share a multi-statement query with other statements (one round
        trip). Not on a Galera node: there a COMMIT inside a multi-statement query returned OK
        for transactions a certification conflict had rolled back (writers on two nodes: 357 of
        2,400 jobs acknowledged and not stored), so it goes alone, a round trip more."""
        return not self._session.galera

    def send_commit(self, cur, statements: list[tuple[str, dict[str, Any]]], what: str,
                    wait_replies: bool = False, *, verified: int = 0,
                    verify: Callable[[Any, list[int]], None] | None = None,
                    check: Callable[[list[int]], bool] | None = None,
                    rows: list[list[tuple] | None] | None = None) -> Pending:
        """A transaction's last statements and its COMMIT as one multi-statement query, sent and
        not waited for: every reply is read before this session's next statement, or by read_reply().
        wait_replies: the statements' replies are read here (their errors are the body's, and
        rerun it), so that the row locks they take are held when this returns; only the
        COMMIT's is left on the wire.

        For the claim: its rows are locked by the time this is called, so its jobs may start at
        once, while the server writes the mark and the COMMIT's fsync runs (about 3 ms on a plain
        disk). If a statement or the COMMIT then fails, or the connection is lost, the rows unlock
        and may be claimed again elsewhere, and the claim token fences this claim's acks (a mark
        that never landed leaves rows no ack of ours matches). The failure is not retried here: it
        is recorded in the returned Pending, counted (failed_commits) and logged; the batch then
        learns what the claim holds and takes again what nobody took (queries.retake), so only
        a peer's claim in between makes a duplicate run, of the kind a crash allows. On a Galera node the COMMIT goes alone (commit_rides_along), so there the
        statements' replies are read here first. Closes `cur`: the COMMIT is the transaction's
        last word. Only in an idempotent Session.run body.

        A KILL QUERY can end a statement with an OK reply and fewer rows changed than meant, so
        no statement in the COMMIT's own query may be one that must never commit half done.
        verified, verify: the first `verified` statements go first, waited for, and
        verify(cur, their row counts) raises (driver.cut_short: the body runs again) unless each
        did its part; only then do the rest and the COMMIT go (a round trip more). check(row
        counts): read once every reply is, for what may commit half done but must then not be
        counted on (the claim's mark): False fails the Pending as a failed COMMIT would.
        rows: a list that receives each verified statement's rows (None: it returned none)
        before verify() runs, for a check that reads (the claim's running counts, after its mark).
        """
        if not self._session.attempt.idempotent or self._session.autocommit or not statements:
            raise AssertionError("send_commit is for idempotent transactions with statements")
        pending = Pending(what, commit=True, check=check)
        if verified:
            assert verify is not None
            counts = self.run_all(cur, statements[:verified], rows)
            verify(cur, counts)
            pending.rowcounts.extend(counts)
            statements = statements[verified:]
            if not statements:
                return self._commit_alone(cur, pending)
        *ahead, (query, count) = self.sized(cur, statements)
        ran = self._run_ahead(cur, ahead)  # only when the statements exceed one packet
        cur.close()  # now: closing it later would read the connection while the reply is due
        conn = self._session.conn
        pending.rowcounts.extend(ran)  # before the last query's: one per statement, in order
        conn.send_query(query.encode(conn.encoding))
        self.pending = pending
        if wait_replies or not self.commit_rides_along:
            try:
                conn.read_query_result()
                pending.rowcounts.append(conn.affected_rows())
                for _ in range(count - 1):
                    conn.next_result()
                    pending.rowcounts.append(conn.affected_rows())
                if not self.commit_rides_along:
                    conn.send_query(b"COMMIT")  # once the statements answered
            except BaseException:
                self.pending = None  # a statement failed: the server ran nothing after it
                raise
            pending.replied = count if self.commit_rides_along else 0
        self._session.attempt.committed = True
        return pending

    def _commit_alone(self, cur, pending: Pending) -> Pending:
        """send_commit's COMMIT when no statement is left to ride along with it."""
        cur.close()
        conn = self._session.conn
        conn.send_query(b"COMMIT")
        self.pending = pending
        self._session.attempt.committed = True
        return pending

    def run_all(self, cur, statements: list[tuple[str, dict[str, Any]]],
                rows: list[list[tuple] | None] | None = None) -> list[int]:
        """Statements of a transaction, no COMMIT, in as few queries as fit the server's
        max_allowed_packet, each waited for: each statement's row count (and, into `rows`,
        each one's rows: None for a statement that returns none)."""
        return self._run_ahead(cur, self.sized(cur, statements, commit=False), rows)

    def read_reply(self) -> None:
        """Read the reply of a statement sent ahead, if one is on the wire. Never raises: a
        COMMIT's failure is its Pending's (and counted); a statement sent later that failed
        is replaced by its fallback, or else ends the connection, as a lost one would."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        conn = self._session.current_conn
        outer, self._session.waiting = self._session.waiting, Waiting(time.monotonic(), 0.0, pending.what)
        try:
            if pending.replied:
                conn.next_result()  # the COMMIT's, after the statements' replies read already
            else:
                conn.read_query_result()
                pending.rowcounts.append(conn.affected_rows())
                if pending.on_row is not None:
                    result = conn.store_result()
                    rows = result.fetch_row() if result is not None else ()
                    pending.on_row(rows[0] if rows else None)
                else:
                    conn.discard_result()
            while conn.next_result() == 0:  # the rest of a multi-statement query
                pending.rowcounts.append(conn.affected_rows())
                conn.discard_result()
            if pending.check is not None and not pending.check(pending.rowcounts):
                self.fail_pending(cut_short(f"{pending.what}, replies {pending.rowcounts}"), pending)
        except MySQLdb.Error as e:
            self.fail_pending(e, pending)
            if pending.commit:
                self._session.rollback_after(e)  # lost: discard; else ROLLBACK, so the rows unlock now
            elif not self._run_fallback(e, pending):
                self._session.discard()
        finally:
            pending.settled = True
            self._session.waiting = outer

    def _run_fallback(self, exc: MySQLdb.Error, pending: Pending) -> bool:
        """A statement sent later failed on a connection that still answers: run its fallback
        there. False when the connection must end instead."""
        if pending.fallback is None or is_connection_lost(exc):
            return False
        log.debug("a statement sent ahead failed session=%s error=%s: running its fallback",
                  self._session.name, describe(exc))
        for _ in range(FALLBACK_TRIES):
            try:
                cur = self._session.current_conn.cursor()
                try:
                    cur.execute(pending.fallback)
                finally:
                    cur.close()
                return True
            except MySQLdb.Error as e:
                # A KILL QUERY (the instant wake's, aimed at this watcher) may land in the fallback
                # too: run it again, rather than end a connection that holds the liveness lock.
                if error_code(e) != QUERY_INTERRUPTED:
                    return False
        return False

    def fail_pending(self, exc: BaseException, pending: Pending | None = None) -> None:
        if pending is None:
            pending, self.pending = self.pending, None
        if pending is None or pending.settled:
            return
        pending.error, pending.settled = exc, True
        if pending.commit:
            self.failed_commits += 1
            log.warning("a COMMIT sent ahead failed what=%s session=%s error=%r: the transaction is "
                        "not ours to count on (a claim is checked, and taken again where nobody "
                        "took its jobs)", pending.what, self._session.name, describe(exc))

    def commit_with(self, cur, statements: list[tuple[str, dict[str, Any]]]) -> list[int]:
        """A transaction's last statements and its COMMIT, sent as one multi-statement query.

        One round trip instead of len(statements) + 1 (mysqlclient enables multi-statement
        queries by default; every value is bound by mogrify, as in execute). Returns each
        statement's rowcount. Only inside an idempotent Session.run body: a connection lost
        here leaves the COMMIT's outcome unknown, and the body must be safe to run again.
        """
        if not self._session.attempt.idempotent or self._session.autocommit:
            raise AssertionError("commit_with is for idempotent transactions only")
        *ahead, (query, _) = self.sized(cur, statements)
        rowcounts = self._run_ahead(cur, ahead)  # only when the statements exceed one packet
        cur.execute(query)
        rowcounts.append(cur.rowcount)
        while cur.nextset():
            rowcounts.append(cur.rowcount)
        if not self.commit_rides_along:
            cur.connection.commit()
        self._session.attempt.committed = True
        return rowcounts[:len(statements)]

    def sized(self, cur, statements: list[tuple[str, dict[str, Any]]], commit: bool = True) -> list[tuple[str, int]]:
        """The statements bound, and the COMMIT where it rides along, as multi-statement queries
        (query, statements in it) that each fit the server's max_allowed_packet: one, unless
        they are bigger together (a batch's kept results: 300 of 60 KB made an ack of 18 MB,
        which the server refused, 1153, as a lost connection, and the batch ran again). Then
        the first statements go in as many queries as they need, in order, and the last query
        holds at least the last statement and the COMMIT. A statement too big even alone gets
        a query of its own, for the server to refuse (a result too big is not kept, before:
        store/results.py). commit=False: without the COMMIT (run_all)."""
        commit = ["COMMIT"] if commit and self.commit_rides_along else []
        bound = [cur.mogrify(sql, params) for sql, params in statements]
        query = ";\n".join(bound + commit)
        budget = self._session.max_allowed_packet - PACKET_MARGIN_BYTES
        # A character is at most 4 bytes: the usual query is measured without encoding it.
        if self._session.max_allowed_packet <= 0 or 4 * len(query) <= budget:
            return [(query, len(bound))]
        encoding = cur.connection.encoding
        sizes = [len(text.encode(encoding)) + 2 for text in bound]  # and the ";\n" that joins it
        if sum(sizes) <= budget:
            return [(query, len(bound))]
        queries: list[tuple[str, int]] = []
        start, used = 0, 0
        for i, size in enumerate(sizes):
            if i > start and used + size > budget:
                queries.append((";\n".join(bound[start:i]), i - start))
                start, used = i, 0
            used += size
        queries.append((";\n".join(bound[start:] + commit), len(bound) - start))
        return queries

    @staticmethod
    def _run_ahead(cur, queries: list[tuple[str, int]], rows: list[list[tuple] | None] | None = None) -> list[int]:
        """The queries before a transaction's last (sized), each waited for: their rowcounts
        (and their rows into `rows`, if given). An error is the body's, as any statement's:
        the transaction is rolled back and rerun."""
        rowcounts: list[int] = []
        for query, _ in queries:
            cur.execute(query)
            while True:
                rowcounts.append(cur.rowcount)
                if rows is not None:
                    rows.append(list(cur.fetchall()) if cur.description is not None else None)
                if not cur.nextset():
                    break
        return rowcounts

    def commit_then_read(self, cur, read: str, *, result: Any = None) -> tuple | None:
        """COMMIT, and one read that must see the world after it (`read`, bound already), as one
        multi-statement query: one round trip, as a bare COMMIT. Returns the read's first row, or
        None if the read failed after the COMMIT succeeded (the read is advice: the transaction
        is done, and must not be run again for it). A lost connection during the COMMIT leaves
        its outcome unknown: Session.run treats it as it treats a lost COMMIT after the body (a
        rerun of an idempotent body; else its `committed` test, asked about `result`, the value
        the body returns after this call; else OutcomeUnknown)."""
        if self._session.autocommit:
            raise AssertionError("commit_then_read is for transactions")
        attempt = self._session.attempt
        attempt.committing, attempt.result = True, result
        attempt.commit_sent_at = time.monotonic()
        if self.commit_rides_along:
            cur.execute("COMMIT;\n" + read)  # the COMMIT's result: raises if the COMMIT failed
        else:
            cur.connection.commit()
        attempt.committing, attempt.committed = False, True
        try:
            if self.commit_rides_along:
                cur.nextset()
            else:
                cur.execute(read)
            row = cur.fetchone()
            while cur.nextset():
                pass
            return row
        except MySQLdb.Error:
            try:
                cur.close()
            except MySQLdb.Error:
                pass
            self._session.discard()  # out of step with the server, or gone: the next run reconnects
            return None
