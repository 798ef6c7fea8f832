"""Periodic jobs from cron expressions, enqueued once per tick across every consumer host;
and retention of kept done/dead jobs.

ConsumerService calls `Scheduler.tick()` on every turn of its main loop. For each queue it
serves that has periodic entries, the scheduler tries for the queue's leader lock
(QueueLocks.periodic) on its own autocommit session; the one holder enqueues that queue's
ticks. Everyone else tries again every `leader_retry_s`, so when a leader's session dies
another host takes over within seconds. Queues without entries cost no lock and no session.

The lock only keeps the work in one place. Exactly-once comes from the database: a tick's
job is inserted in the same transaction as `UPDATE nq_periodic SET last_tick = T WHERE
last_tick < T`, so even two schedulers that both believe they lead (a failover overlap, a
paused process waking up) cannot enqueue the same tick twice.

Rules (times are the database server's clock, cron expressions are evaluated in UTC):
- First sight: a new entry's most recent tick is recorded as its baseline without a job. The
  first job is the next tick.
- Catch-up: after downtime, only the most recent missed tick is enqueued; older missed ticks
  are skipped and counted (log line and metric), never replayed as a flood.
- Retention: every consumer process, about every `retention_every_s` (5 min, the first pass
  at a random point of the first period so a fleet restarted together does not purge in
  step), deletes its queues' done and dead jobs that finished more than `retention_s` ago
  (retention_s <= 0 keeps them forever), and the attempt records as old. With
  retention_s <= 0 the records of jobs still there stay with them; those of jobs gone (done
  without keep_done, cancelled, purged) go after GONE_RECORDS_KEEP_S, or result_ttl_s if
  longer (purge_gone_attempts). No leader is needed: a purge is chunked and
  idempotent, and two overlapping passes only repeat a cheap read. At most RETENTION_CHUNKS
  chunks per loop turn, so the watchdog keeps being fed; the session is closed after a pass
  when no periodic entry needs it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import random
import time
from typing import TYPE_CHECKING, Any

from notifyq import errors
from notifyq.config import Config, QueueConfig, periodic_entries
from notifyq.jobs import Status
from notifyq.ops import admin
from notifyq.store import admin_queries, advisory, dedup, key_sweep
from notifyq.store.db import Session
from notifyq.store.driver import DriverError, locks_unavailable
from notifyq.store.locks import QueueLocks

if TYPE_CHECKING:
    from notifyq.produce.producer import Producer
    from croniter import croniter

log = logging.getLogger("notifyq.periodic")

UTC = dt.timezone.utc
RETENTION_CHUNKS = 5  # purge chunks per loop turn; a bigger backlog continues next turn
# With retention_s <= 0: how long the attempt records of a job that is gone are kept (as long
# as retention_s's default keeps them), so that `jobs show` can still say what became of it.
GONE_RECORDS_KEEP_S = 7 * 86400.0
ERROR_BACKOFF_S = 5.0
MAX_COUNTED_MISSES = 10_000  # counting missed ticks stops here (a per-second cron down for days)


@dataclasses.dataclass
class Entry:
    """One [[periodic]] job: what to enqueue on which queue, and when next."""

    queue: str
    name: str
    cron: str
    payload: dict[str, Any]
    priority: int
    next_due: float | None = None  # server time (epoch s) of the next tick; None: check now


@dataclasses.dataclass
class QueueState:
    """One queue's scheduler state in this process: leadership, next tries, counts."""

    leader: bool = False
    generation: int = -1  # the lock session's connection the lock was taken on
    next_try: float = 0.0  # monotonic: when a non-leader asks for the lock again
    next_retention: float | None = None  # monotonic
    enqueued: int = 0
    skipped: int = 0
    purged: int = 0
    dedup_after: str = ""  # where the next sweep of ended jobs' dedup keys starts
    flow_keys_after: str = ""  # where the next sweep of unused flow keys starts (store/key_sweep.py)
    rate_keys_after: str = ""  # and of idle keys' rate logs
    # With retention_s <= 0: the last attempt record retention passed (purge_gone_attempts)
    records_after: tuple[dt.datetime, int] = admin_queries.GONE_ATTEMPTS_START


def _croniter(cron: str, start: dt.datetime) -> croniter:
    # Imported here: croniter (and dateutil) cost ~20 ms, and most consumers have no periodic entries.
    from croniter import croniter

    return croniter(cron, start)


def latest_tick(cron: str, now: dt.datetime) -> dt.datetime:
    """The most recent tick at or before `now` (aware UTC in, aware UTC out)."""
    prev = _croniter(cron, now).get_prev(dt.datetime)
    following = _croniter(cron, prev).get_next(dt.datetime)
    return following if following <= now else prev  # croniter's get_prev excludes `now` itself


def missed_between(cron: str, last: dt.datetime, tick: dt.datetime) -> int:
    """Ticks strictly between `last` and `tick`: what the catch-up rule skipped."""
    it, n = _croniter(cron, last), 0
    while n < MAX_COUNTED_MISSES and it.get_next(dt.datetime) < tick:
        n += 1
    return n


def _entries(config: Config, queues: tuple[str, ...]) -> list[Entry]:
    """The queues' entries, checked as the config's load checks them (also a Config built in
    code): a broken one is a ConfigError."""
    return [Entry(queue, e["name"], e["cron"], e["payload"], e.get("priority", 0))
            for queue in queues
            for e in periodic_entries(queue, config.periodic.get(queue, ()), config.producer.max_payload_bytes)]


def purge_finished(session: Session, queue: str, keep_s: float, chunk: int = admin.CHUNK,
                   max_chunks: int = RETENTION_CHUNKS, attempts_keep_s: float | None = None) -> tuple[int, bool]:
    """Delete `queue`'s done and dead jobs that finished more than keep_s ago: (deleted, complete).

    Each chunk is a range of ix_state holding only rows to delete (retention_ids), so a pass
    costs what it deletes, however much history is kept. complete=False: more next turn.
    Then the queue's attempt records older than attempts_keep_s (else keep_s): a result is
    readable at least its result_ttl_s.
    """
    deleted = chunks = 0
    for status in (Status.DONE, Status.DEAD, Status.CANCELLED):
        while True:
            if chunks >= max_chunks:
                return deleted, False
            ids = admin_queries.retention_ids(session, queue, status, keep_s, chunk)
            n = admin_queries.purge_jobs(session, ids, status)
            deleted, chunks = deleted + n, chunks + 1
            if len(ids) < chunk or n == 0:  # the range is empty, or all retried meanwhile
                break
    while True:  # the attempt records (nq_attempt) of the same age, done jobs' and deleted ones' alike
        if chunks >= max_chunks:
            return deleted, False
        chunks += 1
        if admin_queries.purge_old_attempts(session, queue, attempts_keep_s or keep_s, chunk) == 0:
            break
    return deleted, True


def purge_gone_attempts(session: Session, queue: str, keep_s: float, after: tuple[dt.datetime, int],
                        chunk: int = admin.CHUNK, max_chunks: int = RETENTION_CHUNKS
                        ) -> tuple[int, bool, tuple[dt.datetime, int]]:
    """Retention where finished jobs are kept for ever (retention_s <= 0): delete `queue`'s
    attempt records older than keep_s of jobs that are gone: (deleted, complete, where the next
    pass starts). The records are read once each, in ix_ended's order from `after`: those of
    jobs still there are not read again at every pass."""
    deleted = 0
    for _ in range(max_chunks):
        after, n, last = admin_queries.purge_gone_attempts(session, queue, keep_s, after, chunk)
        deleted += n
        if last:
            return deleted, True, after
    return deleted, False, after


class Scheduler:
    def __init__(self, config: Config, queues: tuple[str, ...], *, leader_retry_s: float = 5.0,
                 retention_every_s: float = 300.0, retention_first_s: float | None = None):
        self.queues = tuple(queues)
        self.leader_retry_s = leader_retry_s
        self.retention_every_s = retention_every_s
        first = retention_first_s
        if first is None:
            first = retention_every_s * random.uniform(0.5, 1.0)
        self._first_retention = time.monotonic() + first
        self.state = {q: QueueState() for q in self.queues}
        self._lock: Session | None = None
        self._work: Session | None = None
        self._producers: dict[str, "Producer"] = {}
        self._offset_s = 0.0  # server clock minus ours, refreshed on every server read
        self._pause_until = 0.0
        self._use_locks = config.wakeup.use_locks
        self._next_keepalive = 0.0  # monotonic: when a leader's lock session is pinged next
        self.reload(config)

    def reload(self, config: Config) -> None:
        """New entries start from their baseline; known ones keep their schedule. A bad new
        entry fails the constructor (startup) but only logs on SIGHUP: the old ones stay."""
        old = {(e.queue, e.name, e.cron): e for e in getattr(self, "entries", [])}
        try:
            entries = _entries(config, self.queues)
        except errors.ConfigError as e:
            if not old and not hasattr(self, "config"):
                raise
            log.error("reload: keeping the old periodic entries error=%s", e)
            return
        self.config = config
        self.entries = entries
        for entry in self.entries:
            if (entry.queue, entry.name, entry.cron) in old:
                entry.next_due = old[(entry.queue, entry.name, entry.cron)].next_due
        for producer in self._producers.values():
            producer.close()
        self._producers = {}

    def _scheduled(self, queue: str) -> bool:
        return any(e.queue == queue for e in self.entries)

    # -------------------------------------------------------- the loop turn

    def tick(self) -> None:
        """One pass; never raises (a database outage backs off and is retried)."""
        if time.monotonic() < self._pause_until:
            return
        try:
            self._keep_lead_alive()
            for queue in self.queues:
                if self._scheduled(queue):
                    self._tick_queue(queue, self.state[queue])
                self._maybe_retain(queue, self.state[queue])
            if not self.entries and self._work is not None and all(
                    (s.next_retention or 0) > time.monotonic() for s in self.state.values()):
                self._work.close()  # retention only: no connection kept between passes
                self._work = None
        except Exception as e:
            log.warning("periodic scheduler: will retry error=%s", e,
                        exc_info=not isinstance(e, (errors.NotifyqError, DriverError)))
            self._pause_until = time.monotonic() + ERROR_BACKOFF_S
            for state in self.state.values():
                state.leader = False  # prove it again after the outage

    def _keep_lead_alive(self) -> None:
        """A leader's lock session has a short server idle timeout (a leader whose host vanished
        loses the lock within consumer.session_idle_s, not the server's 8 h wait_timeout): ping
        it well inside that while the ticks are far apart. A ping that had to reconnect shows
        in the session's generation: _tick_queue then proves the lead again."""
        now = time.monotonic()
        if self._lock is None or now < self._next_keepalive or not any(s.leader for s in self.state.values()):
            return
        self._next_keepalive = now + self._lock.idle_timeout_s / 4  # as opened: a reload cannot change it
        advisory.keep_alive(self._lock)

    def _tick_queue(self, queue: str, state: QueueState) -> None:
        now = time.monotonic()
        if state.leader and self._lock_session().generation != state.generation:
            state.leader = False  # reconnected: the lock died with the old connection
        if not state.leader:
            if now < state.next_try or not self._take_lead(queue, state):
                return
        clock = self._server_clock()
        due = [e for e in self.entries if e.queue == queue and (e.next_due is None or clock >= e.next_due)]
        if not due or not self._still_leader(queue, state):
            return
        server_now = self._server_now()
        for entry in due:
            self._fire(entry, server_now, state)

    def _take_lead(self, queue: str, state: QueueState) -> bool:
        state.next_try = time.monotonic() + self.leader_retry_s
        session = self._lock_session()
        if self._use_locks:
            try:
                if advisory.get_lock(session, QueueLocks(self.config.dsn.database, queue).periodic, 0) != 1:
                    return False
            except DriverError as e:
                if not locks_unavailable(e):
                    raise
                log.warning("advisory locks unavailable: every consumer schedules periodic jobs; "
                            "the nq_periodic guard still enqueues each tick once")
                self._use_locks = False
        state.leader, state.generation = True, session.generation
        for entry in self.entries:
            if entry.queue == queue:
                entry.next_due = None  # catch up at once
        log.info("periodic leader queue=%s", queue)
        return True

    def _still_leader(self, queue: str, state: QueueState) -> bool:
        """Before acting: is the lock still ours? (A silently dropped session lost it.)"""
        if not self._use_locks:
            return True
        session = self._lock_session()
        holder = advisory.lock_holder(session, QueueLocks(self.config.dsn.database, queue).periodic)
        if holder is not None and holder == session.connection_id and session.generation == state.generation:
            return True
        log.warning("periodic leadership lost queue=%s", queue)
        state.leader = False
        state.next_try = 0.0
        return False

    # -------------------------------------------------------- ticks

    def _server_clock(self) -> float:
        """The server's time as last measured, without asking it (epoch seconds)."""
        return time.time() + self._offset_s

    def _server_now(self) -> dt.datetime:
        now = admin_queries.server_now(self._work_session()).replace(tzinfo=UTC)
        self._offset_s = now.timestamp() - time.time()
        return now

    def _fire(self, entry: Entry, now: dt.datetime, state: QueueState) -> None:
        tick = latest_tick(entry.cron, now)
        naive = tick.replace(tzinfo=None)
        payload = {**entry.payload, "periodic": entry.name, "tick": tick.isoformat()}
        producer = self._producer(entry.queue)
        work = self._work_session()

        def body(cur) -> tuple[int | None, dt.datetime | None]:
            last = admin_queries.periodic_last_tick(cur, entry.queue, entry.name)
            if last is None:
                admin_queries.periodic_start(cur, entry.queue, entry.name, naive)
                return None, None
            if last >= naive or not admin_queries.periodic_advance(cur, entry.queue, entry.name, naive):
                return None, last
            return producer.put(payload, priority=entry.priority, conn=work.conn), last

        # Safe to run again after a lost COMMIT: the guard makes a second run a no-op.
        job_id, last = work.run(body, what=f"periodic {entry.queue}/{entry.name}")
        entry.next_due = _croniter(entry.cron, tick).get_next(dt.datetime).timestamp()
        if job_id is None:
            return
        missed = missed_between(entry.cron, last.replace(tzinfo=UTC), tick) if last else 0
        state.enqueued += 1
        state.skipped += missed
        if missed:
            log.warning("periodic catch-up: enqueued only the latest tick queue=%s name=%s "
                        "tick=%s skipped=%d", entry.queue, entry.name, tick.isoformat(), missed)
        log.info("periodic job enqueued queue=%s name=%s tick=%s job=%d",
                 entry.queue, entry.name, tick.isoformat(), job_id)

    # -------------------------------------------------------- retention

    def _maybe_retain(self, queue: str, state: QueueState) -> None:
        if time.monotonic() < (state.next_retention or self._first_retention):
            return
        _, state.dedup_after = dedup.sweep(self._work_session(), queue, state.dedup_after)
        keep_s = self.config.queue(queue).retention_s
        qc = self.config.queue(queue)
        self._sweep_keys(queue, qc, state)
        if keep_s <= 0:  # finished jobs kept for ever, and their records; not those of jobs gone
            n, complete, state.records_after = purge_gone_attempts(
                self._work_session(), queue, max(GONE_RECORDS_KEEP_S, qc.result_ttl_s), state.records_after)
            state.next_retention = time.monotonic() + (self.retention_every_s if complete else 0.0)
            if n:
                log.info("retention purged the attempt records of jobs gone queue=%s n=%d", queue, n)
            return
        n, complete = purge_finished(self._work_session(), queue, keep_s,
                                     attempts_keep_s=max(keep_s, qc.result_ttl_s))
        state.purged += n
        state.next_retention = time.monotonic() + (self.retention_every_s if complete else 0.0)
        if n:
            log.info("retention purged jobs queue=%s n=%d older_than_s=%g%s", queue, n, keep_s,
                     "" if complete else " (more next turn)")

    def _sweep_keys(self, queue: str, qc: QueueConfig, state: QueueState) -> None:
        """The per-key rows of keys no longer in use (store/key_sweep.py), whatever retention_s
        says: they are bookkeeping, not history."""
        if qc.flow_controlled or qc.rates[1] is not None:
            n, state.flow_keys_after = key_sweep.sweep_flow_keys(self._work_session(), queue, state.flow_keys_after)
            if n:
                log.info("retention swept unused flow keys queue=%s n=%d", queue, n)
        if qc.rates[1] is not None:
            n, state.rate_keys_after = key_sweep.sweep_rate_keys(
                self._work_session(), queue, qc.rates[1].period_s, state.rate_keys_after)
            if n:
                log.info("retention swept idle keys' rate slots queue=%s n=%d", queue, n)

    # -------------------------------------------------------- sessions

    def _lock_session(self) -> Session:
        if self._lock is None:
            self._lock = Session(self.config.dsn, autocommit=True, retry_s=5, name="periodic-lock",
                                 idle_timeout_s=math.ceil(self.config.consumer.session_idle_s))
        return self._lock

    def _work_session(self) -> Session:
        if self._work is None:
            self._work = Session(self.config.dsn, retry_s=5, name="periodic")
        return self._work

    def _producer(self, queue: str) -> "Producer":
        if queue not in self._producers:
            # Imported when a tick is first due: a consumer's start-up does not pay for the
            # producer (and its INSERT machinery) that most consumers never use.
            from notifyq.produce.producer import Producer

            self._producers[queue] = Producer(queue, self.config)
        return self._producers[queue]

    def figures(self) -> dict[str, dict[str, Any]]:
        """For metrics: per queue, leader or not and what was enqueued, skipped and purged."""
        return {q: {"leader": s.leader, "enqueued": s.enqueued, "skipped": s.skipped,
                    "purged": s.purged} for q, s in self.state.items()}

    def close(self) -> None:
        for producer in self._producers.values():
            producer.close()
        for session in (self._lock, self._work):
            if session is not None:
                session.close()  # frees the leader locks at once: a peer takes over
        self._lock = self._work = None
        for state in self.state.values():
            state.leader = False
