"""notifyq.Producer, and the producer of a deployment with [shards]: one-server producers
(notifyq/produce/producer.py), one per shard, and the placement of each job among them.

A queue that is not spread lives on one shard: its jobs go to that shard's producer. A spread
queue's jobs with a dedup key go to the shard their key hashes to (uniqueness holds per key);
the others are dealt round-robin over the shards that are up, each shard's share one
transaction there (atomic per shard, not across shards).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from notifyq import errors
from notifyq.config import DSN, Config, validate_queue_name, values
from notifyq.produce import producer as one_server
from notifyq.sharding.placement import Placement, RoundRobin
from notifyq.store import schema
from notifyq.store.db import Session, oneshot_session

log = logging.getLogger("notifyq.producer")

# A spread queue's put keeps trying a shard this long (a deadlock, a reconnect) before its rows go
# to the next shard, and a shard it could not reach is left out of the deal this long, then tried
# again. One shard's outage then costs a put about SHARD_RETRY_S once per SHARD_RECHECK_S, not the
# producer.connect_retry_s (5 s) a pinned queue's put waits for its one server.
SHARD_RETRY_S = 1.0
SHARD_RECHECK_S = 10.0


class Producer(one_server.Producer):
    """Put jobs on the queue `queue`: `notifyq.Producer(queue, config)`.

        config = notifyq.load_config()
        with notifyq.Producer("emails", config) as producer:
            job_id = producer.put({"to": "a@example.com"})

    A put that returns has stored its job; one that raises has stored nothing, or raises
    `notifyq.errors.OutcomeUnknown` (the connection died during its COMMIT). Open one producer
    when the process starts and share it between its threads; close it at exit (or use it as a
    context manager). Its database session is opened at the first put.

    Args:
        queue: the queue's name (letters, digits, `_`, `-`, `.`; up to 64 characters).
        config: what `notifyq.load_config()` returns.
        ring: for a long-lived producer (a web app's): it then wakes an idle consumer within a
            millisecond or two of each put. Without it, a put still wakes an idle consumer by
            interrupting its wait where producers and consumers log in as one database user
            (`wakeup.instant_wake`), else the consumers find the job at their next poll (at
            most `wakeup.poll_max_s`, 1 s).
        retry_s: how long a put retries an unreachable server before it raises
            `notifyq.errors.DatabaseError` (None: the config's `producer.connect_retry_s`, 5 s;
            0: a single attempt).

    With `[shards]` in the config, the producer places each job on its queue's shard, with the
    same methods.
    """

    def __new__(cls, queue: str, config: Config, *, ring: bool = False, retry_s: float | None = None):
        if isinstance(config, Config) and config.shards:
            return ShardedProducer(queue, config, ring=ring, retry_s=retry_s)
        return super().__new__(cls)


class ShardedProducer:
    """A queue's producer over [shards]. Safe to share between threads, as Producer is: calls
    take turns on what it keeps (its shards' producers, which shards are down, the turn)."""

    def __init__(self, queue: str, config: Config, *, ring: bool = False, retry_s: float | None = None):
        """retry_s: as Producer's, for a queue pinned to one shard; a spread queue's share tries
        a shard at most SHARD_RETRY_S before it goes to the next."""
        if not isinstance(config, Config):
            raise errors.InputError(f"config: expected notifyq.config.load()'s Config, got {values.shown(config)}")
        self.queue = validate_queue_name(queue)
        self.config = config
        self._retry_s = None if retry_s is None else values.seconds("retry_s", retry_s, positive=False)
        self.placement = Placement(config)
        self._home = self.placement.home(queue)
        self._turn = RoundRobin(self.placement.names) if self.placement.spread(queue) else None
        self._ring = ring
        self._producers: dict[str, one_server.Producer] = {}  # shard -> its producer, made on first use
        self._down: dict[str, float] = {}  # spread queue: shard -> when to try it again (monotonic)
        self._mutex = threading.Lock()

    # -------------------------------------------------------- the API (Producer's)

    def put(self, payload: Any, *, priority: int = 0, delay: float = 0, run_at: dt.datetime | None = None,
            max_attempts: int | None = None, dedup_key: str | None = None, conn: Any = None) -> int:
        options = {"priority": priority, "delay": delay, "run_at": run_at, "max_attempts": max_attempts}
        if dedup_key is not None or self._turn is None:
            shard = self._home if dedup_key is None else self.placement.for_key(self.queue, dedup_key)
            try:
                return self._on(shard).put(payload, dedup_key=dedup_key, conn=conn, **options)
            except errors.DatabaseError as e:
                if self._turn is None:
                    raise
                raise type(e)(f"{e} (shard {shard}: a job with a dedup key goes to its key's shard only)") from None
        self._refuse_caller(conn)
        return self.put_rows(self._on(self._home).rows([payload], **options))[0]

    def put_many(self, payloads: Iterable[Any], *, priority: int = 0, delay: float = 0,
                 run_at: dt.datetime | None = None, max_attempts: int | None = None,
                 conn: Any = None) -> list[int]:
        """On a spread queue the jobs are dealt round-robin over the shards, each shard's share
        one transaction there; the ids come back in the order of `payloads`."""
        options = {"priority": priority, "delay": delay, "run_at": run_at, "max_attempts": max_attempts}
        if self._turn is None:
            return self._on(self._home).put_many(payloads, conn=conn, **options)
        self._refuse_caller(conn)
        rows = self._on(self._home).rows(payloads, **options)  # every payload checked before any is put
        return self.put_rows(rows) if rows else []

    def line_row(self, payload: Any, priority: int, delay: float, run_at: dt.datetime | None) -> tuple:
        """As Producer.line_row, sized against the home shard (the shards of one deployment share
        their settings), or for a spread queue, the first shard that answers."""
        names = [self._home] + ([n for n in self.placement.names if n != self._home] if self._turn else [])
        for name in names:
            if self._is_down(name) and name != names[-1]:
                continue
            try:
                return self._on(name).line_row(payload, priority, delay, run_at)
            except errors.DatabaseError as e:
                if self._turn is None or name == names[-1]:
                    raise
                self._shard_down(name, e)
        raise AssertionError("unreachable")

    def put_rows(self, rows: list[tuple]) -> list[int]:
        if self._turn is None:
            return self._on(self._home).put_rows(rows)
        with self._mutex:
            return self._deal(rows)

    def result(self, job_id: int, *, wait: float = 0.0, shard: str | None = None) -> Any:
        """Producer.result on the queue's shard (ids are per shard: a spread queue's job names its
        shard)."""
        return self._on(self._result_shard(shard)).result(job_id, wait=wait)

    @property
    def retry(self) -> dict[str, Any]:
        """How a pinned queue's sessions retry an unreachable server (result() waits too)."""
        return one_server.session_retry(self.config, self._retry_s)

    def result_dsn(self, shard: str | None = None) -> DSN:
        """Producer.result_dsn: the server of the shard that holds the job (from the config,
        without the producer's lock: AsyncProducer asks on the event loop)."""
        return self.config.shards[self._result_shard(shard)]

    def _result_shard(self, shard: str | None) -> str:
        if shard is None and self._turn is not None:
            raise errors.InputError(f"queue {self.queue} is spread over shards: give shard= (ids are per shard)")
        if shard is not None and shard not in self.config.shards:
            raise errors.InputError(f"shard={values.shown(shard)}: [shards] names {', '.join(sorted(self.config.shards))}")
        return shard or self._home

    def close(self) -> None:
        with self._mutex:
            producers, self._producers = list(self._producers.values()), {}
        for producer in producers:
            producer.close()

    def wake(self) -> None:
        """Producer.wake, on the shard of a queue that is not spread (a spread queue takes no
        conn= puts)."""
        if self._turn is None:
            self._on(self._home).wake()

    def transaction(self, conn: Any) -> contextlib.AbstractContextManager[one_server.CallerTransaction]:
        """Producer.transaction, on the shard of a queue that is not spread."""
        self._refuse_caller(conn if self._turn is not None else None)
        return self._on(self._home).transaction(conn)

    def __enter__(self) -> "ShardedProducer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------- placing

    def _refuse_caller(self, conn: Any) -> None:
        if conn is not None:
            raise errors.InputError(f"conn: queue {self.queue} is spread over shards: a caller's transaction "
                                    "is on one server (put it without conn, or pin the queue to a shard)")

    def _on(self, shard: str) -> one_server.Producer:
        with self._mutex:
            return self._producer(shard)

    def _producer(self, shard: str) -> one_server.Producer:
        if shard not in self._producers:
            retry_s = self._retry_s
            if self._turn is not None:
                retry_s = min(SHARD_RETRY_S, self.config.producer.connect_retry_s if retry_s is None else retry_s)
            self._producers[shard] = one_server.Producer(self.queue, self.config.on_shard(shard),
                                                         ring=self._ring, retry_s=retry_s)
        return self._producers[shard]

    def _deal(self, rows: list[tuple]) -> list[int]:
        """A spread queue's rows in turn over the shards that are up, under self._mutex. A
        shard's share that fails with DatabaseError was not stored (Session.run: a COMMIT whose
        outcome is unknown raises OutcomeUnknown instead, and is never moved): it is dealt again
        over the others, and that shard left out until SHARD_RECHECK_S. Only when no shard
        takes it does the put fail."""
        assert self._turn is not None
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
                    got = self._producer(name).put_rows([rows[i] for i in mine])
                except errors.DatabaseError as e:
                    self._shard_down_locked(name, e)
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

    def _is_down(self, name: str) -> bool:
        with self._mutex:
            return self._down.get(name, 0.0) > time.monotonic()

    def _shard_down(self, name: str, exc: errors.DatabaseError) -> None:
        with self._mutex:
            self._shard_down_locked(name, exc)

    def _shard_down_locked(self, name: str, exc: errors.DatabaseError) -> None:
        if name not in self._down:
            log.warning("shard unreachable, jobs of queue %s go to the other shards (tried again every "
                        "%g s) shard=%s error=%s", self.queue, SHARD_RECHECK_S, name, exc)
        self._down[name] = time.monotonic() + SHARD_RECHECK_S
        producer = self._producers.pop(name, None)
        if producer is not None:
            producer.drop()  # a fresh one, with fresh connections, when it is tried again


def require_schema(config: Config, queue: str, *, oneshot: bool) -> None:
    """Before producing: the schema of every shard that takes `queue`'s jobs (one server: the
    one). A spread queue's producer deals around a shard that is down (ShardedProducer), so here
    such a shard is tried briefly and passed over with a warning, while one shard at least
    answers. `oneshot`: for a command that puts its arguments and exits."""
    retry_s = config.connect_retry(oneshot=oneshot)
    placement = Placement(config)
    spread = placement.spread(queue)
    if spread:
        retry_s = min(retry_s, SHARD_RETRY_S)
    down: list[errors.DatabaseError] = []
    for shard in placement.shards_of(queue):
        dsn = config.on_shard(shard).dsn
        session = (oneshot_session(dsn, retry_s, "startup") if oneshot or spread
                   else Session(dsn, retry_s=retry_s, name="startup"))
        try:
            schema.require_current(session)
        except errors.DatabaseError as e:
            if not spread:
                raise
            log.warning("shard unreachable, jobs of queue %s go to the other shards shard=%s error=%s",
                        queue, shard, e)
            down.append(e)
        finally:
            session.close()
    if down and len(down) == len(placement.shards_of(queue)):
        raise down[-1]
