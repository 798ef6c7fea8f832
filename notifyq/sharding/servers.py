"""Every server a config names, asked in turn: the answers by shard name, and the ones that are
down with their error line. One server (no [shards]) is the one entry "".

The readers that ask every server the same thing use it: the one-shot commands, the status
pages, a consumer's depth gauges. Each server has one session, used under its own lock, so a
reader shared by threads costs each server one connection.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from notifyq import errors
from notifyq.config import DSN, Config, values
from notifyq.ops import admin, status
from notifyq.sharding.placement import Placement
from notifyq.store import schema
from notifyq.store.db import Session
from notifyq.store.driver import DriverError, describe

log = logging.getLogger("notifyq.sharding")
T = TypeVar("T")
DOWN = (errors.DatabaseError, errors.SchemaError, DriverError)  # a server down, or not ready for us


class Servers:
    """A session per server of `config`, named `name` on the server, made when first used.
    `command`: a one-shot command's (Servers.oneshot)."""

    def __init__(self, config: Config, name: str, retry_s: float, retry_log_level: int = logging.DEBUG,
                 command: bool = False, retry_setting: str | None = None):
        """retry_setting: the setting retry_s comes from, named when a connect gives up."""
        self.config = config
        self.names = config.shard_names()
        self.sharded = bool(config.shards)
        self.command = command
        self._sessions = {shard: (Session(config.on_shard(shard).dsn, retry_s=retry_s, name=name,
                                          retry_log_level=retry_log_level, retry_setting=retry_setting),
                                  threading.Lock())
                          for shard in self.names}

    @classmethod
    def oneshot(cls, config: Config, name: str) -> "Servers":
        """For a command that answers and exits: retries as long as connect_retry says, logged
        at DEBUG only (an unreachable server costs one error line); each server's schema checked
        before it answers; with one server, its error is the command's."""
        return cls(config, name, config.connect_retry(oneshot=True), command=True, retry_setting="connect_retry_s")

    def each(self, work: Callable[[Session], T],
             names: Iterable[str] | None = None) -> tuple[dict[str, T], dict[str, str]]:
        """`work(session)` on every server (or those `names`): (answers, error lines) by name. A
        server down is reported, not raised, so the others still answer."""
        answers: dict[str, T] = {}
        down: dict[str, str] = {}
        for name in self.names if names is None else names:
            try:
                answers[name] = self.one(name, work)
            except DOWN as e:
                if self.command and not self.sharded:
                    raise
                down[name] = describe(e) if isinstance(e, DriverError) else str(e)
        return answers, down

    def one(self, name: str, work: Callable[[Session], T]) -> T:
        """`work(session)` on one server; its errors are the caller's."""
        if name not in self._sessions:
            raise errors.InputError(f"no shard {name!r}")
        session, lock = self._sessions[name]
        with lock:
            if self.command:
                schema.require_current(session)
            return work(session)

    def check(self) -> dict[str, str]:
        """At start: every server reachable, with the current schema. One server down is an
        error; with [shards] the ones down are returned (their error lines), the others serve. A
        wrong schema is an error either way."""
        down = {}
        for name in self.names:
            try:
                self.one(name, schema.require_current)
            except errors.DatabaseError as e:
                if not self.sharded:
                    raise
                down[name] = str(e)
        return down

    def shards_of(self, queue: str) -> tuple[str, ...]:
        """The servers that may hold jobs of `queue` (all of them for a spread queue)."""
        return Placement(self.config).shards_of(queue)

    def pick(self, shard: str | None) -> list[str] | None:
        """The servers `--shard NAME` names: that one, or every one (None)."""
        if shard is None:
            return None
        if shard not in self.config.shards:
            raise errors.InputError(f"--shard {values.shown(shard)}: " + (
                f"[shards] names {', '.join(sorted(self.config.shards))}" if self.sharded
                else "no [shards] configured"))
        return [shard]

    def where(self) -> dict[str, dict[str, Any]]:
        """Per server: where its session is (its identity; on Galera, the writer node)."""
        return {name: {"node": s.node, "galera": s.galera, "database": s.dsn.database}
                for name, (s, _) in self._sessions.items()}

    def close(self) -> None:
        for session, lock in self._sessions.values():
            with lock:
                session.close()

    def __enter__(self) -> "Servers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def dsns(config: Config) -> dict[str, DSN]:
    """Every server's DSN by shard name ("" for one server)."""
    return {name: config.on_shard(name).dsn for name in config.shard_names()}


def jobs_in_one(config: Config, answers: dict[str, list[dict[str, Any]]],
                limit: int) -> tuple[list[dict[str, Any]], str | None]:
    """Every server's jobs (`notifyq jobs list`) in one list, and the column that tells whose:
    one server's as they are; with [shards] each tagged with its shard, oldest first over all."""
    if not config.shards:
        return answers[""], None
    rows = [{**r, "shard": shard} for shard, found in answers.items() for r in found]
    return sorted(rows, key=lambda r: (r["created_at"], r["shard"], r["id"]))[:limit], "shard"


def fail_if_down(down: dict[str, str]) -> None:
    """After the answers are printed: exit 5 naming the shards that did not answer."""
    if down:
        raise errors.DatabaseError("shard(s) down: " + "; ".join(f"{s}: {e}" for s, e in sorted(down.items())))


def holding(servers: Servers, job_id: int, work: Callable[[Session], T], shard: str | None = None) -> T:
    """`work(session)` on the server that holds job `job_id`: ids are per shard, so a job found on
    more than one needs --shard. A shard with the job's row wins over shards that only keep its
    attempt records (a job of that id done there and not kept: `jobs show` shows those). One
    server: the one, its errors raised (no such job too)."""
    if not servers.sharded:
        return servers.each(work)[0][""]

    def found(session: Session) -> str | None:
        try:
            admin.get_job(session, job_id)
        except errors.InputError:
            return "records" if admin.attempts(session, job_id) else None  # else: not on this shard
        return "row"

    answers, down = servers.each(found, servers.pick(shard))
    on = sorted(s for s, a in answers.items() if a == "row") or sorted(s for s, a in answers.items() if a)
    if len(on) > 1:
        raise errors.InputError(f"job {job_id} exists on shards {', '.join(on)}: ids are per shard, give --shard NAME")
    if not on:
        fail_if_down(down)
        raise errors.InputError(f"no job {job_id}")
    return servers.one(on[0], work)


class QueueDepths:
    """A consumer's queue depths for its metrics endpoint (ops/metrics.py): each server asked for
    the queues whose jobs it holds. A server that does not answer is logged and reported down."""

    def __init__(self, config: Config):
        self.servers = Servers(config, "metrics", retry_s=2, retry_log_level=logging.WARNING)

    def __call__(self, shards_of: dict[str, tuple[str, ...]]) -> tuple[dict[str, dict], dict[str, bool]]:
        depth: dict[str, dict] = {}
        for name in self.servers.names:
            mine = [q for q, where in shards_of.items() if name in where]
            try:
                answers, down = self.servers.each(lambda session: status.depths(session, mine), [name])
            except Exception as e:  # a scrape must answer: the counters are there, the depth is not
                answers, down = {}, {name: describe(e) if isinstance(e, DriverError) else repr(e)}
            depth.update(answers)
            for error in down.values():
                log.warning("metrics: cannot read queue depth%s error=%s", f" shard={name}" if name else "", error)
        return depth, {name: name in depth for name in self.servers.names}

    def close(self) -> None:
        self.servers.close()
