"""What a configuration holds: the settings of queues, wake-ups, consumers, producers and logs,
their defaults and the range of every number (loading.py loads them from files, NOTIFYQ_*
variables and flags)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields, replace
from collections.abc import Iterable
from typing import Any

from notifyq import errors
from notifyq.config import values
from notifyq.config.dsn import DSN

DEFAULT_CONFIG_PATH = "/etc/notifyq/notifyq.toml"
DAEMON_CONNECT_RETRY_S = 30.0  # a service outlives a database restart at its start
ONESHOT_CONNECT_RETRY_S = 5.0  # an operator at a prompt wants the answer, not a wait
# A library Producer's put (a web request's): its error well inside a worker's request timeout
# (gunicorn's 30 s), not after it. producer.connect_retry_s.
LIBRARY_CONNECT_RETRY_S = 5.0

validate_queue_name = values.queue_name  # the name every part imports



@dataclass(frozen=True)
class QueueConfig:
    """Settings one queue's consumers run with; `[defaults]` then `[queue.NAME]`."""

    handler: str = ""  # "pkg.module:function"
    command: str = ""  # external command; payload JSON on stdin
    tasks: str = ""  # modules whose @notifyq.task functions run the jobs ("a.tasks b.tasks")
    per_batch: bool = False  # handler gets the whole batch (command: JSON lines)
    command_timeout_s: float = 60.0
    batch_size: int = 100  # at most this many jobs per claim
    # > 0: a claim is sized to run for about this long (by the queue's observed job time), and
    # the jobs of a claim still unstarted this long after it go back to the queue for an idle
    # worker (consume/lineup.py); 0: every claim takes up to batch_size, run in order
    batch_target_s: float = 0.05
    workers: int = 1
    concurrency: int = 1  # a coroutine handler's jobs run at once per worker (per job only)
    max_attempts: int = 5
    retry_base_s: float = 1.0
    retry_max_s: float = 3600.0
    lease_s: float = 300.0  # a claim older than this, not extended, is taken back even from a live consumer
    keep_done: bool = False  # keep finished jobs as status done instead of deleting them
    retention_s: float = 7 * 86400.0  # how long kept done/dead jobs stay before `purge` removes them
    # > 0: keep a handler's return value (JSON) with the job's completion, readable by
    # Producer.result() for at least this long (attempt records then live that long too)
    result_ttl_s: float = 0.0
    # > 0: a Python handler still running after this long fails its job ("timeout") and the
    # worker moves on; its thread cannot be killed and runs on (consume/timeout.py)
    timeout_s: float = 0.0
    shard: str = ""  # with [shards]: the shard that holds this queue ("": by hash of its name)
    spread: bool = False  # with [shards]: jobs go to every shard (round-robin, or by dedup key)
    # "N/PERIOD" ("100/60s"): at most N job starts in any window of PERIOD, the queue's and
    # each key's (store/rates.py); "": none
    rate: str = ""
    rate_per_key: str = ""
    # Flow control (docs/flow-control.md): at most this many running jobs per key (0: no limit),
    # and in the whole queue; a claim takes keys round-robin with fair.
    limit_per_key: int = 0
    limit: int = 0
    fair: bool = False
    # [queue.NAME.key_limits]: per-key overrides of limit_per_key, `"key" = n` or `"pattern*" = n`
    # (an exact key first, then the first pattern that matches, in the order given)
    key_limits: tuple[tuple[str, int], ...] = ()

    @property
    def keeps_results(self) -> bool:
        return self.keep_done or self.result_ttl_s > 0

    @property
    def rates(self) -> tuple[values.Rate | None, values.Rate | None]:
        """(rate, rate_per_key) parsed: checked when the config was loaded."""
        return values.rate("rate", self.rate), values.rate("rate_per_key", self.rate_per_key)

    @property
    def limited(self) -> bool:
        """Some running job counts against a limit: what frees a slot must wake the watcher."""
        return bool(self.limit_per_key or self.limit or self.key_limits)

    @property
    def flow_controlled(self) -> bool:
        """The claim goes through store/flow.py (limits or fairness)."""
        return self.limited or self.fair

    @property
    def flow_settings(self) -> dict[str, Any]:
        """The flow control this queue's claims apply, as a consumer records it (JSON-ready;
        key_limits as [key or pattern, limit] pairs: their order matters). flow_settings_value
        reads it back."""
        return {"limit": self.limit, "limit_per_key": self.limit_per_key,
                "key_limits": [[k, n] for k, n in self.key_limits], "rate": self.rate,
                "rate_per_key": self.rate_per_key, "fair": self.fair}

    def with_flow(self, flow: dict[str, Any]) -> QueueConfig:
        """This config with another's flow settings (flow_settings_value's)."""
        return replace(self, limit=flow["limit"], limit_per_key=flow["limit_per_key"],
                       key_limits=tuple((k, n) for k, n in flow["key_limits"]), rate=flow["rate"],
                       rate_per_key=flow["rate_per_key"], fair=flow["fair"])

    def flow_compared(self) -> tuple:
        """What two configs' flow control is equal by: the rates as parsed ("60/1m" is "60/60s")."""
        return (self.limit, self.limit_per_key, self.key_limits, self.rates, self.fair)


@dataclass(frozen=True)
class WakeupConfig:
    """[wakeup]: how idle consumers wait for work and how often they poll."""

    poll_initial_s: float = 0.005  # first signal-row poll after going idle, doubled each time
    poll_max_s: float = 1.0  # backoff cap: the worst pick-up delay when no bell rings
    idle_wait_s: float = 25.0  # how long a non-watcher sleeps in GET_LOCK before re-arming
    # A producer that does not hold the queue's bell KILL QUERYs the watcher's wait after its
    # COMMIT. "auto": unless the server refuses it (another database user), a proxy stands in
    # between or locks are unavailable, each found by the producer itself and remembered.
    # true: on every put whatever the server said; false: never (the consumers' poll).
    instant_wake: bool | str = "auto"
    use_locks: bool = True  # false: poll the signal row only (for proxies that break GET_LOCK)


@dataclass(frozen=True)
class ConsumerConfig:
    """[consumer]: the consumer process as a whole (reaper, shutdown, sessions, metrics)."""

    reap_interval_s: float = 2.0
    shutdown_grace_s: float = 60.0
    # The server drops a consumer's lock sessions (liveness lock, periodic leadership) after this
    # long without a statement: a host that vanished without closing them loses its locks then.
    # Live consumers ping well inside it (consume/presence.py).
    session_idle_s: float = 60.0
    metrics_port: int = 0  # 0: no Prometheus endpoint
    metrics_addr: str = "127.0.0.1"  # where it listens: "0.0.0.0" or "::" for every interface
    # With metrics_port: the status pages (notifyq web's, read-only) on the same port. Off by
    # default: they show payloads and errors, which a port opened for scraping may not be for.
    metrics_pages: bool = False
    on_failure: str = ""  # "pkg.module:function" called with (job, exception) for every failed job
    # The code version this consumer runs (an integer the app bumps with a release): it never
    # claims a job put with a higher min_version. 0: claims only jobs without a minimum.
    version: int = 0


@dataclass(frozen=True)
class ProducerConfig:
    """[producer]: payload limit and batching of `notifyq produce` and put_many, and how long a
    library Producer retries its server."""

    max_payload_bytes: int = 65536
    batch_lines: int = 500  # `produce` from stdin commits at most this many lines at once ...
    batch_wait_s: float = 0.0  # ... and holds a batch open this long for more (0: commit at once)
    chunk_size: int = 500  # rows per multi-row INSERT in put_many
    # How long a library Producer's put retries an unreachable server before it raises
    # DatabaseError. The commands (`notifyq produce`) go by the top-level connect_retry_s.
    connect_retry_s: float = LIBRARY_CONNECT_RETRY_S


@dataclass(frozen=True)
class LogConfig:
    """[log]: level, format, where lines go, and the consumer's summary line."""

    level: str = "info"
    format: str = "auto"  # auto | kv | json
    file: str = ""
    syslog: bool = False
    summary_s: float = 60.0  # a consumer's INFO summary line this often, busy or idle (0: never)


@dataclass(frozen=True)
class Config:
    """Every setting, merged from defaults, files, NOTIFYQ_* variables and flags (load())."""

    dsn: DSN = field(default_factory=DSN)
    password_file: str = ""
    # How long a command retries an unreachable server before exit 5. Unset: a daemon (consume,
    # a produce stream) waits DAEMON_CONNECT_RETRY_S at start, a one-shot command (status, init,
    # jobs ...) ONESHOT_CONNECT_RETRY_S.
    connect_retry_s: float | None = None
    log: LogConfig = field(default_factory=LogConfig)
    wakeup: WakeupConfig = field(default_factory=WakeupConfig)
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)
    producer: ProducerConfig = field(default_factory=ProducerConfig)
    defaults: QueueConfig = field(default_factory=QueueConfig)
    # A [defaults] section was given (a file, or overrides shaped as one): a reload that drops
    # it is refused (check_sections_kept), as one that drops a served queue's section is
    defaults_given: bool = False
    queues: dict[str, QueueConfig] = field(default_factory=dict)
    periodic: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    # [shards]: name -> DSN of each independent server. Empty: one server, `dsn`. Set: `dsn` is
    # the first shard's (by name), for what is not a queue's (sharding/placement.py places the queues).
    shards: dict[str, DSN] = field(default_factory=dict)

    def shard_names(self) -> tuple[str, ...]:
        """Every shard's name in name order; ("",) for one server."""
        return tuple(sorted(self.shards)) or ("",)

    def on_shard(self, name: str) -> "Config":
        """This config with `dsn` the shard's and no [shards]: what a single-server part runs with."""
        return replace(self, dsn=self.shards[name], shards={}) if name else self

    def connect_retry(self, *, oneshot: bool) -> float:
        if self.connect_retry_s is not None:
            return self.connect_retry_s
        return ONESHOT_CONNECT_RETRY_S if oneshot else DAEMON_CONNECT_RETRY_S

    def queue(self, name: str) -> QueueConfig:
        return self.queues.get(validate_queue_name(name), self.defaults)

    def with_overrides(self, **kw: Any) -> "Config":
        return replace(self, **kw)

    def masked_dict(self) -> dict[str, Any]:
        """Everything, as `notifyq config` prints it: the password never appears."""
        out: dict[str, Any] = {"dsn": self.dsn.masked(), "sources": list(self.sources)}
        if self.shards:
            out = {"shards": {n: d.masked() for n, d in sorted(self.shards.items())}, "sources": out["sources"]}
        if self.connect_retry_s is not None:  # unset: each command's own default
            out["connect_retry_s"] = self.connect_retry_s
        if self.password_file:
            out["password_file"] = self.password_file
        for name in ("log", "wakeup", "consumer", "producer", "defaults"):
            out[name] = dataclasses.asdict(getattr(self, name))
        out["queue"] = {q: _diff(qc, self.defaults) for q, qc in self.queues.items()}
        if self.periodic:
            out["periodic"] = {q: list(p) for q, p in self.periodic.items()}
        return out


def check_sections_kept(old: Config, new: Config, queues: Iterable[str]) -> None:
    """A reload of a process serving `queues` refuses a config that drops a section they run
    with: the [queue.NAME] section one of them had, or the [defaults] section every queue's
    settings start from. The queues would go on with the built-in defaults, their limits,
    rates and handler gone in silence (a section deleted, or its name mistyped). A queue that
    had no section (the defaults, a handler from the command line) is not concerned by the
    [queue.NAME] rule, nor is a section added."""
    queues = list(dict.fromkeys(queues))
    gone = [f"[queue.{q}]" for q in queues if q in old.queues and q not in new.queues]
    defaults_gone = bool(queues) and old.defaults_given and not new.defaults_given
    if not gone and not defaults_gone:
        return
    where = ", ".join(new.sources) or "no config file (none was read)"
    if not defaults_gone:
        raise errors.ConfigError(f"{', '.join(gone)}: the section of a queue this process serves is gone from "
                                 f"{where}; restore it, or restart the service to run the queue without it")
    if not gone:
        raise errors.ConfigError(f"[defaults]: the section this process's queues take their settings from is "
                                 f"gone from {where}; restore it, or restart the service to run them on the "
                                 "built-in defaults")
    raise errors.ConfigError(f"{', '.join(['[defaults]', *gone])}: sections this process's queues run with are "
                             f"gone from {where}; restore them, or restart the service to run without them")


def _diff(qc: QueueConfig, base: QueueConfig) -> dict[str, Any]:
    return {f.name: getattr(qc, f.name) for f in fields(qc) if getattr(qc, f.name) != getattr(base, f.name)}


# Every number a setting may hold, in one table: (integer, low, low excluded, high). Checked by
# values.number, which also refuses nan and inf, for files, NOTIFYQ_* variables and flags alike.
_POSITIVE_S = (False, 0, True, values.MAX_SECONDS)
RANGES: dict[str, tuple[bool, float, bool, float]] = {
    "command_timeout_s": _POSITIVE_S, "retry_base_s": _POSITIVE_S, "retry_max_s": _POSITIVE_S,
    "lease_s": _POSITIVE_S, "retention_s": (False, 0, False, values.MAX_SECONDS),  # 0: keep forever
    "result_ttl_s": (False, 0, False, values.MAX_SECONDS),  # 0: results kept only with keep_done
    "timeout_s": (False, 0, False, values.MAX_SECONDS),  # 0: none
    "batch_size": (True, 1, False, 10000), "batch_target_s": (False, 0, False, values.MAX_SECONDS),  # 0: off
    "workers": (True, 1, False, 256),
    "concurrency": (True, 1, False, 10000),
    "limit_per_key": (True, 0, False, 1_000_000), "limit": (True, 0, False, 1_000_000),  # 0: none
    "max_attempts": (True, 1, False, 65535),
    "poll_initial_s": _POSITIVE_S, "poll_max_s": _POSITIVE_S, "idle_wait_s": _POSITIVE_S,
    "reap_interval_s": _POSITIVE_S, "shutdown_grace_s": _POSITIVE_S,
    "version": (True, 0, False, values.MAX_VERSION),
    "session_idle_s": (False, 2, False, 86400),  # whole seconds on the server, pinged at 1/4
    "metrics_port": (True, 0, False, 65535),  # 0: no endpoint
    "max_payload_bytes": (True, 1, False, 1 << 30), "batch_lines": (True, 1, False, 1_000_000),
    "batch_wait_s": (False, 0, False, values.MAX_SECONDS), "chunk_size": (True, 1, False, 1_000_000),
    "connect_retry_s": (False, 0, False, values.MAX_SECONDS),  # 0: one attempt
    "summary_s": (False, 0, False, values.MAX_SECONDS),  # 0: no summary lines
}


INSTANT_WAKE_FORMS = "true, false or \"auto\""


def instant_wake_value(value: Any, where: str, suffix: str = "") -> bool | str:
    """wakeup.instant_wake: true, false or "auto" (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    raise errors.ConfigError(f"{where}: expected {INSTANT_WAKE_FORMS}, got {values.shown(value)}{suffix}")


RATE_KEYS = ("rate", "rate_per_key")


def rate_value(value: Any, where: str, suffix: str = "") -> str:
    """A rate limit's text as the config keeps it (stripped), once values.rate accepts it."""
    try:
        values.rate(where, value, error=errors.ConfigError)
    except errors.ConfigError as e:
        raise errors.ConfigError(f"{e}{suffix}") from None
    return value.strip()


KEY_LIMIT_RANGE = (True, 1, False, 1_000_000)


def key_limits_value(value: Any, where: str, suffix: str = "") -> tuple[tuple[str, int], ...]:
    """[queue.NAME.key_limits]: a table of key or pattern -> limit (a positive whole number)."""
    if not isinstance(value, dict):
        raise errors.ConfigError(f"{where}: expected a table of \"key\" = limit, got {values.shown(value)}{suffix}")
    out = []
    for key, n in value.items():
        if not isinstance(key, str) or not 0 < len(key) <= 191:
            raise errors.ConfigError(f"{where}: a key or pattern is 1-191 characters, got {values.shown(key)}{suffix}")
        try:  # as a job's key is checked: an entry no key can match (a trailing space) is refused
            values.job_key(f"{where}: a key or pattern", key, error=errors.ConfigError)
        except errors.ConfigError as e:
            raise errors.ConfigError(f"{e}{suffix}") from None
        integer, lo, lo_open, hi = KEY_LIMIT_RANGE
        try:
            n = values.number(f"{where}.{key}", n, lo=lo, lo_open=lo_open, hi=hi, integer=integer,
                              error=errors.ConfigError)
        except errors.ConfigError as e:
            raise errors.ConfigError(f"{e}{suffix}") from None
        out.append((key, int(n)))
    return tuple(out)


def check_setting(key: str, value: Any, where: str, error: type[errors.NotifyqError] = errors.ConfigError,
                  suffix: str = "") -> Any:
    """One setting's number check (the flags that override settings use it too)."""
    integer, lo, lo_open, hi = RANGES[key]
    try:
        value = values.number(where, value, lo=lo, lo_open=lo_open, hi=hi, integer=integer, error=error)
    except errors.NotifyqError as e:
        raise type(e)(f"{e}{suffix}") from None
    return value if integer else float(value)


def flow_settings_value(value: Any) -> dict[str, Any] | None:
    """A recorded QueueConfig.flow_settings read back, each value checked as the config checks
    it; None when it is not one (written by another version, or damaged)."""
    if not isinstance(value, dict):
        return None
    try:
        limits = {key: check_setting(key, value.get(key, 0), key) for key in ("limit", "limit_per_key")}
        pairs = value.get("key_limits", [])
        if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            return None
        key_limits = key_limits_value(dict(pairs), "key_limits") if all(isinstance(p[0], str) for p in pairs) else None
        rates = {key: value.get(key, "") for key in ("rate", "rate_per_key")}
        for key, text in rates.items():
            values.rate(key, text, error=errors.ConfigError)
        fair = value.get("fair", False)
    except (errors.ConfigError, TypeError):
        return None
    if key_limits is None or len(key_limits) != len(pairs) or not isinstance(fair, bool):
        return None
    return {**limits, "key_limits": [list(p) for p in key_limits], **rates, "fair": fair}
