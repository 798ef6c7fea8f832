"""Producer: put jobs on one queue, alone or inside the caller's own transaction."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from notifyq import errors, values
from notifyq.config import Config, validate_queue_name
from notifyq.jobs import Status
from notifyq.produce.lines import ReadError
from notifyq.store import inserts, queries
from notifyq.store.db import DriverError, Session
from notifyq.store.locks import QueueLocks
from notifyq.wakeup import Bell, instant_wake

log = logging.getLogger("notifyq.producer")


class Producer:
    """Enqueue jobs on `queue`.

    `ring=True` is for long-lived producers (`notifyq produce`, a web app's producer kept open):
    the producer then holds one of the queue's bells, its COMMIT looks whether a consumer is
    watching, and only then it rings, which wakes that idle consumer within a millisecond or
    two. Under load (no consumer idle) a put costs what a plain one does. One-shot producers leave it off: the watcher's
    backoff poll of the signal row finds their jobs (or `wakeup.instant_wake` interrupts it).
    """

    def __init__(self, queue: str, config: Config, *, ring: bool = False):
        if not isinstance(config, Config):
            raise errors.InputError(f"config: expected notifyq.config.load()'s Config, got {values.shown(config)}")
        self.queue = validate_queue_name(queue)
        self.config = config
        self.queue_config = config.queue(queue)
        self.locks = QueueLocks(config.dsn.database, queue)
        self._session: Session | None = None
        self._lock_session: Session | None = None
        self._bell: Bell | None = None
        self._ring = ring
        self._queue_known = False
        self._caller_packets: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    # -------------------------------------------------------- the API

    def put(self, payload: Any, *, priority: int = 0, delay: float = 0, run_at: dt.datetime | None = None,
            max_attempts: int | None = None, dedup_key: str | None = None, conn: Any = None) -> int:
        """Enqueue one job and return its id; with `conn` it commits with the caller's transaction.

        With `dedup_key`, a pending job (ready, scheduled or claimed) holding the same key on this
        queue makes this a no-op that returns that job's id.
        """
        row = self._row(payload, priority, delay, run_at, max_attempts, dedup_key)
        return self._write([row], conn, unique=dedup_key is not None)[0]

    def put_many(self, payloads: Iterable[Any], *, priority: int = 0, delay: float = 0,
                 run_at: dt.datetime | None = None, max_attempts: int | None = None,
                 conn: Any = None) -> list[int]:
        """Enqueue many jobs atomically, in multi-row INSERTs of up to `producer.chunk_size` rows
        that each fit the server's max_allowed_packet."""
        if isinstance(payloads, (str, bytes, dict)) or not hasattr(payloads, "__iter__"):
            raise errors.InputError(f"payloads: expected a list of payloads, got {values.shown(payloads)}")
        rows = [self._row(p, priority, delay, run_at, max_attempts, None) for p in payloads]
        return self._write(rows, conn) if rows else []

    def close(self) -> None:
        if self._bell is not None:
            self._bell.disarm()
        for session in (self._session, self._lock_session):
            if session is not None:
                session.close()
        self._session = self._lock_session = self._bell = None

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------- internals

    def _row(self, payload: Any, priority: int, delay: float, run_at: dt.datetime | None,
             max_attempts: int | None, dedup_key: str | None) -> tuple:
        """Every argument checked before anything is written: one InputError line each."""
        try:
            text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            size = len(text.encode())
        except (TypeError, ValueError) as e:  # also UnicodeEncodeError: a lone surrogate
            raise errors.InputError(f"payload is not JSON-serialisable: {values.shown(str(e))}") from None
        except RecursionError:
            raise errors.InputError("payload is not JSON-serialisable: nested too deeply") from None
        limit = self.config.producer.max_payload_bytes
        if size > limit:
            raise errors.InputError(f"payload is {size} bytes, over the {limit}-byte limit")
        priority = values.number("priority", priority, lo=-32768, hi=32767, integer=True)
        if run_at is not None:
            if not isinstance(run_at, dt.datetime):
                raise errors.InputError(f"run_at: expected a datetime, got {values.shown(run_at)}")
            if run_at.tzinfo is None:
                raise errors.InputError("run_at must be timezone-aware (it is stored in UTC)")
            delay = (run_at - dt.datetime.now(dt.timezone.utc)).total_seconds()
            if delay > values.MAX_SECONDS:
                raise errors.InputError(f"run_at: at most {values.MAX_SECONDS / 86400 / 365:g} years ahead")
            delay = max(delay, 0.0)  # a time in the past means: now
        delay = values.seconds("delay", delay, positive=False)
        attempts = max_attempts if max_attempts is not None else self.queue_config.max_attempts
        attempts = values.number("max_attempts", attempts, lo=1, hi=65535, integer=True)
        if dedup_key is not None:
            if not isinstance(dedup_key, str):
                raise errors.InputError(f"dedup_key: expected a string, got {values.shown(dedup_key)}")
            if not 0 < len(dedup_key) <= 191:
                raise errors.InputError("dedup_key must be 1 to 191 characters")
            try:
                dedup_key.encode()
            except UnicodeEncodeError:
                raise errors.InputError("dedup_key is not valid UTF-8") from None
        status = Status.SCHEDULED if delay > 0 else Status.READY
        return (self.queue, int(status), priority, int(delay * 1e6), attempts, text, dedup_key)

    def _insert_unique(self, cur, row: tuple) -> int:
        keys = ("queue", "status", "priority", "delay_us", "max_attempts", "payload", "dedup_key")
        job_id, created = inserts.insert_unique_job(cur, dict(zip(keys, row)))
        if created:
            queries.bump_signal(cur, self.queue, 1)
        return job_id

    def _write(self, rows: list[tuple], conn: Any, unique: bool = False) -> list[int]:
        """Rows too big for the server's max_allowed_packet raise InputError before any INSERT
        is sent (inserts.insert_jobs plans every chunk first)."""
        def body(cur, max_packet: int) -> list[int]:
            if unique:
                inserts.check_fits(rows, max_packet, getattr(cur, "connection", None))
                return [self._insert_unique(cur, rows[0])]
            return inserts.insert_jobs(cur, rows, max_rows=self.config.producer.chunk_size,
                                       max_packet=max_packet, signal=(self.queue, len(rows)))

        if conn is not None:  # the caller's transaction: no commit, no bell, no retry here
            if not callable(getattr(conn, "cursor", None)):
                raise errors.InputError(f"conn: expected a database connection, got {values.shown(conn)}")
            try:
                cur = conn.cursor()
                try:
                    return body(cur, self._caller_max_packet(conn, cur))
                finally:
                    cur.close()
            except DriverError as e:
                mine = inserts.caller_error(e)
                if mine is e:
                    raise  # the caller's to handle (a deadlock: rerun its transaction)
                raise mine from None
        session = self._work_session()
        bell = self._armed_bell()
        seen: list[tuple | None] = [None]

        def with_bell(cur) -> list[int]:
            ids = body(cur, session.max_allowed_packet)
            if bell is not None:  # the COMMIT carries the look: is anyone watching?
                seen[0] = session.commit_then_read(cur, *bell.look())
            return ids

        # Not idempotent: a blind retry after an unknown COMMIT could enqueue twice, so after
        # one Session.run asks whether the jobs are stored (a writer node that died after
        # committing) and runs it again only if not; failures before COMMIT are retried whole.
        # (A COMMIT sent inside the body, with the ring's look, still ends in OutcomeUnknown.)
        result = session.run(with_bell, what=f"enqueue {self.queue}", idempotent=False,
                             committed=inserts.jobs_stored)
        if bell is not None:
            bell.after_commit(seen[0])
        elif self.config.wakeup.instant_wake and self.config.wakeup.use_locks:
            instant_wake(self._locks(), self.locks)
        return result

    def _check_fits(self, rows: list[tuple]) -> None:
        """InputError for a row too big for the server, on notifyq's own session."""
        session = self._work_session()
        inserts.check_fits(rows, session.max_allowed_packet, session.conn)

    def _caller_max_packet(self, conn: Any, cur: Any) -> int:
        """The caller's server limit, asked once per connection (it is fixed for a session)."""
        try:
            return self._caller_packets[conn]
        except KeyError:
            pass
        except TypeError:  # a connection that takes no weak reference: ask every time
            return inserts.max_allowed_packet(cur)
        max_packet = self._caller_packets[conn] = inserts.max_allowed_packet(cur)
        return max_packet

    def _work_session(self) -> Session:
        if self._session is None:
            self._session = Session(self.config.dsn, name="producer")
        if not self._queue_known:
            self._session.run(lambda cur: queries.ensure_queue(cur, self.queue), what="ensure queue")
            self._queue_known = True
        return self._session

    def _locks(self) -> Session:
        if self._lock_session is None:
            self._lock_session = Session(self.config.dsn, autocommit=True, name="producer-locks")
        return self._lock_session

    def _armed_bell(self) -> Bell | None:
        if not self._ring or not self.config.wakeup.use_locks:
            return None
        if self._bell is None:
            self._bell = Bell(self._locks(), self.queue, self.locks)
        return self._bell if self._bell.arm() else None


# ------------------------------------------------------------ `notifyq produce` from a stream

@dataclass
class ProduceStats:
    lines: int = 0
    enqueued: int = 0
    rejected: int = 0
    batches: int = 0


def _batches(lines: Iterable[str], limits: Callable[[], tuple[int, float]],
             more: Callable[[float], bool]) -> Iterator[list[tuple[int, str]]]:
    """Group lines for one commit each: a line with nothing behind it is committed at once, and
    the lines that came while a commit was in flight go together in the next one.

    `more(timeout)` says whether a further line is waiting (or comes within timeout).
    `limits()` gives (max_lines, max_wait_s), asked again for every line, so a reload applies at
    once: max_wait_s > 0 holds a batch open that long after its first line for more to come.
    """
    batch: list[tuple[int, str]] = []
    opened = 0.0
    for item in enumerate(lines, 1):
        if not batch:
            opened = time.monotonic()
        batch.append(item)
        max_lines, max_wait_s = limits()
        if len(batch) >= max_lines or not more(max(0.0, opened + max_wait_s - time.monotonic())):
            yield batch
            batch = []
    if batch:
        yield batch


def produce_lines(producer: Producer, lines: Iterable[str], *, on_ids: Callable[[list[int]], None],
                  on_reject: Callable[[int, str, str], None], more: Callable[[float], bool],
                  priority: int = 0, delay: float = 0, run_at: dt.datetime | None = None) -> ProduceStats:
    """Enqueue JSON lines until `lines` ends; bad lines are reported and skipped, good ones never lost.

    Every line `lines` yields is enqueued or rejected, also after a stop request: ending the
    stream on a stop is the reader's job (lines.LineSource), which stops reading first.
    `more` is LineSource.ready. Batch limits come from producer.config.producer, read live
    (SIGHUP reload)."""
    stats = ProduceStats()

    def limits() -> tuple[int, float]:
        return producer.config.producer.batch_lines, producer.config.producer.batch_wait_s

    try:
        for batch in _batches(lines, limits, more):
            _produce_batch(producer, batch, stats, on_ids, on_reject, priority, delay, run_at)
    except ReadError as e:  # the lines before it are enqueued: say how far it got
        if not stats.lines:
            raise
        raise ReadError(e.name, e.why, after_line=stats.lines, enqueued=stats.enqueued) from None
    return stats


def _produce_batch(producer: Producer, batch: list[tuple[int, str]], stats: ProduceStats,
                   on_ids: Callable[[list[int]], None], on_reject: Callable[[int, str, str], None],
                   priority: int, delay: float, run_at: dt.datetime | None) -> None:
    rows = []
    for number, line in batch:
        stats.lines += 1
        text = line.strip()
        if not text:
            continue
        try:
            row = producer._row(json.loads(text), priority, delay, run_at, None, None)
            producer._check_fits([row])  # a line too big for the server goes alone
        except (ValueError, RecursionError, errors.InputError) as e:  # RecursionError: [[[[...
            stats.rejected += 1
            on_reject(number, text, str(e) if isinstance(e, errors.InputError) else f"invalid JSON: {e}")
            continue
        rows.append(row)
    if rows:
        on_ids(producer._write(rows, None))
        stats.enqueued += len(rows)
        stats.batches += 1
