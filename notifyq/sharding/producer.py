"""notifyq.Producer: one-server producers (notifyq/produce/producer.py) composed. Without
[shards], or for a queue pinned to one shard, it hands every call to that server's producer;
for a queue spread over [shards], it places each job among the shards' producers.

A queue that is not spread lives on one shard: its jobs go to that shard's producer. A spread
queue's jobs with a key (`key=`) go to the shard their key hashes to, so that a key's limits
are counted on one server; those with a dedup key and no key, to the shard their dedup key
hashes to (uniqueness holds per key); the others are dealt round-robin over the shards that are
up, each shard's share one transaction there (atomic per shard, not across shards).
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


class Producer:
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
        retry_setting: the setting `retry_s` comes from, which that error names (`notifyq
            produce` passes `connect_retry_s`); None: none is named for a `retry_s` given.

    With `[shards]` in the config, the producer places each job on its queue's shard, with the
    same methods.
    """

    # What it composes: the one-server producer of a queue that lives on one server (the only
    # one, or its shard), made here and kept; a spread queue's, one per shard, made on first use
    # and dropped while their shard is down. Calls take turns on the latter (self._mutex); the
    # one-server producer is itself safe to share between threads.

    def __init__(self, queue: str, config: Config, *, ring: bool = False, retry_s: float | None = None,
                 retry_setting: str | None = None):
        if not isinstance(config, Config):
            raise errors.InputError(f"config: expected notifyq.config.load()'s Config, got {values.shown(config)}")
        self.queue = validate_queue_name(queue)
        self.config = config
        self._retry_s = None if retry_s is None else values.seconds("retry_s", retry_s, positive=False)
        self._retry_setting = retry_setting
        self.placement = Placement(config)
        self._home = self.placement.home(queue)
        self._turn = RoundRobin(self.placement.names) if self.placement.spread(queue) else None
        self._ring = ring
        # A pinned queue's one producer, or None for a spread queue (self._producers).
        self._pinned = None if self._turn is not None else self._new_producer(self._home)
        self._producers: dict[str, one_server.Producer] = {}  # spread: shard -> its producer
        self._down: dict[str, float] = {}  # spread: shard -> when to try it again (monotonic)
        self._mutex = threading.Lock()

    # -------------------------------------------------------- the API

    def put(self, payload: Any, *, priority: int = 0, delay: float = 0, run_at: dt.datetime | None = None,
            max_attempts: int | None = None, dedup_key: str | None = None, key: str | None = None,
            dedup: str = "keep", conn: Any = None, min_version: int | None = None,
            after: Iterable[int] | None = None, run_anyway: bool = False) -> int:
        """Put one job on the queue and return its id.

        Args:
            payload: anything `json.dumps` takes; the handler gets it back as `job.payload`.
            priority: higher runs first (-32768 to 32767); equal priorities run oldest first.
            delay: seconds before the job may run.
            run_at: when the job may run (an aware datetime; a naive one is UTC), instead of `delay`.
            max_attempts: runs before the job is dead (None: the queue's `max_attempts`, 5).
            dedup_key: while a job holding this key on this queue is pending (ready, scheduled
                or claimed), this put stores nothing and returns that job's id (`dedup`
                says otherwise).
            dedup: what a put does when a pending job holds its `dedup_key`: `"keep"` (the
                default: that job stays, the oldest wins) or `"replace"` (debounce: the newest
                wins; a ready or scheduled job holding the key is deleted and this one put in
                its place, with its own payload, run_at and priority, and a new id; a job
                already claimed runs as it is, and this one waits as a new pending job).
            key: the key the queue's flow limits count the job under (`limit_per_key`,
                `rate_per_key`, `fair`): a customer, a tenant, an API account; 1 to 191
                characters. The handler reads it as `job.key`. On a queue spread over shards
                the job goes to its key's shard: a key's jobs all live on one.
            conn: your own connection (MySQLdb, a SQLAlchemy Session or Connection, Django's
                `connection`) to the same database: the job is part of your transaction, stored
                when you commit and gone if you roll back. Call `wake()` after your COMMIT, or
                use `transaction()`, so that an idle consumer starts it at once.
            min_version: the lowest consumer code version (`consumer.version`, `consume
                --version`) that may run the job, a whole number (rolling deploys: a job that
                needs new code is never claimed by an old consumer). None: any consumer. Not
                with `dedup_key`. On a spread queue the job goes to the home shard.
            after: ids of jobs (on any queue of this server) the job waits for: it runs once
                every one is done (docs: workflows.md), and ends cancelled if one ends dead or
                cancelled, unless `run_anyway`, when it runs once every one has ended.
            run_anyway: with `after`: run once the parents ended, whatever their outcome.

        Raises:
            notifyq.errors.InputError: a bad argument, or a payload that is not JSON or too big;
                nothing was written.
            notifyq.errors.DatabaseError: the server stayed unreachable for `retry_s`.
            notifyq.errors.OutcomeUnknown: the connection died during the COMMIT.
        """
        if after is not None:
            return self._workflow_producer().put(payload, priority=priority, delay=delay, run_at=run_at,
                                                 max_attempts=max_attempts, dedup_key=dedup_key, key=key,
                                                 dedup=dedup, conn=conn, min_version=min_version, after=after,
                                                 run_anyway=run_anyway)
        if self._pinned is not None:
            return self._pinned.put(payload, priority=priority, delay=delay, run_at=run_at, max_attempts=max_attempts,
                                    dedup_key=dedup_key, key=key, dedup=dedup, conn=conn, min_version=min_version)
        options = {"priority": priority, "delay": delay, "run_at": run_at, "max_attempts": max_attempts}
        if key is not None or dedup_key is not None:
            shard, which = self._keyed_shard(key, dedup_key)
            try:
                return self._on(shard).put(payload, dedup_key=dedup_key, key=key, dedup=dedup, conn=conn,
                                           min_version=min_version, **options)
            except errors.DatabaseError as e:
                raise type(e)(f"{e} (shard {shard}: a job with a {which} goes to its key's shard only)") from None
        self._refuse_caller(conn)
        one_server.replaces(dedup, dedup_key)  # no dedup key: "replace" is refused, "keep" is no-op
        if min_version is not None:  # not dealt: on the home shard
            return self._on(self._home).put(payload, min_version=min_version, **options)
        return self.put_rows(self._on(self._home).rows([payload], **options))[0]

    def put_many(self, payloads: Iterable[Any], *, priority: int = 0, delay: float = 0,
                 run_at: dt.datetime | None = None, max_attempts: int | None = None,
                 key: str | None = None, conn: Any = None, min_version: int | None = None,
                 after: Iterable[int] | None = None, run_anyway: bool = False) -> list[int]:
        """Put many jobs in one transaction (all or none) and return their ids, in the order of
        `payloads`. The arguments are put()'s, the same for every job (one `key` for them all);
        the rows go as multi-row INSERTs of up to `producer.chunk_size` rows, each within the
        server's `max_allowed_packet`. On a queue spread over shards the jobs are dealt
        round-robin over the shards, each shard's share one transaction there; jobs with a
        `key` all go to the key's shard, in one transaction."""
        options = {"priority": priority, "delay": delay, "run_at": run_at, "max_attempts": max_attempts}
        if after is not None:
            return self._workflow_producer().put_many(payloads, key=key, conn=conn, min_version=min_version,
                                                      after=after, run_anyway=run_anyway, **options)
        if self._pinned is not None:
            return self._pinned.put_many(payloads, conn=conn, key=key, min_version=min_version, **options)
        if key is not None:
            shard, _which = self._keyed_shard(key, None)
            try:
                return self._on(shard).put_many(payloads, key=key, conn=conn, min_version=min_version, **options)
            except errors.DatabaseError as e:
                raise type(e)(f"{e} (shard {shard}: jobs with a key go to its shard only)") from None
        self._refuse_caller(conn)
        if min_version is not None:  # not dealt: one transaction on the home shard
            return self._on(self._home).put_many(payloads, min_version=min_version, **options)
        rows = self._on(self._home).rows(payloads, **options)  # every payload checked before any is put
        return self.put_rows(rows) if rows else []

    def put_workflow(self, workflow: Any, *, conn: Any = None) -> list[int]:
        """Put a `notifyq.Workflow`'s jobs and the edges between them in one transaction (all or
        none) and return their ids, in the order the jobs were added (each of its refs gets its
        `id` too). Every queue of a workflow lives on this producer's server: a workflow lives on
        one shard, and a queue spread over shards takes none.

        Raises:
            notifyq.errors.InputError: a cycle, a parent id that names no job, too many edges,
                a bad argument of a job; nothing was written.
        """
        producer = self._workflow_producer()
        for queue in workflow.queues():
            if self.config.shards and (self.placement.spread(queue) or self.placement.home(queue) != self._home):
                raise errors.InputError(f"queue {queue} is not on shard {self._home}, this producer's: a workflow "
                                        "lives on one shard")
        return producer.put_workflow(workflow, conn=conn)

    def progress(self, job_id: int) -> dict[str, int]:
        """A job's parents counted (a batch callback's: the batch's) as they are now:
        `{"done": n, "failed": n, "pending": n, "awaited": n}` (awaited: the pending it still
        waits for; workflows.progress)."""
        return self._workflow_producer().progress(job_id)

    def parent_results(self, job_id: int) -> dict[int, Any]:
        """The results of job `job_id`'s parents, by parent id (None: not done, or the parent's
        queue keeps no results): what a child or a batch callback reads."""
        return self._workflow_producer().parent_results(job_id)

    def _workflow_producer(self) -> one_server.Producer:
        if self._pinned is None:
            raise errors.InputError(f"queue {self.queue} is spread over shards: a workflow lives on one "
                                    "server (pin its queues to a shard)")
        return self._pinned

    def line_row(self, payload: Any, priority: int, delay: float, run_at: dt.datetime | None,
                 key: str | None = None) -> tuple:
        """A job of `notifyq produce`'s stream, as the one-server Producer.line_row: sized against
        the queue's server, or for a spread queue, its key's shard, or without a key the first
        shard that answers (the shards of one deployment share their settings)."""
        if self._pinned is not None:
            return self._pinned.line_row(payload, priority, delay, run_at, key)
        if key is not None:
            return self._on(self._keyed_shard(key, None)[0]).line_row(payload, priority, delay, run_at, key)
        names = [self._home] + [n for n in self.placement.names if n != self._home]
        for name in names:
            if self._is_down(name) and name != names[-1]:
                continue
            try:
                return self._on(name).line_row(payload, priority, delay, run_at)
            except errors.DatabaseError as e:
                if name == names[-1]:
                    raise
                self._shard_down(name, e)
        raise AssertionError("unreachable")

    def put_rows(self, rows: list[tuple]) -> list[int]:
        """line_row()'s rows, in one transaction (a spread queue's: dealt over its shards, but
        a row with a key goes to its key's shard, one transaction per shard)."""
        if self._pinned is not None:
            return self._pinned.put_rows(rows)
        keyed: dict[str, list[int]] = {}  # shard -> the indexes of its keyed rows
        for i, row in enumerate(rows):
            if row[one_server.KEY_COLUMN] is not None:
                keyed.setdefault(self._keyed_shard(row[one_server.KEY_COLUMN], None)[0], []).append(i)
        with self._mutex:
            if not keyed:
                return self._deal(rows)
            ids = [0] * len(rows)
            for shard, mine in keyed.items():
                try:
                    got = self._producer(shard).put_rows([rows[i] for i in mine])
                except errors.DatabaseError as e:
                    raise type(e)(f"{e} (shard {shard}: jobs with a key go to its shard only)") from None
                for i, job_id in zip(mine, got):
                    ids[i] = job_id
            rest = [i for i, row in enumerate(rows) if row[one_server.KEY_COLUMN] is None]
            for i, job_id in zip(rest, self._deal([rows[i] for i in rest]) if rest else []):
                ids[i] = job_id
            return ids

    def result(self, job_id: int, *, wait: float = 0.0, shard: str | None = None) -> Any:
        """The return value of job `job_id`'s handler, once the job is done.

        Results are kept only on a queue with `result_ttl_s` > 0 (see "Results" in the
        exactly-once page); the value is what the handler returned, through JSON.

        Args:
            job_id: an id a put returned.
            wait: seconds to wait for the job to finish (0: look once).
            shard: with [shards], the shard a spread queue's job is on (job ids are per shard).

        Raises:
            notifyq.errors.ResultPending: not done yet when the wait ended.
            notifyq.errors.JobFailed: the job ended dead; `str()` is its last error.
            notifyq.errors.InputError: cancelled, purged, or never existed.
        """
        return self._on(self._result_shard(shard)).result(job_id, wait=wait)

    def consume_rate(self, n: int = 1, *, key: str | None = None, wait: float | None = 30.0) -> bool:
        """Spend n starts of the queue's `rate` (and the key's `rate_per_key`) for work done
        outside a job, from the budget its jobs' starts spend: True once spent; False if the
        rates did not allow it within `wait` seconds (then nothing is spent).

        Blocks until the budget has room, at most `wait` (None: as long as it takes; 0: look
        once and do not wait). Waits are timed to the refill the budget's log says, not polled.
        A queue without rates always allows it.

            if producer.consume_rate(key="customer-42", wait=5):
                call_the_api()

        Args:
            n: starts to spend at once (1 to the rate's N: more could never be granted).
            key: the key whose `rate_per_key` budget to spend too (None: only the queue's `rate`).
            wait: seconds to wait for room, at most.

        Raises:
            notifyq.errors.InputError: a bad n, key or wait, or a queue spread over [shards]
                (each shard keeps its own budgets).
        """
        if self._turn is not None:
            raise errors.InputError(f"queue {self.queue} is spread over shards: each shard has its own rate budgets, "
                                    f"so consume_rate needs a queue on one shard")
        return self._on(self._home).consume_rate(n, key=key, wait=wait)

    @property
    def retry(self) -> dict[str, Any]:
        """How a pinned queue's sessions retry an unreachable server (result() waits too)."""
        return one_server.session_retry(self.config, self._retry_s, self._retry_setting)

    def sessions(self) -> list[tuple[str, Any]]:
        """The sessions its puts wait on, open now (one_server.Producer.sessions), each shard's."""
        with self._mutex:
            spread = list(self._producers.values())
        return [s for p in ([self._pinned] if self._pinned is not None else []) + spread for s in p.sessions()]

    def result_dsn(self, shard: str | None = None) -> DSN:
        """Where result() reads: the server of the shard that holds the job (from the config,
        without the producer's lock: AsyncProducer asks on the event loop)."""
        return self.config.on_shard(self._result_shard(shard)).dsn

    def _result_shard(self, shard: str | None) -> str:
        if not self.config.shards:
            if shard is not None:
                raise errors.InputError(f"shard={values.shown(shard)}: no [shards] configured")
            return self._home
        if shard is None and self._turn is not None:
            raise errors.InputError(f"queue {self.queue} is spread over shards: give shard= (ids are per shard)")
        if shard is not None and shard not in self.config.shards:
            raise errors.InputError(f"shard={values.shown(shard)}: [shards] names {', '.join(sorted(self.config.shards))}")
        return shard or self._home

    def reload(self, config: Config) -> None:
        """Take the settings a put reads from `config`, whose servers are this producer's
        (`notifyq produce`'s reload): here, and in each shard's producer."""
        self.config = config
        with self._mutex:
            producers = dict(self._producers)
        if self._pinned is not None:
            producers[self._home] = self._pinned
        for shard, producer in producers.items():
            producer.reload(config.on_shard(shard))

    def close(self) -> None:
        """Close the producer's database sessions, after any put under way; a later put opens
        new ones. `with notifyq.Producer(...) as producer:` closes it at the end of the block."""
        with self._mutex:
            producers, self._producers = list(self._producers.values()), {}
        for producer in producers + ([self._pinned] if self._pinned is not None else []):
            producer.close()

    def drop(self) -> None:
        """Close the connections without a word to the server (one_server.Producer.drop): after
        a put found it gone, a close would wait for replies that are not coming."""
        with self._mutex:
            producers, self._producers = list(self._producers.values()), {}
        for producer in producers + ([self._pinned] if self._pinned is not None else []):
            producer.drop()

    def wake(self, instant: bool | None = None) -> None:
        """Wake an idle consumer of the queue now, for jobs put on your own connection (`conn=`),
        and one of each other queue a `put_workflow(conn=)` made jobs ready on: call it after
        your COMMIT, or the consumers find them at their next poll (up to `wakeup.poll_max_s`,
        1 s). contrib.django's enqueue_on_commit calls it on commit.

        Rings as a `ring=True` producer's put does; a producer without the bell interrupts the
        idle consumer's wait instead (the instant wake), unless `instant` is False (None: as
        `wakeup.instant_wake` says). Best effort: it never raises. (A queue spread over shards
        takes no `conn=` puts: nothing to wake.)"""
        if self._pinned is not None:
            self._pinned.wake(instant)

    def leave_wake_to(self, other: "Producer") -> None:
        """The one-server Producer.leave_wake_to, for a queue on one server (`other` is its
        producer too). Not for a spread queue: its puts land on every shard, and `other`'s bells
        only on those it put on, so each producer wakes the consumers of its own puts."""
        if self._pinned is not None:
            self._pinned.leave_wake_to(other)

    def transaction(self, conn: Any) -> contextlib.AbstractContextManager[one_server.CallerTransaction]:
        """The caller's own transaction on `conn` (a MySQLdb connection, a SQLAlchemy Session or
        Connection), with the jobs put in it: committed when the block ends, rolled back if it
        raises, and the queue's idle consumers woken once it committed (wake()), so that they
        start the jobs at once rather than at their next poll. (Django: enqueue_on_commit.)

            with producer.transaction(conn) as tx:
                conn.cursor().execute("UPDATE orders SET state = 'paid' WHERE id = %s", (order,))
                tx.put({"order": order})
        """
        producer = self._pinned
        if producer is None:
            self._refuse_caller(conn)
            producer = self._on(self._home)
        return producer.transaction(conn)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------- placing

    def _keyed_shard(self, key: Any, dedup_key: Any) -> tuple[str, str]:
        """A spread queue's shard for a job with a key (its key decides: a key's limits are
        counted on one server), else with a dedup key; and which of the two decided."""
        if key is not None:
            return self.placement.for_key(self.queue, values.job_key("key", key)), "key"
        return self.placement.for_key(self.queue, values.job_key("dedup_key", dedup_key)), "dedup key"

    def _refuse_caller(self, conn: Any) -> None:
        if conn is not None:
            raise errors.InputError(f"conn: queue {self.queue} is spread over shards: a caller's transaction "
                                    "is on one server (put it without conn, or pin the queue to a shard)")

    def _on(self, shard: str) -> one_server.Producer:
        if self._pinned is not None and shard == self._home:
            return self._pinned
        with self._mutex:
            return self._producer(shard)

    def _producer(self, shard: str) -> one_server.Producer:
        if shard not in self._producers:
            self._producers[shard] = self._new_producer(shard)
        return self._producers[shard]

    def _new_producer(self, shard: str) -> one_server.Producer:
        retry_s, setting = self._retry_s, self._retry_setting
        if self._turn is not None:
            retry_s = min(SHARD_RETRY_S, self.config.producer.connect_retry_s if retry_s is None else retry_s)
            setting = None  # the dealer's own budget
        return one_server.Producer(self.queue, self.config.on_shard(shard), ring=self._ring, retry_s=retry_s,
                                   retry_setting=setting)

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
    one). A spread queue's producer deals around a shard that is down (Producer._deal), so here
    such a shard is tried briefly and passed over with a warning, while one shard at least
    answers. `oneshot`: for a command that puts its arguments and exits."""
    retry_s = config.connect_retry(oneshot=oneshot)
    setting: str | None = "connect_retry_s"
    placement = Placement(config)
    spread = placement.spread(queue)
    if spread and retry_s > SHARD_RETRY_S:
        retry_s, setting = SHARD_RETRY_S, None
    down: list[errors.DatabaseError] = []
    for shard in placement.shards_of(queue):
        dsn = config.on_shard(shard).dsn
        session = (oneshot_session(dsn, retry_s, "startup", setting) if oneshot or spread
                   else Session(dsn, retry_s=retry_s, name="startup", retry_setting=setting))
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
