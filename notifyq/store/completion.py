"""A job completed in the handler's own transaction: its writes and the completion commit
together or not at all (job.transaction(), job.complete_in(conn)).

The completion is statements at the end of that transaction: the completion itself
(complete_delete or complete_keep), fenced by the claim (its token, its attempt, the job still
claimed), and the attempt's record (complete_record, whose row is the proof the completion
landed), in one query; then the COMMIT, sent only once their replies said each did its part
(one row completed, one record written). A claim taken back meanwhile (the lease ran out, the
consumer was judged dead, a reaper moved in) matches no row: the transaction is rolled back and
ClaimLost raised, so a stale run's writes never land. So is one whose completion a KILL QUERY
cut short: the server answers such a statement with OK and no row changed, and reads a subquery
it cut short as NULL, both without an error, so no check made on the server (a guard statement
in the same query as the COMMIT) can tell that the COMMIT may go. Once the completion committed,
the worker does not ack the job.

The block's transaction must be the one that commits with the completion: a statement that
ends it early (COMMIT, ROLLBACK, START TRANSACTION, SET autocommit = 1, LOCK TABLES, DDL: each
an implicit COMMIT) would store its writes apart from the completion, and a kill then would
double them. A savepoint set as the block opens is gone after any of them; releasing it is the
completion query's first statement, so a block that lost its transaction fails loudly
(TransactionEnded) at the cost of one round trip as it opens. What the worker asks for the
handler while the block is open (cancel checks) reads in the block's transaction and commits
nothing; a lease extension goes through another session (consume/batch.py).

A COMMIT whose reply is lost (KILL, a server restart) has an unknown outcome. The completion's
record says which: on a new connection, once the old one is gone for sure (ended and waited
for, or the server restarted since), its row is there if and only if the transaction committed,
the handler's writes with it. So transaction() returns only when the writes are stored, and
raises when they are not (the job then fails and is retried) or when nobody can say.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import MySQLdb

from notifyq import errors
from notifyq.jobs import Job, run_of
from notifyq.store import queries
from notifyq.store import results as kept
from notifyq.store import workflows
from notifyq.store.db import Session, shut_down, socket_of
from notifyq.store.driver import Ids, cut_short, describe, error_code, is_connection_lost
from notifyq.store.pipeline import Waiting
from notifyq.store.sql import QUERIES as Q

log = logging.getLogger("notifyq.consumer")


class CallerCall:
    """complete_in's statements on the caller's connection, read by the consumer's stall watch as
    it reads a Session's call (consume/stall.py): the call waiting now, and on which connection."""

    def __init__(self) -> None:
        self.waiting: Waiting | None = None
        self.connection_id: int | None = None
        self.node = ""  # its server's identity is not known: the look's server is taken for it
        self.socket: tuple[int, int] | None = None  # its socket (db.socket_of), while it is watched

    def cut_socket(self) -> bool:
        """The reply is not coming: the caller's connection is ended on this side too (the server's
        close never reaches a client behind a black-holed path), so complete_in raises at once
        instead of waiting out the driver's read timeout (none, by default: for good)."""
        return shut_down(self.socket)


class Completion:
    """What a claimed job needs to complete itself: the worker's work session (idle while the
    handler runs, on the handler's own thread) and the claim."""

    def __init__(self, session: Session, token: int, keep: bool, keep_results: bool = False, owner: str = ""):
        self.session, self.token, self.keep, self.keep_results = session, token, keep, keep_results
        self.owner = owner or None  # the consumer id the claim was made under (the record's consumer)
        self._open = False  # a transaction() is open on the session (one at a time)
        self._block: Any = None  # its connection, while it is open
        # The handler's call ran past timeout_s (consume/batch.py): its job failed, its
        # connection was ended, and what it asks of its completion from now on is refused.
        self.revoked = False
        # job id -> the server id of the connection complete_in wrote its completion on, and
        # when it answered (monotonic): the caller's transaction holds the job's row until it
        # ends (consume/batch.py ends it when the call timed out and the completion did not
        # land, unless the server restarted since it answered: its id may be another's then).
        self.caller_conns: dict[int, tuple[int, float]] = {}
        self.caller = CallerCall()  # complete_in's statements, while they wait for the server
        # The worker's, run before the handler's first statement through this completion: the
        # claim's COMMIT is read, and the claim taken again if it failed (consume/batch.py), so a
        # claim whose COMMIT is in doubt is not taken for lost (a cancel check saying so, a
        # completion fenced out) while it may hold the job.
        self.settle_claim: Callable[[], None] | None = None
        self._steps: dict[int, Any] = {}  # job id -> its Steps (store/steps.py), once it took one
        # The worker's: called with the queues of the workflow children a committed block
        # released (wakeup/queue_wakes.py wakes their idle consumers)
        self.released: Callable[[list[str]], None] | None = None
        self.block_serial = 0  # counts the blocks opened: a step written in one is pending until it commits

    @property
    def in_block(self) -> bool:
        """A job.transaction() block is open on the work session: nothing may commit on it."""
        return self._open

    @property
    def block(self) -> Any:
        """The open block's connection (None: no block open)."""
        return self._block

    def open_block(self, conn: Any) -> None:
        """A step's own transaction (store/steps.py) opens on the work session (conn), or ends (None):
        while it is open, it is the block cancel checks and steps write in."""
        self._open, self._block = conn is not None, conn
        if conn is not None:
            self.block_serial += 1

    def step(self, job: Job, name: Any, transaction: bool = False) -> Any:
        """job.step(name): a Step of this job (store/steps.py)."""
        return self.steps_of(job).step(name, transaction)

    def steps_of(self, job: Job) -> Any:
        from notifyq.store import steps  # here: a handler without steps never loads it

        found = self._steps.get(job.id)
        if found is None:
            found = self._steps[job.id] = steps.Steps(self, job)
        return found

    def refuse_revoked(self, job: Job) -> None:
        """Past timeout_s the job failed already: what its handler asks from now on is refused."""
        _not_revoked(self, job)

    def read(self, body: Any) -> Any:
        return self._read(body)

    def settle(self) -> None:
        """Before the handler's first statement through this claim: its COMMIT read (settle_claim)."""
        self._settle_claim()

    def _result(self, job: Job, value: Any) -> str | None:
        return kept.result_text(value, job.id, self.session.max_allowed_packet) if self.keep_results else None

    @contextlib.contextmanager
    def transaction(self, job: Job, result: Any = None) -> Iterator[Any]:
        """The handler's block, then the completion and its record as one query, and the COMMIT
        once their replies said both landed: one round trip more than the COMMIT alone."""
        _not_completed(job)
        _not_revoked(self, job)
        if self._open:  # coroutines of one worker (concurrency > 1) share its session
            raise RuntimeError("one job.transaction() at a time per worker: another job's is open "
                               "(with concurrency > 1, do not await inside the block)")
        self._settle_claim()
        session = self.session
        conn = session.conn  # reads a reply still on the wire (the claim's COMMIT) first
        cur = conn.cursor()
        self.open_block(conn)
        lost: BaseException | None = None
        released_to: list[str] = []  # the queues of the children the block released
        try:
            # Watched as every statement of notifyq's on the block's connection (consume/stall.py):
            # a reply lost on its way would hold the worker for its read timeout, unsaid
            session.waiting = Waiting(time.monotonic(), 0.0, "open a job's transaction")
            try:
                cur.execute(Q["block_savepoint"])
            except MySQLdb.Error as e:
                if not is_connection_lost(e):
                    raise
                session.discard()
                raise errors.TransientDBError(f"job {job.id}: connection lost as its transaction opened "
                                              f"({describe(e)}): nothing was stored, the job runs again") from e
            session.waiting = None
            yield cur
            # Past timeout_s the block's connection is ended (consume/batch.py): nothing to commit
            _not_revoked(self, job)
            params = completion_params(job, self.token, self.owner, self._result(job, result))
            # A counting claim's job: its key's counter first, under the completion's fence
            # (flow_count_release; its row count is left out of the checks below)
            release = queries.counted_token(self.token)
            params["ids"] = Ids([job.id])
            statements = [Q["block_still_open"]] + [Q["flow_count_release"]] * release + [
                Q["complete_keep" if self.keep else "complete_delete"], Q["complete_record"]]
            # One mogrify for the three (each param rendered once); the COMMIT goes alone, once
            # their replies said each did its part (COMPLETION_COUNTS)
            query = cur.mogrify(";\n".join(statements), params)
            # The first step of the release of its children (workflows), last, in the same
            # transaction: fenced by its record; the rest runs below when it marked any edge
            query += "".join(";\n" + cur.mogrify(sql, p)
                             for sql, p in workflows.release_statements([job.id], self.token))
            counts: list[int] = []
            # Watched as any call of the session (consume/stall.py): a KILL QUERY landing between
            # two of the query's statements makes the server drop the rest unanswered, and the
            # read would wait out its read timeout holding the job's row lock (the reaper's
            # reclaim then fails with 1205); the stall watch ends the connection instead
            session.waiting = Waiting(time.monotonic(), 0.0, "complete a job in its transaction")
            try:
                cur.execute(query)
                counts.append(cur.rowcount)
                while cur.nextset():
                    counts.append(cur.rowcount)
            except MySQLdb.Error as e:
                if release and len(counts) > 1:
                    del counts[1]
                if counts == COMPLETION_COUNTS[:1] + [0]:
                    # The completion changed no row, and its record failed (a reaper that took
                    # the claim back wrote this claim's record already: 1062)
                    raise errors.ClaimLost(f"job {job.id}: its claim was taken back before it completed; "
                                           "the transaction was rolled back") from None
                if error_code(e) == NO_SUCH_SAVEPOINT:
                    # Its statements since may run in autocommit, or hold LOCK TABLES: the
                    # connection goes (the server rolls back what is open and drops the locks).
                    session.discard()
                    ended = errors.TransactionEnded(
                        f"job {job.id}: its transaction was ended inside the job.transaction() block (by a "
                        "COMMIT, ROLLBACK, START TRANSACTION, SET autocommit, LOCK TABLES or DDL), so its "
                        "writes could not commit with the job's completion (some may be stored apart from "
                        "it); the connection was dropped, the job fails and is not run again")
                    job.fail(str(ended), retry=False)  # (a per-batch handler's other jobs are retried)
                    raise ended from None
                if is_connection_lost(e):  # no COMMIT was sent: nothing of the block is stored
                    session.discard()
                    _not_revoked(self, job)  # the timeout ended its connection: no server fault
                    raise errors.TransientDBError(
                        f"job {job.id}: connection lost before the COMMIT of its transaction ({describe(e)}): "
                        "nothing was stored, the job runs again") from None
                raise  # (a KILL QUERY's 1317 among them: rolled back below)
            if release and len(counts) > 1:
                del counts[1]
            marked = counts[len(COMPLETION_COUNTS)] if len(counts) > len(COMPLETION_COUNTS) else 0
            if counts[:len(COMPLETION_COUNTS)] == COMPLETION_COUNTS and marked:
                # before the COMMIT, in the block's transaction
                released_to = workflows.release_rest(cur, [job.id], marked)
            if counts[:len(COMPLETION_COUNTS)] != COMPLETION_COUNTS:
                # The completion changed no row: the claim was taken back, or a KILL QUERY cut
                # the statement short (the server then replies OK, 0 rows, and no error).
                raise errors.ClaimLost(f"job {job.id}: its completion did not land (the claim was taken back, "
                                       f"or the statement was interrupted; replies {counts}); "
                                       "the transaction was rolled back") from None
            # (it answered just now: open then, on the server run it was connected to)
            conn_id, sent_at, run = session.connection_id, time.monotonic(), session.server_run
            try:
                cur.execute(Q["block_commit"])
            except MySQLdb.Error as e:
                # Any error, a KILL QUERY's 1317 as much as a lost connection: whether the COMMIT
                # landed is unknown (and the transaction may still be open on this connection)
                lost = e
        except BaseException as e:
            session.waiting = None
            session.rollback_after(e)
            if self.revoked and isinstance(e, MySQLdb.Error):
                # Past timeout_s its connection was ended: whichever statement found that out (the
                # handler's own too), the block raises what the docs say, not the driver's 2013
                raise _revoked(job) from e
            raise
        finally:
            session.waiting = None
            _close(cur)
            self._open, self._block = False, None
        if lost is not None:
            session.discard()
            if not self._landed_after_loss(job, conn_id, sent_at, run, lost):
                _not_revoked(self, job)  # the timeout ended its connection: no server fault
                raise errors.TransientDBError(
                    f"job {job.id}: the COMMIT of its transaction failed ({describe(lost)}) and did not "
                    "land: nothing was stored, the job runs again") from None
        run_of(job).committed()
        if released_to and self.released is not None:
            self.released(released_to)

    def _landed_after_loss(self, job: Job, conn_id: int | None, sent_at: float, run: float,
                           lost: BaseException) -> bool:
        """Did the transaction whose COMMIT lost its reply commit? Asked on a new connection, once
        the old one can no longer commit: ended and waited for, unless the server restarted
        since the COMMIT was sent (then recovery has settled it)."""
        session = self.session

        def ask(cur) -> bool | None:
            if conn_id is not None:
                if not queries.end_connection(cur, conn_id, session, sent_at, run):
                    return None  # it outlived its KILL: it may commit yet, so no read tells
            if session.galera:  # this node first applies every write set the cluster committed
                cur.execute(Q["wsrep_sync_wait"], {"level": 1})
            try:
                return bool(landed(cur, [job.id], self.token))
            finally:
                if session.galera:
                    cur.execute(Q["wsrep_sync_wait"], {"level": 0})

        try:
            stored = session.run(ask, what="check a completion's COMMIT")
        except errors.NotifyqError as e:
            raise errors.OutcomeUnknown(f"job {job.id}: connection lost during the COMMIT of its "
                                        f"transaction ({describe(lost)}), and the server could not be asked "
                                        f"whether it landed ({e})") from None
        if stored is None:
            raise errors.OutcomeUnknown(f"job {job.id}: connection lost during the COMMIT of its transaction "
                                        f"({describe(lost)}), and the old connection outlived its KILL: "
                                        "whether it landed cannot be told yet")
        if not self.revoked:  # (else the timeout ended it, and said so)
            log.warning("connection lost during a job's COMMIT; it %s job=%d", "landed" if stored else "did not land",
                        job.id)
        return stored

    def complete_in(self, job: Job, conn: Any, result: Any = None, rollback: bool = True) -> None:
        """conn: the DB-API connection the caller's transaction lives on (consume/effects.py
        unwraps a framework's). rollback: roll it back on ClaimLost (a framework's transaction
        rolls back itself, as the exception leaves its block)."""
        from notifyq.store import inserts  # here: a consumer's start need not load it

        _not_completed(job)
        if self.revoked:
            if rollback:
                conn.rollback()
            _not_revoked(self, job)
        self._settle_claim()
        cur, conn_id = conn.cursor(), None
        try:
            thread_id = getattr(conn, "thread_id", None)  # MySQLdb's and PyMySQL's
            conn_id = int(thread_id()) if callable(thread_id) else None
            if conn_id is not None:  # (watched only on a connection the server can be asked about)
                self.caller.connection_id, self.caller.socket = conn_id, socket_of(conn)
                self.caller.waiting = Waiting(time.monotonic(), 0.0, "complete a job on the caller's connection")
            if inserts.outside_transaction(conn, cur):
                raise errors.InputError(
                    f"job {job.id}: complete_in(conn): the connection is in autocommit mode with no "
                    "transaction open, so the completion would commit apart from your writes: open "
                    "the transaction first (BEGIN, or autocommit off)")
            released = complete(cur, job, self.token, self.keep, self.owner, self._result(job, result))
        except errors.NotifyqError:
            raise
        except Exception as e:  # noqa: BLE001 - any driver's error: told apart by its code
            if conn_id is not None and is_connection_lost(e):  # (the stall watch ends one whose reply is lost)
                raise errors.TransientDBError(
                    f"job {job.id}: the caller's connection was lost during its completion ({describe(e)}): "
                    "its transaction is gone and nothing of it is stored; the job runs again") from e
            raise inserts.caller_error(e) from e
        finally:
            self.caller.waiting, self.caller.socket = None, None
            _close(cur)
        if released is None:
            if rollback:
                conn.rollback()
            raise errors.ClaimLost(f"job {job.id}: its claim was taken back before it completed; "
                                   "the caller's transaction must roll back")
        if conn_id is not None:  # with when it was last known open: it answered just now
            self.caller_conns[job.id] = (conn_id, time.monotonic())
        run_of(job).completed_pending(released)

    def cancel_requested(self, job_id: int) -> bool:
        """Job.cancel_requested(): asked only when a handler asks (a statement on the work
        session). True too when the claim is no longer ours."""
        if self.revoked:
            return True

        def body(cur) -> bool:
            cur.execute(Q["job_cancel_check"], {"id": job_id, "token": self.token})
            row = cur.fetchone()
            return row is None or bool(row[0])

        return self._read(body)

    def cancelled(self, job_ids: list[int]) -> set[int]:
        """Of these jobs of the claim, those whose cancel was requested, or that are no longer
        ours: one statement for a batch (notifyq.cancelled(jobs))."""
        if not job_ids or self.revoked:
            return set(job_ids)

        def body(cur) -> set[int]:
            cur.execute(Q["jobs_cancel_check"], {"ids": Ids(job_ids), "token": self.token})
            still = {int(job_id): bool(flag) for job_id, flag in cur.fetchall()}
            return {i for i in job_ids if still.get(i, True)}

        return self._read(body)

    def _read(self, body: Any) -> Any:
        """A read the handler asks for: inside an open block, in the block's transaction (a
        plain read under READ COMMITTED: it sees the latest commits, takes no lock and commits
        nothing); else a transaction of its own on the work session."""
        if not self._open:
            self._settle_claim()
            return self.session.run(body, what="cancel check")
        cur = self._block.cursor()
        self.session.waiting = Waiting(time.monotonic(), 0.0, "cancel check in a job's transaction")
        try:
            return body(cur)
        finally:
            self.session.waiting = None
            _close(cur)

    def _settle_claim(self) -> None:
        if self.settle_claim is not None:
            self.settle_claim()

    def completions_landed(self, jobs: list[Job]) -> set[int]:
        """Of the jobs completed on a caller's connection (complete_in), those whose completion
        committed; the caller's COMMIT is over (the handler returned)."""
        if not jobs:
            return set()
        return self.session.run(lambda cur: landed(cur, [j.id for j in jobs], self.token),
                                what="check completions")


# What the completion's statements reply when each did its part: the savepoint released (0
# rows), the job's row completed (1: the claim held; 0 also when a KILL QUERY cut the statement
# short, which the server answers with OK and no error), its record written (1). Nothing else
# lets the COMMIT go: no guard evaluated on the server can stand in, as a KILL QUERY makes a
# subquery read NULL, again without an error.
COMPLETION_COUNTS = [0, 1, 1]
NO_SUCH_SAVEPOINT = 1305  # block_still_open: the block's transaction ended inside it


def completion_params(job: Job, token: int, owner: str | None, result: str | None) -> dict[str, Any]:
    run = run_of(job)
    started = run.started if run.started is not None else time.monotonic()
    return {"id": job.id, "token": token, "attempt": job.attempts, "queue": job.queue, "owner": owner,
            "host": queries.HOST, "started_at": queries.server_time(run.clock, run.started),
            "started_age_us": queries.microseconds(time.monotonic() - started), "result": result}


def complete(cur, job: Job, token: int, keep: bool, owner: str | None,
             result: str | None = None) -> list[str] | None:
    """The completion and its record on a caller's cursor, in its transaction (one statement at
    a time: its connection may not take multi-statement queries). The queues of the workflow
    children it released (to wake once the caller's COMMIT landed) when the claim still held
    the job; None when it did not (the record is written only when it did)."""
    params = completion_params(job, token, owner, result)
    released = 0
    if queries.counted_token(token):
        # A counting claim's job: its key's counter first, under the completion's fence
        cur.execute(Q["flow_count_release"], {"ids": Ids([job.id]), "token": token})
        released = cur.rowcount
    cur.execute(Q["complete_keep" if keep else "complete_delete"], params)
    if cur.rowcount != 1:
        if released:  # held under the release's lock: a KILL QUERY's OK reply to the completion
            raise cut_short(f"job {job.id}: its completion was cut short after its key's release")
        return None
    cur.execute(Q["complete_record"], params)
    if cur.rowcount != 1:  # a KILL QUERY's OK reply to a statement it cut short
        raise cut_short(f"job {job.id}: its completion's record was not written")
    return workflows.release_after_completion(cur, job.id, token)  # its children, in the same transaction


def landed(cur, ids: list[int], token: int) -> set[int]:
    return queries.completions_landed(cur, ids, token)


def _not_completed(job: Job) -> None:
    if run_of(job).completed is not None:
        raise RuntimeError(f"job {job.id} is completed already")


def _not_revoked(completion: Completion, job: Job) -> None:
    if completion.revoked:
        raise _revoked(job)


def _revoked(job: Job) -> errors.ClaimLost:
    return errors.ClaimLost(f"job {job.id}: its handler ran past timeout_s and the job failed; "
                            "this late call is refused and nothing of it is stored")


def _close(cur) -> None:
    try:
        cur.close()
    except Exception:  # noqa: BLE001 - a lost connection's cursor: nothing to close
        pass
