"""Configuration: defaults < config files < NOTIFYQ_* environment < command-line flags.

Files: `$NOTIFYQ_CONFIG` (default /etc/notifyq/notifyq.toml) and then every `conf.d/*.toml`
beside it, in name order. Unknown keys are errors, not warnings: a typo in a retry setting
should stop a deploy, not silently run with the default.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import tomllib
import urllib.parse
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from notifyq import errors

DEFAULT_CONFIG_PATH = "/etc/notifyq/notifyq.toml"
DAEMON_CONNECT_RETRY_S = 30.0  # a service outlives a database restart at its start
ONESHOT_CONNECT_RETRY_S = 5.0  # an operator at a prompt wants the answer, not a wait
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def validate_queue_name(name: str) -> str:
    """Queue names end up in lock names and log lines, never in SQL text; still, keep them tame."""
    if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
        raise errors.InputError(
            f"invalid queue name {name!r}: use 1-64 characters from A-Z a-z 0-9 _ . -"
        )
    return name


@dataclass(frozen=True)
class DSN:
    user: str = "root"
    password: str | None = field(default=None, repr=False)
    host: str = "localhost"
    port: int = 3306
    database: str = "notifyq"
    unix_socket: str | None = None
    tls: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, url: str) -> "DSN":
        """mysql://user:pw@host:port/db, or mysql://user@localhost/db?unix_socket=/run/mysqld/mysqld.sock"""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("mysql", "mariadb"):
            raise errors.ConfigError("bad DSN: expected mysql://user:password@host:port/database")
        try:
            port = parts.port or 3306
        except ValueError:
            raise errors.ConfigError("bad DSN: the port is not a number") from None
        query = dict(urllib.parse.parse_qsl(parts.query))
        socket_path = query.pop("unix_socket", None) or query.pop("socket", None)
        tls = {k: query.pop(k) for k in list(query) if k.startswith("ssl_")}
        if query:
            raise errors.ConfigError(f"bad DSN: unknown option(s) {', '.join(sorted(query))}")
        database = parts.path.lstrip("/") or "notifyq"
        if not re.match(r"^[A-Za-z0-9_]{1,64}$", database):
            raise errors.ConfigError(f"bad DSN: invalid database name {database!r}")
        password = urllib.parse.unquote(parts.password) if parts.password is not None else None
        return cls(
            user=urllib.parse.unquote(parts.username or "root"),
            password=password,
            host=parts.hostname or "localhost",
            port=port,
            database=database,
            unix_socket=socket_path,
            tls=tls,
        )

    def masked(self) -> str:
        """The DSN as a URL with the password replaced: safe for logs and `notifyq config`."""
        auth = self.user + (":***" if self.password else "")
        host = f"{self.host}:{self.port}" if not self.unix_socket else self.host
        params = dict(self.tls)
        if self.unix_socket:
            params["unix_socket"] = self.unix_socket
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        return f"mysql://{auth}@{host}/{self.database}{query}"

    def connect_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {"user": self.user, "database": self.database, "charset": "utf8mb4"}
        if self.password:
            args["password"] = self.password
        if self.unix_socket:
            args["unix_socket"] = self.unix_socket
        else:
            args["host"] = self.host
            args["port"] = self.port
        if self.tls:
            # Passed through to the driver as its `ssl` mapping (ca, cert, key, capath, cipher).
            args["ssl"] = {k.removeprefix("ssl_"): v for k, v in self.tls.items() if k != "ssl_mode"}
            if "ssl_mode" in self.tls:
                args["ssl_mode"] = self.tls["ssl_mode"]
        return args


@dataclass(frozen=True)
class QueueConfig:
    """Settings one queue's consumers run with; `[defaults]` then `[queue.NAME]`."""

    handler: str = ""  # "pkg.module:function"
    command: str = ""  # external command; payload JSON on stdin
    per_batch: bool = False  # handler gets the whole batch (command: JSON lines)
    command_timeout_s: float = 60.0
    batch_size: int = 100
    workers: int = 1
    max_attempts: int = 5
    retry_base_s: float = 1.0
    retry_max_s: float = 3600.0
    lease_s: float = 300.0  # a claim older than this, not extended, is taken back even from a live consumer
    keep_done: bool = False  # keep finished jobs as status done instead of deleting them
    retention_s: float = 7 * 86400.0  # how long kept done/dead jobs stay before `purge` removes them


@dataclass(frozen=True)
class WakeupConfig:
    poll_initial_s: float = 0.005  # first signal-row poll after going idle, doubled each time
    poll_max_s: float = 1.0  # backoff cap: the worst pick-up delay when no bell rings
    idle_wait_s: float = 25.0  # how long a non-watcher sleeps in GET_LOCK before re-arming
    instant_wake: bool = False  # one-shot producers KILL QUERY the watcher's wait (same DB user only)
    use_locks: bool = True  # false: poll the signal row only (for proxies that break GET_LOCK)


@dataclass(frozen=True)
class ConsumerConfig:
    reap_interval_s: float = 2.0
    shutdown_grace_s: float = 60.0
    metrics_port: int = 0  # 0: no Prometheus endpoint
    metrics_addr: str = "127.0.0.1"  # where it listens: "0.0.0.0" or "::" for every interface


@dataclass(frozen=True)
class ProducerConfig:
    max_payload_bytes: int = 65536
    batch_lines: int = 500  # `produce` from stdin commits every this many lines ...
    batch_wait_s: float = 0.05  # ... or after this long, whichever comes first
    chunk_size: int = 500  # rows per multi-row INSERT in put_many


@dataclass(frozen=True)
class LogConfig:
    level: str = "info"
    format: str = "auto"  # auto | kv | json
    file: str = ""
    syslog: bool = False


@dataclass(frozen=True)
class Config:
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
    queues: dict[str, QueueConfig] = field(default_factory=dict)
    periodic: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    sources: tuple[str, ...] = ()

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


def _diff(qc: QueueConfig, base: QueueConfig) -> dict[str, Any]:
    return {f.name: getattr(qc, f.name) for f in fields(qc) if getattr(qc, f.name) != getattr(base, f.name)}


def _coerce(cls: type, data: dict[str, Any], where: str, base: Any = None) -> Any:
    """Build dataclass `cls` from a TOML table, rejecting unknown keys and wrong types."""
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise errors.ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    base = base if base is not None else cls()
    values = {}
    for key, value in data.items():
        expected = type(getattr(base, key))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise errors.ConfigError(f"{where}.{key}: expected {expected.__name__}, got {value!r}")
        values[key] = value
    return replace(base, **values)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise errors.ConfigError(f"{path}: invalid TOML: {e}") from None
    except OSError as e:
        raise errors.ConfigError(f"{path}: cannot read: {e.strerror}") from None
    return data


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def config_files(env: dict[str, str]) -> list[Path]:
    main = Path(env.get("NOTIFYQ_CONFIG") or DEFAULT_CONFIG_PATH)
    if "NOTIFYQ_CONFIG" in env and not main.exists():
        raise errors.ConfigError(f"NOTIFYQ_CONFIG names {main}, which does not exist")
    found = [main] if main.exists() else []
    confd = main.parent / "conf.d"
    if confd.is_dir():
        found += sorted(confd.glob("*.toml"))
    return found


def warn_if_readable(path: Path, warn) -> None:
    """A password other users can read is a leak waiting to happen: say so, loudly, once."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    # Group-readable is a deliberate choice (root:notifyq 0640); world-readable never is.
    if mode & stat.S_IROTH:
        warn(f"{path} holds a database password and is readable by other users: chmod 600 it")


ENV_KEYS = {
    # variable -> (section or None, key)
    "NOTIFYQ_DSN": (None, "dsn"),
    "NOTIFYQ_PASSWORD_FILE": (None, "password_file"),
    "NOTIFYQ_CONNECT_RETRY_S": (None, "connect_retry_s"),
    "NOTIFYQ_LOG_LEVEL": ("log", "level"),
    "NOTIFYQ_LOG_FORMAT": ("log", "format"),
    "NOTIFYQ_LOG_FILE": ("log", "file"),
    "NOTIFYQ_POLL_MAX_S": ("wakeup", "poll_max_s"),
    "NOTIFYQ_INSTANT_WAKE": ("wakeup", "instant_wake"),
    "NOTIFYQ_METRICS_PORT": ("consumer", "metrics_port"),
    "NOTIFYQ_METRICS_ADDR": ("consumer", "metrics_addr"),
}


def _env_value(raw: str) -> Any:
    low = raw.strip().lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    for conv in (int, float):
        try:
            return conv(raw)
        except ValueError:
            pass
    return raw


def load(env: dict[str, str] | None = None, overrides: dict[str, Any] | None = None, warn=None) -> Config:
    """Merge files, environment and `overrides` (flags: {"dsn": ..., "log": {"level": ...}})."""
    env = dict(os.environ if env is None else env)
    warn = warn or (lambda msg: None)
    raw: dict[str, Any] = {}
    files = config_files(env)
    for path in files:
        data = _read_toml(path)
        if "dsn" in data and ":" in urllib.parse.urlsplit(str(data["dsn"])).netloc.split("@")[0]:
            warn_if_readable(path, warn)
        _merge(raw, data)
    for var, (section, key) in ENV_KEYS.items():
        if env.get(var):
            target = raw.setdefault(section, {}) if section else raw
            target[key] = env[var] if key in ("dsn", "password_file", "level", "format", "file", "metrics_addr") else _env_value(env[var])
    _merge(raw, overrides or {})
    return _build(raw, env, tuple(str(p) for p in files), warn)


def _build(raw: dict[str, Any], env: dict[str, str], sources: tuple[str, ...], warn) -> Config:
    raw = dict(raw)
    top_known = {"dsn", "password_file", "connect_retry_s", "log", "wakeup", "consumer", "producer",
                 "defaults", "queue", "tls"}
    unknown = sorted(set(raw) - top_known)
    if unknown:
        raise errors.ConfigError(f"unknown config key(s) {', '.join(unknown)}")
    dsn = DSN.parse(str(raw.get("dsn") or "mysql://root@localhost/notifyq"))
    tls = raw.get("tls", {})
    bad_tls = sorted(set(tls) - {"ca", "cert", "key", "capath", "cipher", "mode"})
    if bad_tls:
        raise errors.ConfigError(f"tls: unknown key(s) {', '.join(bad_tls)}")
    if tls:
        dsn = replace(dsn, tls={**dsn.tls, **{f"ssl_{k}": str(v) for k, v in tls.items()}})
    password_file = str(raw.get("password_file") or "")
    dsn = replace(dsn, password=_password(dsn, password_file, env, warn))
    defaults = _coerce(QueueConfig, raw.get("defaults", {}), "defaults")
    queues: dict[str, QueueConfig] = {}
    periodic: dict[str, tuple[dict[str, Any], ...]] = {}
    for name, section in raw.get("queue", {}).items():
        validate_queue_name(name)
        section = dict(section)
        entries = section.pop("periodic", [])
        queues[name] = _coerce(QueueConfig, section, f"queue.{name}", defaults)
        if entries:
            periodic[name] = tuple(_periodic_entry(e, name) for e in entries)
    connect_retry_s = raw.get("connect_retry_s")
    if connect_retry_s is not None and (isinstance(connect_retry_s, bool) or
                                        not isinstance(connect_retry_s, (int, float)) or connect_retry_s < 0):
        raise errors.ConfigError(f"connect_retry_s: expected a number of seconds >= 0, got {connect_retry_s!r}")
    cfg = Config(
        dsn=dsn,
        password_file=password_file,
        connect_retry_s=None if connect_retry_s is None else float(connect_retry_s),
        log=_coerce(LogConfig, raw.get("log", {}), "log"),
        wakeup=_coerce(WakeupConfig, raw.get("wakeup", {}), "wakeup"),
        consumer=_coerce(ConsumerConfig, raw.get("consumer", {}), "consumer"),
        producer=_coerce(ProducerConfig, raw.get("producer", {}), "producer"),
        defaults=defaults,
        queues=queues,
        periodic=periodic,
        sources=sources,
    )
    _check_ranges(cfg)
    return cfg


def _periodic_entry(entry: Any, queue: str) -> dict[str, Any]:
    where = f"queue.{queue}.periodic"
    if not isinstance(entry, dict) or "cron" not in entry:
        raise errors.ConfigError(f"{where}: each entry needs a cron = \"...\" expression")
    unknown = sorted(set(entry) - {"cron", "payload", "name", "priority"})
    if unknown:
        raise errors.ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    from croniter import croniter  # imported here: only periodic configs need it

    if not croniter.is_valid(str(entry["cron"])):
        raise errors.ConfigError(f"{where}: invalid cron expression {entry['cron']!r}")
    return {"name": str(entry.get("name") or entry["cron"]), "payload": entry.get("payload", {}), **entry}


def _password(dsn: DSN, password_file: str, env: dict[str, str], warn) -> str | None:
    """URL < $NOTIFYQ_PASSWORD < password_file < systemd credential `db_password`."""
    password = dsn.password
    if env.get("NOTIFYQ_PASSWORD"):
        password = env["NOTIFYQ_PASSWORD"]
    candidates = [Path(password_file)] if password_file else []
    if env.get("CREDENTIALS_DIRECTORY"):
        candidates.append(Path(env["CREDENTIALS_DIRECTORY"]) / "db_password")
    for path in candidates:
        if path == Path(password_file) or path.exists():
            try:
                password = path.read_text().rstrip("\n")
            except OSError as e:
                raise errors.ConfigError(f"password_file {path}: cannot read: {e.strerror}") from None
            warn_if_readable(path, warn)
    return password


def _check_ranges(cfg: Config) -> None:
    for name, qc in [("defaults", cfg.defaults), *((f"queue.{q}", c) for q, c in cfg.queues.items())]:
        if not 1 <= qc.batch_size <= 10000:
            raise errors.ConfigError(f"{name}.batch_size must be 1..10000")
        if qc.max_attempts < 1 or qc.workers < 1:
            raise errors.ConfigError(f"{name}: max_attempts and workers must be at least 1")
        if qc.handler and qc.command:
            raise errors.ConfigError(f"{name}: set handler or command, not both")
    if cfg.log.level.lower() not in ("debug", "info", "warning", "error"):
        raise errors.ConfigError("log.level must be debug, info, warning or error")
    if cfg.log.format not in ("auto", "kv", "json"):
        raise errors.ConfigError("log.format must be auto, kv or json")
    if cfg.wakeup.poll_initial_s <= 0 or cfg.wakeup.poll_max_s < cfg.wakeup.poll_initial_s:
        raise errors.ConfigError("wakeup: need 0 < poll_initial_s <= poll_max_s")
