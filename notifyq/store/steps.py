"""Durable steps: job.step(name) keeps a step's result once it has committed, so a later run of
the job (a retry, a run after its claim was taken back) skips the steps that finished.

Where a step's record commits says what it guarantees:
- a plain step (outside any block): its body runs, then its record is stored in a transaction of
  its own, fenced by the claim. A crash between the two runs the body again: at least once.
- a step inside job.transaction(): its record is written in the block's transaction and commits
  with the block's writes and the job's completion, or not at all.
- a step with transaction=True: its body writes through the step's cursor, and those writes commit
  with its record, fenced by the claim, without completing the job: exactly once per step.

The fence is a locking read of the job's row (still claimed by this claim) in the transaction
that stores the record: a take-back of the claim waits for that transaction to end, so the run
that takes the job over reads each step as it is (stored or not), never one committed after it
looked. A stale run whose claim was taken back stores nothing and raises ClaimLost.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import MySQLdb

from notifyq import errors
from notifyq.jobs import Job, run_of
from notifyq.store.driver import describe, error_code, is_connection_lost
from notifyq.store.pipeline import Waiting
from notifyq.store.results import RESULT_MAX_BYTES
from notifyq.store.sql import QUERIES as Q

NAME_MAX_CHARS = 191  # nq_step.name, VARCHAR(191)
NO_SUCH_SAVEPOINT = 1305  # block_still_open: the step's transaction ended inside it


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= NAME_MAX_CHARS:
        raise errors.InputError(f"job.step(name): a name is a string of 1 to {NAME_MAX_CHARS} characters, "
                                f"got {name!r:.80}")
    if "\x00" in name:
        # NUL cuts a name short in C strings (a log line, a client) though the server keeps it
        raise errors.InputError(f"job.step(name): a name must not contain NUL, got {name!r:.80}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 for the server to store
        raise errors.InputError(f"job.step(name): a name must be valid Unicode (no lone surrogate), "
                                f"got {name!r:.80}") from None
    if name.endswith(" "):
        # The server compares names with trailing spaces ignored: "x" and "x " would be one row
        # of nq_step (a duplicate key on every run of a job that used both)
        raise errors.InputError(f"job.step(name): a name must not end with a space, got {name!r:.80}")
    return name


def encode(job: Job, name: str, value: Any) -> str:
    """A step's result as stored: strict JSON (no NaN, Infinity nor lone surrogate, as a kept
    result: store/results.py), at most RESULT_MAX_BYTES in UTF-8. Anything else is refused
    before anything is written: the step is not stored and its run fails."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        size = len(text.encode("utf-8"))
    except Exception as e:  # noqa: BLE001 - whatever the value's encoding raises is the value's fault
        raise errors.InputError(f"job {job.id}: step {name!r}: its result is not JSON "
                                f"({type(e).__name__}: {e}); nothing of the step was stored") from None
    if size > RESULT_MAX_BYTES:
        raise errors.InputError(f"job {job.id}: step {name!r}: its result is {size} bytes of JSON, over "
                                f"{RESULT_MAX_BYTES}; nothing of the step was stored")
    return text


class Step:
    """One step of a job's run (job.step(name)): a context manager and a decorator.

        with job.step("fetch") as step:
            if not step.done:              # finished in an earlier run: its result is kept
                step.result = fetch(job.payload["url"])
        page = step.result

        @job.step("fetch")
        def fetch_page():
            return fetch(job.payload["url"])
        page = fetch_page()                # the stored result, or the body's (then stored)
    """

    def __init__(self, steps: Steps, name: str, transaction: bool):
        self._steps, self.name, self._transaction = steps, name, transaction
        self.done = False  # finished in an earlier run (or earlier in this one): the body is skipped
        self.result: Any = None
        self.cursor: Any = None  # transaction=True: a cursor in the step's own transaction
        self._context: Any = None

    def __enter__(self) -> Step:
        self.done, self.result = self._steps.lookup(self.name)
        if not self.done and self._transaction:
            self._context = self._steps.transaction(self)
            self.cursor = self._context.__enter__()
        return self

    def __exit__(self, kind, value, tb) -> bool:
        if self._context is not None:
            context, self._context, self.cursor = self._context, None, None
            return bool(context.__exit__(kind, value, tb))
        if kind is None and not self.done:
            self._steps.store(self.name, self.result)
            self.done = True
        return False

    def __call__(self, body: Callable[..., Any]) -> Callable[..., Any]:
        """@job.step(name): the function returns the step's stored result, or runs and stores it.
        With transaction=True it gets the step's cursor as its first argument."""
        @functools.wraps(body)
        def run(*args: Any, **kwargs: Any) -> Any:
            with self as step:
                if not step.done:
                    step.result = body(step.cursor, *args, **kwargs) if self._transaction else body(*args, **kwargs)
            return step.result

        return run


class Steps:
    """A job's steps in one run: those it finished (read once, at its first step) and how a new
    one is stored. Held by the claim's Completion, one per job."""

    def __init__(self, completion: Any, job: Job):
        self.completion, self.job = completion, job
        # name -> (result, the serial of the block it is pending in, or None: committed)
        self._known: dict[str, tuple[Any, int | None]] | None = None

    def step(self, name: Any, transaction: bool = False) -> Step:
        return Step(self, check_name(name), transaction)

    def finished(self) -> dict[str, Any]:
        """{name: result} of the job's steps that committed (also this run's)."""
        self._load()
        return {name: result for name, (result, block) in self._known.items() if self._valid(block)}

    def lookup(self, name: str) -> tuple[bool, Any]:
        self._load()
        entry = self._known.get(name)
        if entry is None or not self._valid(entry[1]):
            return False, None
        return True, entry[0]

    def _valid(self, block: int | None) -> bool:
        # A step written in a block is done once that block committed (a step transaction's: its
        # entries are settled then; job.transaction()'s: the job is completed), or while it is
        # still open: a block that rolled back took it along.
        completion = self.completion
        return (block is None or (completion.in_block and block == completion.block_serial)
                or run_of(self.job).completed is not None)

    def _load(self) -> None:
        if self._known is not None:
            return

        def body(cur) -> dict[str, tuple[Any, int | None]]:
            cur.execute(Q["steps_of_job"], {"id": self.job.id})
            return {name: (json.loads(text), None) for name, text in cur.fetchall()}

        self._known = self.completion.read(body)

    def _params(self, name: str, text: str) -> dict[str, Any]:
        return {"id": self.job.id, "token": self.completion.token, "name": name, "result": text,
                "attempt": self.job.attempts}

    def store(self, name: str, value: Any) -> None:
        text = encode(self.job, name, value)
        completion, params = self.completion, self._params(name, text)
        completion.refuse_revoked(self.job)
        if completion.in_block:  # its record commits with the block (whose completion is fenced)
            cur = completion.block.cursor()
            try:
                cur.execute(Q["step_insert"], params)
            finally:
                cur.close()
            self._known[name] = (json.loads(text), completion.block_serial)
            return

        def body(cur) -> bool:
            if not _fence(cur, params):
                return False
            cur.execute(Q["step_insert"], params)
            return True

        def committed(cur, _held: bool, _written_by: float) -> bool:
            # a step's row is named by its job and name, no AUTO_INCREMENT id: its age tells nothing more
            cur.execute(Q["step_stored"], params)
            return cur.fetchone() is not None

        completion.settle()
        held = completion.session.run(body, what="store a job's step", idempotent=False, committed=committed)
        if not held:
            raise _lost(self.job, name)
        self._known[name] = (json.loads(text), None)

    @contextlib.contextmanager
    def transaction(self, step: Step) -> Iterator[Any]:
        """transaction=True: the step's body writes through the cursor yielded, and those writes
        commit with the step's record, fenced by the claim, or not at all. The job is not completed."""
        completion, job, name = self.completion, self.job, step.name
        completion.refuse_revoked(job)
        if completion.in_block:
            raise RuntimeError(f"job {job.id}: step {name!r}: transaction=True inside an open job.transaction() "
                               "or step transaction: a step there commits with that block already")
        completion.settle()
        session = completion.session
        conn = session.conn
        cur = conn.cursor()
        completion.open_block(conn)  # cancel checks read in it; no other block opens meanwhile
        serial = completion.block_serial
        text = ""
        try:
            session.waiting = Waiting(time.monotonic(), 0.0, "open a step's transaction")
            try:
                cur.execute(Q["block_savepoint"])
            except MySQLdb.Error as e:
                if not is_connection_lost(e):
                    raise
                raise errors.TransientDBError(f"job {job.id}: step {name!r}: connection lost as its transaction "
                                              f"opened ({describe(e)}): nothing was stored") from e
            session.waiting = None
            yield cur
            completion.refuse_revoked(job)
            text = encode(job, name, step.result)
            params = self._params(name, text)
            session.waiting = Waiting(time.monotonic(), 0.0, "store a step in its transaction")
            try:
                cur.execute(Q["block_still_open"])
            except MySQLdb.Error as e:
                if error_code(e) != NO_SUCH_SAVEPOINT:
                    raise
                session.discard()  # autocommit or LOCK TABLES may be on: the connection goes
                raise errors.TransactionEnded(
                    f"job {job.id}: step {name!r}: its transaction was ended inside the step's block (COMMIT, "
                    "ROLLBACK, START TRANSACTION, SET autocommit, LOCK TABLES or DDL): its writes could not "
                    "commit with its record; the connection was dropped") from None
            if not _fence(cur, params):
                raise _lost(job, name)
            cur.execute(Q["step_insert"], params)
            try:
                conn.commit()
            except MySQLdb.Error as e:
                # Its outcome is unknown here; the next run reads it: the fence's lock keeps a
                # take-back (and this job's failure) waiting until the transaction has ended.
                session.discard()
                raise errors.TransientDBError(
                    f"job {job.id}: step {name!r}: its COMMIT failed ({describe(e)}); whether it landed is "
                    "read by the job's next run, which skips the step if it did") from None
        except BaseException as e:
            session.rollback_after(e)
            raise
        finally:
            session.waiting = None
            try:
                cur.close()
            except Exception:  # noqa: BLE001 - a lost connection's cursor
                pass
            completion.open_block(None)
        # Committed: this step, and the steps taken inside it with it
        for other, (result, block) in list(self._known.items()):
            if block == serial:
                self._known[other] = (result, None)
        self._known[name] = (json.loads(text), None)
        step.done = True


def _fence(cur, params: dict[str, Any]) -> bool:
    cur.execute(Q["step_claim_held"], params)
    return cur.fetchone() is not None


def _lost(job: Job, name: str) -> errors.ClaimLost:
    return errors.ClaimLost(f"job {job.id}: step {name!r}: its claim was taken back before the step was stored; "
                            "nothing of it is stored, and the job is someone else's")
