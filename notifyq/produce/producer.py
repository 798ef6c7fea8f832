"""Producer: put jobs on one queue, alone or inside the caller's own transaction."""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from notifyq import errors, shards, values
from notifyq.config import Config, validate_queue_name
from notifyq.jobs import Status
from notifyq.produce.lines import ReadError
from notifyq.store import dedup, inserts, queries
from notifyq.store.db import Session
from notifyq.store.driver import DriverError
from notifyq.store.locks import QueueLocks
from notifyq.wakeup import Bell, instant_wake

log = logging.getLogger("notifyq.producer")

# One encoder for every payload: json.dumps with options builds a new one per call.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)

# A spread queue's put keeps trying a shard this long (a deadlock, a reconnect) before its rows go
# to the next shard, and a shard it could not reach is left out of the deal this long, then tried
# again. One shard's outage then costs a put about SHARD_RETRY_S once per SHARD_RECHECK_S, not the
# 60 s a pinned queue's put waits for its one server.
SHARD_RETRY_S = 1.0
SHARD_RECHECK_S = 10.0


class Producer:
    """Enqueue jobs on `queue`.

    `ring=True` is for long-lived producers (`notifyq produce`, a web app's producer kept open):
    the producer then holds one of the queue's bells, its COMMIT looks whether a consumer is
    watching, and only then it rings, which wakes that idle consumer within a millisecond or
    two. Under load (no consumer idle) a put costs what a plain one does. One producer per
    queue and server holds the bells: the first to put; another takes over within ARM_RETRY_S
    of it closing. The others, like one-shot producers (which leave it off), rely on the
    watcher's backoff poll of the signal row (or `wakeup.instant_wake`, which interrupts it).

    Safe to share between threads (a web worker's threads may share one): put(), put_many()
    and close() take turns on the producer's own session, bell and (on a spread queue) its
    dealing state, one call at a time. A put that returns has stored its job; one that raises
    stored nothing, or raises OutcomeUnknown. Calls with `conn=` run on the caller's connection
    and never wait for the producer's other calls.
    """

    def __init__(self, queue: str, config: Config, *, ring: bool = False):
        if not isinstance(config, Config):
            raise errors.InputError(f"config: expected notifyq.config.load()'s Config, got {values.shown(config)}")
        self.queue = validate_queue_name(queue)
        self.config = config
        self.queue_config = config.queue(queue)
        self.placement = shards.Placement(config)
        self._home = self.placement.home(queue)
        self._turn = shards.RoundRobin(self.placement.names) if self.placement.spread(queue) else None
        self._links: dict[str, _ShardLink] = {}  # shard name -> its sessions, opened on first use
        self._down: dict[str, float] = {}  # spread queue: shard -> when to try it again (monotonic)
        self._ring = ring
        self._caller_packets: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # One thread at a time on the producer's own sessions and bell (a MySQLdb connection
        # shared by two threads mixes their statements: ids returned for jobs that were rolled
        # back), and on _links, _down and _turn. One session, not a pool: README, "Threads".
        self._mutex = threading.Lock()
        self._packets_mutex = threading.Lock()  # _caller_packets only, never held over a statement

    # The home shard's sessions and bell (the only ones of a queue that is not spread).
    @property
    def locks(self) -> QueueLocks:
        return self._link(self._home).locks

    @property
    def _session(self) -> Session | None:
        return self._link(self._home).session

    @property
    def _lock_session(self) -> Session | None:
        return self._link(self._home).lock_session

    @property
    def _bell(self) -> Bell | None:
        return self._link(self._home).bell

    # -------------------------------------------------------- the API

    def put(self, payload: Any, *, priority: int = 0, delay: float = 0, run_at: dt.datetime | None = None,
            max_attempts: int | None = None, dedup_key: str | None = None, conn: Any = None) -> int:
        """Enqueue one job and return its id; with `conn` it commits with the caller's transaction.

        With `dedup_key`, a pending job (ready, scheduled or claimed) holding the same key on this
        queue makes this a no-op that returns that job's id.
        """
        row = self._row(payload, priority, delay, run_at, max_attempts, dedup_key)
        shard = self.placement.for_key(self.queue, dedup_key) if dedup_key is not None else None
        return self._write([row], conn, unique=dedup_key is not None, shard=shard)[0]

    def put_many(self, payloads: Iterable[Any], *, priority: int = 0, delay: float = 0,
                 run_at: dt.datetime | None = None, max_attempts: int | None = None,
                 conn: Any = None) -> list[int]:
        """Enqueue many jobs atomically, in multi-row INSERTs of up to `producer.chunk_size` rows
        that each fit the server's max_allowed_packet. On a spread queue the jobs are dealt
        round-robin over the shards and each shard's share is one transaction there: atomic per
        shard, not across shards; the ids come back in the order of `payloads`."""
        if isinstance(payloads, (str, bytes, dict)) or not hasattr(payloads, "__iter__"):
            raise errors.InputError(f"payloads: expected a list of payloads, got {values.shown(payloads)}")
        options = self._options(priority, delay, run_at, max_attempts, None)
        rows = [(self.queue, *options, self._payload_text(p), None) for p in payloads]
        return self._write(rows, conn) if rows else []

    def close(self) -> None:
        """Close the producer's sessions (after any put under way); a later put opens new ones."""
        with self._mutex:
            for link in self._links.values():
                link.close()
            self._links.clear()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------- internals

    def _row(self, payload: Any, priority: int, delay: float, run_at: dt.datetime | None,
             max_attempts: int | None, dedup_key: str | None) -> tuple:
        """Every argument checked before anything is written: one InputError line each."""
        text = self._payload_text(payload)
        return (self.queue, *self._options(priority, delay, run_at, max_attempts, dedup_key), text, dedup_key)

    def _payload_text(self, payload: Any) -> str:
        try:
            text = _JSON.encode(payload)
            # An ASCII text is its own size; any other is encoded, which also refuses a lone
            # surrogate (ensure_ascii=False lets it through the JSON encoder).
            size = len(text) if text.isascii() else len(text.encode())
        except (TypeError, ValueError) as e:  # also UnicodeEncodeError: a lone surrogate
            raise errors.InputError(f"payload is not JSON-serialisable: {values.shown(str(e))}") from None
        except RecursionError:
            raise errors.InputError("payload is not JSON-serialisable: nested too deeply") from None
        limit = self.config.producer.max_payload_bytes
        if size > limit:
            raise errors.InputError(f"payload is {size} bytes, over the {limit}-byte limit")
        return text

    def _options(self, priority: int, delay: float, run_at: dt.datetime | None, max_attempts: int | None,
                 dedup_key: str | None) -> tuple[Any, int, Any, int]:
        """(status, priority, delay_us, max_attempts), checked: the same for every job of a call,
        so put_many checks them once. With run_at: (at, priority, at, max_attempts), `at` in UTC,
        for the server to compare with its own clock (inserts.insert_jobs)."""
        if (priority.__class__ is int and priority == 0 and delay.__class__ is int and delay == 0
                and run_at is None and max_attempts is None and dedup_key is None):
            # put()'s defaults, the usual call: nothing to check (the queue's max_attempts was
            # checked with the config). Checking them costs a fifth of put()'s own Python.
            return int(Status.READY), 0, 0, self.queue_config.max_attempts
        priority = values.number("priority", priority, lo=-32768, hi=32767, integer=True)
        if run_at is not None:
            if not isinstance(run_at, dt.datetime):
                raise errors.InputError(f"run_at: expected a datetime, got {values.shown(run_at)}")
            if run_at.tzinfo is None:
                raise errors.InputError("run_at must be timezone-aware (it is stored in UTC)")
            # The producer's clock only bounds how far ahead: whether the time has come is the
            # server's to say, when it inserts the job.
            if (run_at - dt.datetime.now(dt.timezone.utc)).total_seconds() > values.MAX_SECONDS:
                raise errors.InputError(f"run_at: at most {values.MAX_SECONDS / 86400 / 365:g} years ahead")
            delay = 0
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
        if run_at is not None:
            at = run_at.astimezone(dt.timezone.utc).replace(tzinfo=None)
            return at, priority, at, attempts
        status = Status.SCHEDULED if delay > 0 else Status.READY
        return int(status), priority, int(delay * 1e6), attempts

    def _insert_unique(self, cur, row: tuple, max_packet: int) -> int:
        """A pending job holding the key wins: its id, nothing written but the key's lock."""
        held = dedup.holder(cur, self.queue, row[6])
        if held is not None:
            return held
        job_id = inserts.insert_jobs(cur, [row], max_rows=1, max_packet=max_packet, signal=(self.queue, 1))[0]
        dedup.take(cur, self.queue, row[6], job_id)
        return job_id

    def _write(self, rows: list[tuple], conn: Any, unique: bool = False, shard: str | None = None) -> list[int]:
        """Each row to its shard: the queue's one shard, the key's (`shard`), or in turn."""
        if self._turn is None or shard is not None:
            try:
                if conn is not None:
                    return self._write_caller(rows, conn, unique)
                with self._mutex:
                    return self._write_shard(rows, unique, self._home if shard is None else shard)
            except errors.DatabaseError as e:
                if self._turn is None or shard is None:
                    raise
                raise type(e)(f"{e} (shard {shard}: a job with a dedup key goes to its key's shard only)") from None
        if conn is not None:
            raise errors.InputError(f"conn: queue {self.queue} is spread over shards: a caller's transaction "
                                    "is on one server (put it without conn, or pin the queue to a shard)")
        with self._mutex:
            return self._deal(rows)

    def _deal(self, rows: list[tuple]) -> list[int]:
        """A spread queue's rows in turn over the shards that are up. A shard's share that fails
        with DatabaseError was not stored (Session.run: a COMMIT whose outcome is unknown raises
        OutcomeUnknown instead, and is never moved): it is dealt again over the others, and that
        shard left out until SHARD_RECHECK_S. Only when no shard takes it does the put fail."""
        ids: list[int] = [0] * len(rows)
        left = list(range(len(rows)))
        failed: set[str] = set()  # in this put
        last: errors.DatabaseError | None = None
        while left:
            now = time.monotonic()
            up = tuple(n for n in self.placement.names if n not in failed and self._down.get(n, 0.0) <= now)
            if not up:  # every shard left out: try those that did not fail in this put, down or not
                up = tuple(n for n in self.placement.names if n not in failed)
            if not up:
                assert last is not None
                raise type(last)(f"no shard of queue {self.queue} could take its jobs; the last: {last}") from None
            dealt = self._turn.take(len(left), among=up)
            moved: list[int] = []
            for name in dict.fromkeys(dealt):  # each shard's share, in the order dealt
                mine = [i for i, s in zip(left, dealt) if s == name]
                try:
                    got = self._write_shard([rows[i] for i in mine], False, name)
                except errors.DatabaseError as e:
                    self._shard_down(name, e)
                    failed.add(name)
                    moved += mine
                    last = e
                    continue
                if self._down.pop(name, None) is not None:
                    log.warning("shard reachable again, jobs of queue %s go to it again shard=%s", self.queue, name)
                for i, job_id in zip(mine, got):
                    ids[i] = job_id
            left = moved
        return ids

    def _shard_down(self, name: str, exc: errors.DatabaseError) -> None:
        if name not in self._down:
            log.warning("shard unreachable, jobs of queue %s go to the other shards (tried again every "
                        "%g s) shard=%s error=%s", self.queue, SHARD_RECHECK_S, name, exc)
        self._down[name] = time.monotonic() + SHARD_RECHECK_S
        self._links.pop(name).drop()  # a fresh link when it is tried again

    def _body(self, rows: list[tuple], unique: bool) -> Callable[[Any, int], list[int]]:
        """The statements of a put: rows too big for the server's max_allowed_packet raise
        InputError before any INSERT is sent (inserts.insert_jobs plans every chunk first)."""
        def body(cur, max_packet: int) -> list[int]:
            if unique:
                inserts.check_fits(rows, max_packet, getattr(cur, "connection", None))
                return [self._insert_unique(cur, rows[0], max_packet)]
            return inserts.insert_jobs(cur, rows, max_rows=self.config.producer.chunk_size,
                                       max_packet=max_packet, signal=(self.queue, len(rows)))
        return body

    def _write_caller(self, rows: list[tuple], conn: Any, unique: bool) -> list[int]:
        """The caller's transaction: no commit, no bell, no retry here, and none of the
        producer's own state (no wait for its other calls). On a connection in autocommit mode
        with no transaction open, a put of several statements (a dedup key, several INSERTs)
        runs as a transaction of its own: its key lock must last until its job is in."""
        if not callable(getattr(conn, "cursor", None)):
            raise errors.InputError(f"conn: expected a database connection, got {values.shown(conn)}")
        body = self._body(rows, unique)
        try:
            cur = conn.cursor()
            try:
                max_packet = self._caller_max_packet(conn, cur)
                if (unique or len(rows) > 1) and inserts.outside_transaction(conn, cur):
                    return inserts.in_own_transaction(conn, cur, lambda c: body(c, max_packet))
                return body(cur, max_packet)
            finally:
                cur.close()
        except DriverError as e:
            mine = inserts.caller_error(e)
            if mine is e:
                raise  # the caller's to handle (a deadlock: rerun its transaction)
            raise mine from None

    def _write_shard(self, rows: list[tuple], unique: bool, shard: str) -> list[int]:
        """On the producer's own session of `shard`, under self._mutex."""
        body = self._body(rows, unique)
        link = self._link(shard)
        session = link.work_session()
        bell = link.armed_bell()
        # The bell that looks after this COMMIT: none inside the quiet window of a look that saw
        # nobody watching, where the put commits as a plain one does.
        looking = bell if bell is not None and bell.look_due() else None
        seen: list[tuple | None] = [None]

        def with_bell(cur) -> list[int]:
            ids = body(cur, session.max_allowed_packet)
            if looking is not None:  # the COMMIT carries the look: is anyone watching?
                seen[0] = looking.commit_and_look(session, cur, ids)
            return ids

        # Not idempotent: a blind retry after an unknown COMMIT could enqueue twice, so after
        # one Session.run asks whether the jobs are stored (a writer node that died after
        # committing) and runs it again only if not; failures before COMMIT are retried whole.
        # The same for the COMMIT a ringing producer sends inside the body, with the ring's look
        # (commit_and_look is handed the ids the body returns). A ring lost with it costs the
        # consumers at most their backoff poll: `seen` stays None and after_commit rings anyway.
        result = session.run(with_bell, what=f"enqueue {self.queue}", idempotent=False,
                             committed=inserts.jobs_stored)
        if looking is not None:
            looking.after_commit(seen[0])
        elif (bell is None and self.config.wakeup.instant_wake and self.config.wakeup.use_locks
              and not link.behind_proxy):
            if instant_wake(link.lock_sessions(), link.locks) is None:
                link.behind_proxy = True
                log.warning("wakeup.instant_wake is off for this producer: its connection goes through "
                            "a proxy (the server knows it by another id than the handshake gave), where a "
                            "KILL QUERY could hit an unrelated session; the consumers' poll finds its jobs "
                            "queue=%s", self.queue)
        return result

    def _check_fits(self, rows: list[tuple]) -> None:
        """InputError for a row too big for the server, on notifyq's own session (the home
        shard's: the shards of one deployment share their settings; a spread queue's, the first
        shard that answers)."""
        with self._mutex:
            self._check_fits_locked(rows)

    def _check_fits_locked(self, rows: list[tuple]) -> None:
        names = [self._home] + ([n for n in self.placement.names if n != self._home] if self._turn else [])
        for name in names:
            if name in self._down and self._down[name] > time.monotonic() and name != names[-1]:
                continue
            try:
                session = self._link(name).work_session()
            except errors.DatabaseError as e:
                if self._turn is None or name == names[-1]:
                    raise
                self._shard_down(name, e)
                continue
            inserts.check_fits(rows, session.max_allowed_packet, session.conn)
            return

    def _caller_max_packet(self, conn: Any, cur: Any) -> int:
        """The caller's server limit, asked once per connection (it is fixed for a session)."""
        try:
            with self._packets_mutex:
                return self._caller_packets[conn]
        except KeyError:
            pass
        except TypeError:  # a connection that takes no weak reference: ask every time
            return inserts.max_allowed_packet(cur)
        max_packet = inserts.max_allowed_packet(cur)
        with self._packets_mutex:
            self._caller_packets[conn] = max_packet
        return max_packet

    def _link(self, shard: str) -> "_ShardLink":
        if shard not in self._links:
            retry_s = SHARD_RETRY_S if self._turn is not None else None
            self._links[shard] = _ShardLink(self.config.on_shard(shard), self.queue, self._ring, retry_s)
        return self._links[shard]


class _ShardLink:
    """A producer's sessions and bell on one shard, each opened on first use."""

    def __init__(self, config: Config, queue: str, ring: bool, retry_s: float | None = None):
        self.config = config  # its dsn is the shard's
        self.queue = queue
        self.ring = ring
        # None: the sessions' defaults. Else a spread queue's: short, and its retries logged at
        # DEBUG (the producer says once that the shard is down).
        self.retry = {} if retry_s is None else {"retry_s": retry_s, "retry_log_level": logging.DEBUG}
        self.locks = QueueLocks(config.dsn.database, queue)
        self.session: Session | None = None
        self.lock_session: Session | None = None
        self.bell: Bell | None = None
        self.queue_known = False
        self.behind_proxy = False  # instant_wake refused: the server's id for us is not the handshake's

    def work_session(self) -> Session:
        if self.session is None:
            self.session = Session(self.config.dsn, name="producer", **self.retry)
        if not self.queue_known:
            self.session.run(lambda cur: queries.ensure_queue(cur, self.queue), what="ensure queue")
            self.queue_known = True
        return self.session

    def lock_sessions(self) -> Session:
        if self.lock_session is None:
            self.lock_session = Session(self.config.dsn, autocommit=True, name="producer-locks", **self.retry)
        return self.lock_session

    def armed_bell(self) -> Bell | None:
        if not self.ring or not self.config.wakeup.use_locks:
            return None
        if self.bell is None:
            self.bell = Bell(self.lock_sessions(), self.queue, self.locks)
        return self.bell if self.bell.arm() else None

    def close(self) -> None:
        if self.bell is not None:
            self.bell.disarm()
        self._end(Session.close)

    def drop(self) -> None:
        """Close the connections without a word to the server (it is gone): its locks, the
        bell's among them, die with them."""
        self._end(Session.discard)

    def _end(self, how: Callable[[Session], None]) -> None:
        for session in (self.session, self.lock_session):
            if session is not None:
                how(session)
        self.session = self.lock_session = self.bell = None


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
