"""Producer: put jobs on one queue of one server, alone or inside the caller's own transaction.

notifyq.Producer (notifyq/sharding/producer.py) composes these: one for a queue on one server,
one per shard for a queue spread over [shards].
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from notifyq import errors
from notifyq.config import values
from notifyq.config import DSN, Config, validate_queue_name
from notifyq.jobs import Status, envelope, tracing
from notifyq.produce import conns, workflow
from notifyq.store import inserts, queries, slot_rows, workflows
from notifyq.store.db import Session
from notifyq.store.driver import DriverError
from notifyq.store.locks import QueueLocks
from notifyq.wakeup import Waker
from notifyq.wakeup.queue_wakes import QueueWakes

log = logging.getLogger("notifyq.producer")

# One encoder for every payload: json.dumps with options builds a new one per call.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_encode = _JSON.encode
_READY = int(Status.READY)
# A job's row (rows(), line_row(); inserts.insert_jobs says what each value is): its job_key's place
KEY_COLUMN = 7
# put(dedup=): what a put whose dedup key a pending job holds does. keep: nothing (that job
# stays, its id is returned); replace: the new job takes the place of a ready or scheduled one
# (debounce); a claimed one runs as it is, the new one pending beside it.
KEEP, REPLACE = "keep", "replace"
# Parents a producer keeps for wake() to settle (puts after running parents on a caller's
# connection); more wait for the consumers' sweep
SETTLE_ON_WAKE_MAX = 10_000
DEDUP_MODES = (KEEP, REPLACE)


class CallerTransaction:
    """Producer.transaction()'s handle: put() and put_many() on the caller's connection."""

    def __init__(self, producer: "Producer", conn: Any):
        self.producer, self.conn, self.puts = producer, conn, 0

    def put(self, payload: Any, **options: Any) -> int:
        job_id = self.producer.put(payload, conn=self.conn, **options)
        self.puts += 1
        return job_id

    def put_many(self, payloads: Iterable[Any], **options: Any) -> list[int]:
        ids = self.producer.put_many(payloads, conn=self.conn, **options)
        self.puts += len(ids)
        return ids



def replaces(dedup: Any, dedup_key: Any) -> bool:
    """put(dedup=) checked: True for "replace", False for "keep"; else InputError."""
    if dedup not in DEDUP_MODES or not isinstance(dedup, str):
        raise errors.InputError(f"dedup: expected \"keep\" or \"replace\", got {values.shown(dedup)}")
    if dedup == REPLACE and dedup_key is None:
        raise errors.InputError("dedup=\"replace\" replaces the pending job of a dedup key: give dedup_key too")
    return dedup == REPLACE


def session_retry(config: Config, retry_s: float | None, retry_setting: str | None = None) -> dict[str, Any]:
    """How a producer's sessions retry an unreachable server (Session's arguments): retry_s (from
    the setting retry_setting, which the error names), or the config's producer.connect_retry_s;
    the retries at DEBUG, the caller gets the one error."""
    return {"retry_s": config.producer.connect_retry_s if retry_s is None else retry_s,
            "retry_setting": "producer.connect_retry_s" if retry_s is None else retry_setting,
            "retry_log_level": logging.DEBUG}

class Producer:
    """Enqueue jobs on `queue`, on one server (notifyq.Producer, for one server or several).

    `ring=True` is for long-lived producers (`notifyq produce`, a web app's producer kept open):
    the producer then holds one of the queue's bells, its COMMIT looks whether a consumer is
    watching, and only then it rings, which wakes that idle consumer within a millisecond or
    two. Under load (no consumer idle) a put costs what a plain one does. One producer per
    queue and server holds the bells: the first to put; another takes over within RINGER_RETRY_S
    of it closing. The others, like one-shot producers (which leave it off), rely on the
    watcher's backoff poll of the signal row, unless they interrupt the watcher's wait
    (`wakeup.instant_wake`, by default where the server lets them). Which way wakes is the
    producer's Waker's to choose (notifyq/wakeup/waker.py).

    Safe to share between threads (a web worker's threads may share one): put(), put_many()
    and close() take turns on the producer's own sessions and bell, one call at a time. A put that returns has stored its job; one that raises
    stored nothing, or raises OutcomeUnknown. Calls with `conn=` run on the caller's connection
    and never wait for the producer's other calls.
    """

    def __init__(self, queue: str, config: Config, *, ring: bool = False, retry_s: float | None = None,
                 retry_setting: str | None = None):
        """retry_s: how long a put retries an unreachable server before it raises DatabaseError
        (None: the config's producer.connect_retry_s, 5 s by default: a put inside a web request
        fails within the request, not after the worker's timeout; 0: one attempt). The retries
        are logged at DEBUG: the caller gets the one error. Sharding's dealer passes a short one:
        it says once itself that a shard is down, and puts the jobs on another. retry_setting:
        the setting retry_s comes from, which that error names."""
        if not isinstance(config, Config):
            raise errors.InputError(f"config: expected notifyq.config.load()'s Config, got {values.shown(config)}")
        if config.shards:
            raise errors.ConfigError("this config has [shards]: use notifyq.Producer, which places the "
                                     "queue's jobs on its shards")
        self.queue = validate_queue_name(queue)
        self.config = config
        self.queue_config = config.queue(queue)
        # Read on every put: a Config is frozen, so they are read here once (and by reload()).
        self._max_attempts = self.queue_config.max_attempts
        self._max_payload_bytes = config.producer.max_payload_bytes
        self._what = f"enqueue {self.queue}"  # Session.run's name for a put's transaction
        self.locks = QueueLocks(config.dsn.database, queue)
        if retry_s is not None:
            retry_s = values.seconds("retry_s", retry_s, positive=False)
        self._retry = session_retry(config, retry_s, retry_setting)
        # Opened on first use. One session, not a pool: docs, "Threads".
        self._session: Session | None = None
        # Wakes an idle consumer after each COMMIT (the ring, or the instant wake), on a session
        # of its own for the bell and wake(); it is called under self._mutex.
        self._waker = Waker(self.queue, self.locks, config, ring=ring, retry=self._retry)
        self._queue_known = False
        # The queue's counter slot rows are made (slot_rows.make): before a put on a caller's
        # connection, which never opens the producer's own session
        self._slot_rows_made = False
        self._caller_packets: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # One thread at a time on the producer's own sessions and bell: a MySQLdb connection
        # shared by two threads mixes their statements (ids returned for jobs rolled back).
        self._mutex = threading.Lock()
        self._packets_mutex = threading.Lock()  # _caller_packets only, never held over a statement
        self._results: Any = None  # result()'s Poller, made at the first wait
        self._results_mutex = threading.Lock()  # _results only, never held over a statement
        # Parents that were pending when a put on a caller's connection read them: wake(), which
        # the caller runs after its COMMIT, settles those that ended meanwhile (under _mutex)
        self._settle_on_wake: set[int] = set()
        # The other queues a workflow's put made jobs ready on: their idle consumers are woken
        # after its COMMIT (for a put on a caller's connection, by wake()), all on one session,
        # opened on first use (under _mutex)
        self._other_queues = QueueWakes(config, self.queue)
        self._wake_others_on_wake: set[str] = set()

    # -------------------------------------------------------- the API

    def put(self, payload: Any, *, priority: int = 0, delay: float = 0, run_at: dt.datetime | None = None,
            max_attempts: int | None = None, dedup_key: str | None = None, key: str | None = None,
            dedup: str = KEEP, conn: Any = None, min_version: int | None = None, after: Any = None,
            run_anyway: bool = False) -> int:
        """Put one job on the queue and return its id: notifyq.Producer.put says how, and what it
        raises."""
        if after is not None:
            if dedup is not KEEP:
                replaces(dedup, dedup_key)  # checked; a dedup key is refused with after= below
            return self.put_many([payload], priority=priority, delay=delay, run_at=run_at, max_attempts=max_attempts,
                                 key=key, conn=conn, min_version=min_version, after=after, run_anyway=run_anyway,
                                 dedup_key=dedup_key)[0]
        if min_version is not None:  # (the usual call's path below never tests for it)
            version = _min_version(min_version, dedup_key)
            row = self._row(payload, priority, delay, run_at, max_attempts, dedup_key, key)
            return self._write([row], conn, unique=False, min_version=version)[0]
        if (priority.__class__ is int and priority == 0 and delay.__class__ is int and delay == 0
                and run_at is None and max_attempts is None and dedup_key is None and key is None
                and conn is None and dedup is KEEP):
            # The usual call: the defaults' row, on the producer's own session (what _row and
            # _write do, without their checks of what the defaults make true).
            row = (self.queue, _READY, 0, 0, self._max_attempts, self._payload_text(payload), None, None)
            if tracing.HOOK is not None:
                return self._write_traced([row], None, False)[0]
            with self._mutex:
                return self._write_own([row], False)[0]
        row = self._row(payload, priority, delay, run_at, max_attempts, dedup_key, key)
        return self._write([row], conn, unique=dedup_key is not None,
                           replace=dedup is not KEEP and replaces(dedup, dedup_key))[0]

    def put_many(self, payloads: Iterable[Any], *, priority: int = 0, delay: float = 0,
                 run_at: dt.datetime | None = None, max_attempts: int | None = None,
                 key: str | None = None, conn: Any = None, min_version: int | None = None, after: Any = None,
                 run_anyway: bool = False, dedup_key: str | None = None) -> list[int]:
        """Put many jobs in one transaction (all or none) and return their ids, in the order of
        `payloads`. The arguments are put()'s, the same for every job; the rows go as multi-row
        INSERTs of up to `producer.chunk_size` rows, each within the server's
        `max_allowed_packet`."""
        version = _min_version(min_version, dedup_key) if min_version is not None else None
        if after is not None:
            if dedup_key is not None:
                raise errors.InputError("dedup_key cannot be used with after= (a waiting job holds no key)")
            parents = workflow.check_after(after)
            options = workflow.options_of(priority, delay, run_at, max_attempts)
            wf = workflow.Workflow()
            for payload in self._payload_list(payloads):
                wf.add(self.queue, payload, after=parents, run_anyway=run_anyway, key=key, **options)
            return self._put_workflow_traced(wf, conn, version) if len(wf) else []
        rows = self.rows(payloads, priority=priority, delay=delay, run_at=run_at, max_attempts=max_attempts,
                         key=key)
        return self._write(rows, conn, min_version=version) if rows else []

    def rows(self, payloads: Iterable[Any], *, priority: int = 0, delay: float = 0,
             run_at: dt.datetime | None = None, max_attempts: int | None = None,
             key: str | None = None) -> list[tuple]:
        """The jobs' rows, every argument checked (InputError) before anything is written: for
        put_many, and for sharding's dealer, which puts them on several servers (put_rows)."""
        payloads = self._payload_list(payloads)
        options = self._options(priority, delay, run_at, max_attempts, None)
        if key is not None:
            key = values.job_key("key", key)
        queue, (status, prio, delay_us, attempts) = self.queue, options
        return [(queue, status, prio, delay_us, attempts, text, None, key) for text in self._payload_texts(payloads)]

    @staticmethod
    def _payload_list(payloads: Any) -> Iterable[Any]:
        if isinstance(payloads, (str, bytes, dict)) or not hasattr(payloads, "__iter__"):
            raise errors.InputError(f"payloads: expected a list of payloads, got {values.shown(payloads)}")
        return payloads

    def put_workflow(self, wf: "workflow.Workflow", *, conn: Any = None) -> list[int]:
        """Put a workflow's jobs and edges in one transaction (all or none), on this producer's
        server, and return their ids in the order they were added (each Ref's id is set too):
        notifyq.Producer.put_workflow says how, and what it raises."""
        if not isinstance(wf, workflow.Workflow):
            raise errors.InputError(f"expected a notifyq.Workflow, got {values.shown(wf)}")
        return self._put_workflow_traced(wf, conn, None)

    def _put_workflow_traced(self, wf: "workflow.Workflow", conn: Any, min_version: int | None) -> list[int]:
        """put_workflow (and put(after=)): inside the installed tracer's "send" span as any put
        is, each job stored with the span's context; min_version: every job's, checked."""
        tracer = tracing.HOOK
        if tracer is None:
            ids = self._put_workflow(wf, conn, None, min_version)
        else:
            dsn = self.config.dsn
            ids = tracer.send(self.queue, len(wf), (dsn.host, dsn.port if not dsn.unix_socket else None),
                              lambda context: self._put_workflow(wf, conn, context, min_version))
        workflow.placed(wf, ids)
        return ids

    def _put_workflow(self, wf: "workflow.Workflow", conn: Any, context: str | None,
                      min_version: int | None) -> list[int]:
        """put_workflow's transaction; context: the trace context each job's envelope carries."""
        chunk = self.config.producer.chunk_size
        pending: list[int] = []  # parents put before, pending when the put read them
        ready: list[str] = []  # the queues it made jobs ready on (put_body)

        def fresh(ids: list[int]) -> dict[int, str]:
            # On the producer's own session (its own short transaction): never under _mutex here
            with self._mutex:
                return self._work_session().run(lambda cur: workflows.parents_state(cur, ids),
                                                what="read parents")

        def body(cur: Any, packet: int) -> list[int]:
            ids = workflow.put_body(wf, row, chunk, packet, pending, fresh if conn is not None else None, ready)(cur)
            if min_version is not None:  # before the COMMIT, as any put's (inserts.put_jobs)
                inserts.require_version(cur, ids, min_version)
            return ids

        def row(queue: str, payload: Any, options: dict[str, Any], status: Any) -> tuple:
            attempts = options.get("max_attempts") or self.config.queue(queue).max_attempts
            how = self._options(options.get("priority", 0), options.get("delay", 0), None, attempts, None)
            text = self._payload_text(payload)
            if context is not None:
                text = envelope.stamped(text, context)
            key = options.get("key")
            if key is not None:
                key = values.job_key("key", key)
            return (queue, int(status) if status is not None else how[0], *how[1:], text, None, key)

        if conn is not None:
            ids = self._run_caller(body, conn, True, wf.queues())
            with self._mutex:
                self._wake_others_on_wake.update(ready)
                if pending and len(self._settle_on_wake) < SETTLE_ON_WAKE_MAX:  # beyond: the sweep's
                    self._settle_on_wake.update(pending)
            return ids
        with self._mutex:
            session = self._work_session()
            self._make_slot_rows(wf.queues())  # the children's queues too: their release bumps them
            packet = session.max_allowed_packet
            ids = self._waker.commit_and_wake(session, lambda cur: body(cur, packet), what=self._what,
                                              committed=inserts.jobs_stored)
            self._other_queues.wake(ready)
            if pending:
                # A parent that ended between the put's read and its COMMIT did not see the new
                # edges (the put takes no lock on it): settled now, not at the consumers' sweep
                self._settle_ended(session, pending)
            return ids

    def _settle_ended(self, session: Session | None, parents: Iterable[int]) -> None:
        """workflows.settle_ended, best effort (under _mutex), on `session` (None: the work
        session): the jobs are stored already, and what this misses the consumers' sweep settles."""
        parents = sorted(parents)
        try:
            session = session or self._work_session()
            session.run(lambda cur: workflows.settle_ended(cur, parents), what="settle ended parents")
        except (errors.NotifyqError, DriverError) as e:
            log.debug("could not settle parents that ended during a put, the sweep will error=%s", e)

    def progress(self, job_id: int) -> dict[str, int]:
        """A job's parents (a batch callback's: the batch's members), counted as they are now:
        done, failed (dead or cancelled), pending, and awaited: the pending it still waits for."""
        with self._mutex:
            return self._work_session().run(lambda cur: workflows.progress(cur, job_id), what="progress")

    def parent_results(self, job_id: int) -> dict[int, Any]:
        """Job `job_id`'s parents' results (decoded JSON; None where none was kept), by parent id."""
        with self._mutex:
            found = self._work_session().run(lambda cur: workflows.parent_results(cur, job_id), what="results")
        return {parent: None if text is None else json.loads(text) for parent, text in found.items()}

    def line_row(self, payload: Any, priority: int, delay: float, run_at: dt.datetime | None,
                 key: str | None = None) -> tuple:
        """A job of `notifyq produce`'s stream, checked (InputError: that line is rejected) and
        its row sized against the server: a line too big for the server goes alone."""
        row = self._row(payload, priority, delay, run_at, None, None, key)
        with self._mutex:
            session = self._work_session()
            inserts.check_fits([row], session.max_allowed_packet, session.conn)
        return row

    def put_rows(self, rows: list[tuple]) -> list[int]:
        """rows() or line_row()'s rows, in one transaction on the producer's own session."""
        return self._write(rows, None)

    def result(self, job_id: int, *, wait: float = 0.0) -> Any:
        """The return value of job `job_id`'s handler, once the job is done: notifyq.Producer.result
        says how, and what it raises."""
        from notifyq.produce import results  # here: a producer that never asks need not load it

        # Every wait of this producer shares one session (its puts go on meanwhile on theirs):
        # however many threads wait, one connection (produce/results.py)
        with self._results_mutex:
            if self._results is None:
                self._results = results.Poller(self.result_dsn(), self._retry)
            poller = self._results
        return results.wait_for(poller, job_id, wait)

    def consume_rate(self, n: int = 1, *, key: str | None = None, wait: float | None = 30.0) -> bool:
        """Spend n starts of the queue's rates from outside a job: notifyq.Producer.consume_rate
        says how."""
        from notifyq.store import rates  # here: a producer that never asks need not load it

        n, key, wait = rates.consume_args(n, key, wait)
        # A session of its own per call: a wait for the refill must not hold up this producer's puts
        session = Session(self.config.dsn, name="rates", **self._retry)
        try:
            return rates.consume(session, self.queue, rates.Rates.of(self.queue_config), key, n, wait)
        finally:
            session.close()

    @property
    def retry(self) -> dict[str, Any]:
        """How this producer's sessions retry an unreachable server (Session's arguments)."""
        return dict(self._retry)

    def sessions(self) -> list[tuple[str, Session]]:
        """The sessions a put waits on, open now ((label, session)): for a stall watch (a
        `notifyq produce` stream's, notifyq/run/stream_watch.py), from another thread."""
        return [(label, session) for label, session in (("producer", self._session),
                                                         ("producer-locks", self._waker.session))
                if session is not None]

    def result_dsn(self) -> DSN:
        """Where result() reads (AsyncProducer.result looks there too, at its own pace)."""
        return self.config.dsn

    def reload(self, config: Config) -> None:
        """Take the settings a put reads (producer.chunk_size and max_payload_bytes, the queue's
        max_attempts) from `config`, whose server is this producer's (`notifyq produce`'s reload)."""
        self.config, self.queue_config = config, config.queue(self.queue)
        # __init__'s copies too: a put reads those, not the config
        self._max_attempts = self.queue_config.max_attempts
        self._max_payload_bytes = config.producer.max_payload_bytes

    def close(self) -> None:
        """Close the producer's database sessions, after any put under way; a later put opens
        new ones. `with Producer(...) as producer:` closes it at the end of the block."""
        with self._mutex:
            self._waker.close()
            self._other_queues.end_sessions()
            self._end(Session.close)

    def drop(self) -> None:
        """Close the connections without a word to the server (it is gone): its locks, the
        bell's among them, die with them."""
        with self._mutex:
            self._waker.drop()
            self._other_queues.end_sessions(drop=True)
            self._end(Session.discard)

    def _end(self, how: Callable[[Session], None]) -> None:
        if self._session is not None:
            how(self._session)
        self._session = None
        self._queue_known = False

    def wake(self, instant: bool | None = None) -> None:
        """Wake an idle consumer of the queue now, for jobs put on the caller's connection (and
        of each other queue a workflow put there made jobs ready on): notifyq.Producer.wake.
        Best effort: it never raises."""
        with self._mutex:
            if self._settle_on_wake:
                parents, self._settle_on_wake = self._settle_on_wake, set()
                self._settle_ended(None, parents)
            self._waker.wake(instant)
            if self._wake_others_on_wake:
                queues, self._wake_others_on_wake = self._wake_others_on_wake, set()
                self._other_queues.wake(queues)

    def leave_wake_to(self, other: Any) -> None:
        """Leave the wake-up after this producer's puts to `other`, a producer of the same queue
        on the same server, whose wake() then runs after each of them (AsyncProducer's sessions
        but the first: one ringer for them all). The Waker does it (Waker.leave_to)."""
        with self._mutex:
            self._waker.leave_to(other.wake)

    @contextlib.contextmanager
    def transaction(self, conn: Any) -> Iterator[CallerTransaction]:
        """The caller's own transaction on `conn`, with the jobs put in it, and the consumers woken
        once it committed (notifyq.Producer.transaction)."""
        tx = CallerTransaction(self, conn)
        try:
            yield tx
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
        if tx.puts:
            self.wake()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------- internals

    def _row(self, payload: Any, priority: int, delay: float, run_at: dt.datetime | None,
             max_attempts: int | None, dedup_key: str | None, key: str | None) -> tuple:
        """Every argument checked before anything is written: one InputError line each."""
        text = self._payload_text(payload)
        options = self._options(priority, delay, run_at, max_attempts, dedup_key)
        if key is not None:
            key = values.job_key("key", key)
        return (self.queue, *options, text, dedup_key, key)

    def _payload_texts(self, payloads: Iterable[Any]) -> list[str]:
        """_payload_text of every payload, checked as it checks one, by the list's own loops
        (map, max) rather than a Python call and test per payload: a bulk producer's own work
        per job is what is left beside the server's. Any payload it would refuse is looked at
        again one by one, so the error is the first bad payload's, as _payload_text words it."""
        if not isinstance(payloads, (list, tuple)):
            payloads = list(payloads)
        try:
            texts = list(map(_encode, payloads))
            if all(map(str.isascii, texts)):  # an ASCII text is its own size
                largest = max(map(len, texts), default=0)
            else:  # encoded: the bytes' size, and a lone surrogate refused (UnicodeEncodeError)
                largest = max(map(len, map(str.encode, texts)), default=0)
        except (TypeError, ValueError, RecursionError):
            largest = None
        if largest is None or largest > self._max_payload_bytes:
            return [self._payload_text(p) for p in payloads]  # raises the first one's InputError
        return envelope.escaped_all(texts)

    def _payload_text(self, payload: Any) -> str:
        try:
            text = _encode(payload)
            # An ASCII text is its own size; any other is encoded, which also refuses a lone
            # surrogate (ensure_ascii=False lets it through the JSON encoder).
            size = len(text) if text.isascii() else len(text.encode())
        except (TypeError, ValueError) as e:  # also UnicodeEncodeError: a lone surrogate
            raise errors.InputError(f"payload is not JSON-serialisable: {values.shown(str(e))}") from None
        except RecursionError:
            raise errors.InputError("payload is not JSON-serialisable: nested too deeply") from None
        limit = self._max_payload_bytes
        if size > limit:
            raise errors.InputError(f"payload is {size} bytes, over the {limit}-byte limit")
        return envelope.escaped(text)

    def _options(self, priority: int, delay: float, run_at: dt.datetime | None, max_attempts: int | None,
                 dedup_key: str | None) -> tuple[Any, int, Any, int]:
        """(status, priority, delay_us, max_attempts), checked: the same for every job of a call,
        so put_many checks them once. With run_at: (at, priority, at, max_attempts), `at` in UTC,
        for the server to compare with its own clock (inserts.insert_jobs)."""
        if (priority.__class__ is int and priority == 0 and delay.__class__ is int and delay == 0
                and run_at is None and max_attempts is None and dedup_key is None):
            # put()'s defaults, the usual call: nothing to check (the queue's max_attempts was
            # checked with the config), and checking them is no small part of put()'s own Python.
            return _READY, 0, 0, self._max_attempts
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
            values.job_key("dedup_key", dedup_key)
        if run_at is not None:
            at = run_at.astimezone(dt.timezone.utc).replace(tzinfo=None)
            return at, priority, at, attempts
        status = Status.SCHEDULED if delay > 0 else Status.READY
        return int(status), priority, int(delay * 1e6), attempts

    def _write(self, rows: list[tuple], conn: Any, unique: bool = False, replace: bool = False,
               min_version: int | None = None) -> list[int]:
        if tracing.HOOK is not None:
            return self._write_traced(rows, conn, unique, replace, min_version)
        return self._write_untraced(rows, conn, unique, replace, min_version)

    def _write_traced(self, rows: list[tuple], conn: Any, unique: bool, replace: bool = False,
                      min_version: int | None = None) -> list[int]:
        """_write inside the installed tracer's "send" span (jobs/tracing.py), each job stored
        with the span's context in its payload's envelope (jobs/envelope.py)."""
        tracer = tracing.HOOK
        if tracer is None:  # uninstrumented meanwhile
            return self._write_untraced(rows, conn, unique, replace, min_version)

        def write(context: str | None) -> list[int]:
            if context is not None:
                rows_ = [(*r[:5], envelope.stamped(r[5], context), *r[6:]) for r in rows]
            else:
                rows_ = rows
            return self._write_untraced(rows_, conn, unique, replace, min_version)

        dsn = self.config.dsn
        return tracer.send(self.queue, len(rows), (dsn.host, dsn.port if not dsn.unix_socket else None), write)

    def _write_untraced(self, rows: list[tuple], conn: Any, unique: bool, replace: bool = False,
                        min_version: int | None = None) -> list[int]:
        if conn is not None:
            return self._write_caller(rows, conn, unique, replace, min_version)
        with self._mutex:
            return self._write_own(rows, unique, replace, min_version)

    def _body(self, rows: list[tuple], unique: bool, replace: bool,
              min_version: int | None = None) -> Callable[[Any, int], list[int]]:
        """The statements of a put (inserts.put_jobs), given a cursor and the server's packet limit."""
        max_rows = self.config.producer.chunk_size
        return lambda cur, max_packet: inserts.put_jobs(cur, self.queue, rows, unique=unique, max_rows=max_rows,
                                                        max_packet=max_packet, replace=replace,
                                                        min_version=min_version)

    def _write_caller(self, rows: list[tuple], conn: Any, unique: bool, replace: bool = False,
                      min_version: int | None = None) -> list[int]:
        """The caller's transaction: no commit, no bell, no retry here, and none of the
        producer's own state (no wait for its other calls). On a connection in autocommit mode
        with no transaction open, a put of several statements (a dedup key, several INSERTs)
        runs as a transaction of its own: its key lock must last until its job is in."""
        # min_version: the UPDATE after the INSERT, which must commit with it
        return self._run_caller(self._body(rows, unique, replace, min_version), conn,
                                unique or len(rows) > 1 or min_version is not None,
                                () if self._slot_rows_made else (self.queue,))

    def _run_caller(self, body: Callable[[Any, int], Any], conn: Any, several: bool,
                    queues: Iterable[str]) -> Any:
        """body(cursor, max_packet) on the caller's connection (_write_caller). several: more than
        one statement, which must commit together. queues: those whose slot rows are made first,
        on a session of their own (the caller's transaction may be open: _make_slot_rows)."""
        conn = conns.dbapi(conn)
        if not callable(getattr(conn, "cursor", None)):
            raise errors.InputError(f"conn: expected a database connection, got {values.shown(conn)}")
        self._make_slot_rows(queues)
        try:
            cur = conn.cursor()
            try:
                max_packet = self._caller_max_packet(conn, cur)
                if several and inserts.outside_transaction(conn, cur):
                    return inserts.in_own_transaction(conn, cur, lambda c: body(c, max_packet))
                return body(cur, max_packet)
            finally:
                cur.close()
        except DriverError as e:
            mine = inserts.caller_error(e)
            if mine is e:
                raise  # the caller's to handle (a deadlock: rerun its transaction)
            raise mine from None

    def _write_own(self, rows: list[tuple], unique: bool, replace: bool = False,
                   min_version: int | None = None) -> list[int]:
        """On the producer's own session, under self._mutex: the put's transaction, then its
        waker's wake-up (whose look rides the COMMIT)."""
        queue, max_rows = self.queue, self.config.producer.chunk_size
        session = self._work_session()
        # Not idempotent: a blind retry after an unknown COMMIT could enqueue twice, so after
        # one Session.run asks whether the jobs are stored (a writer node that died after
        # committing) and runs it again only if not; failures before COMMIT are retried whole.
        # That question needs the jobs' ids, so the COMMIT goes only once the INSERT's reply
        # named them: sent in the INSERT's own query (one round trip, not two), a lost reply
        # took the ids with it and the put ran twice (benchmarks/HISTORY.md, 2026-11-30).
        put = functools.partial(inserts.put_jobs, queue=queue, rows=rows, unique=unique, max_rows=max_rows,
                                max_packet=session.max_allowed_packet, replace=replace, min_version=min_version)
        return self._waker.commit_and_wake(session, put, what=self._what, committed=inserts.jobs_stored)

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

    def _work_session(self) -> Session:
        if self._session is None:
            self._session = Session(self.config.dsn, name="producer", **self._retry)
        if not self._queue_known:
            self._session.run(lambda cur: queries.ensure_queue(cur, self.queue), what="ensure queue")
            self._make_slot_rows([self.queue])
            self._queue_known = True
        return self._session

    def _make_slot_rows(self, queues: Iterable[str]) -> None:
        """The queues' counter slot rows, all 16 of each, made outside the put's transaction (a
        session of their own: a caller's connection may be inside the caller's own transaction)
        before its first bump, once per process and queue (store/slot_rows.py)."""
        queues = list(queues)
        if slot_rows.make(self.config.dsn, queues, **self._retry) and self.queue in queues:
            self._slot_rows_made = True  # (not made: a later put tries again, after TRY_AGAIN_S)


def _min_version(min_version: Any, dedup_key: str | None) -> int:
    """put(min_version=): a whole number from 0 to values.MAX_VERSION, and never with a dedup key
    (the id a unique put returns may be another put's job, whose minimum is not this put's)."""
    if dedup_key is not None:
        raise errors.InputError("min_version and dedup_key cannot be given together")
    return int(values.number("min_version", min_version, lo=0, hi=values.MAX_VERSION, integer=True))
