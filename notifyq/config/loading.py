"""Configuration: defaults < config files < NOTIFYQ_* environment < command-line flags.

Files: `$NOTIFYQ_CONFIG` (default /etc/notifyq/notifyq.toml) and then every `conf.d/*.toml`
beside it, in name order. Unknown keys are errors, not warnings: a typo in a retry setting
should stop a deploy, not silently run with the default. What a configuration holds is
settings.py's (its names, as this module's, are importable from notifyq.config).
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from notifyq import errors
from notifyq.config import values
from notifyq.config.dsn import DEFAULT_DSN, DSN, TLS_KEYS, tls_options
from notifyq.config.settings import (DEFAULT_CONFIG_PATH, RANGES, RATE_KEYS, Config, ConsumerConfig, LogConfig,
                                     ProducerConfig, QueueConfig, WakeupConfig, check_setting, instant_wake_value,
                                     key_limits_value, rate_value, validate_queue_name)


class _Origins(dict):
    """Dotted key -> where its value came from (a file, a variable, the command line)."""

    def at(self, dotted: str) -> str:
        """' (in FILE)' for an error line about `dotted`; '' for a default."""
        source = self.get(dotted) or self.get(dotted.rsplit(".", 1)[0])
        return f" (in {source})" if source else ""


def _table(value: Any, dotted: str, origins: _Origins) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise errors.ConfigError(f"{dotted}: expected a table ([{dotted}]), got {values.shown(value)}{origins.at(dotted)}")
    return value


def _coerce(cls: type, data: Any, where: str, origins: _Origins, base: Any = None) -> Any:
    """Build dataclass `cls` from a TOML table, rejecting unknown keys, wrong types and numbers
    out of range: one line naming the key and where it was set."""
    data = _table(data, where, origins)
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        # A key is the user's text: one that would break the line (a newline, say) is quoted.
        names = ", ".join(str(k) if str(k).isprintable() else values.shown(k) for k in unknown)
        raise errors.ConfigError(f"{where}: unknown key(s) {names}{origins.at(where)}")
    base = base if base is not None else cls()
    out = {}
    for key, value in data.items():
        dotted = f"{where}.{key}"
        if key in RANGES:
            out[key] = check_setting(key, value, dotted, suffix=origins.at(dotted))
            continue
        if key == "instant_wake":
            out[key] = instant_wake_value(value, dotted, suffix=origins.at(dotted))
            continue
        if key in RATE_KEYS:
            out[key] = rate_value(value, dotted, suffix=origins.at(dotted))
            continue
        if key == "key_limits":
            out[key] = key_limits_value(value, dotted, suffix=origins.at(dotted))
            continue
        expected = type(getattr(base, key))
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise errors.ConfigError(f"{dotted}: expected {expected.__name__}, got {values.shown(value)}"
                                     f"{origins.at(dotted)}")
        out[key] = value
    return replace(base, **out)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            raw = f.read()
    except OSError as e:
        raise errors.ConfigError(f"{path}: cannot read: {e.strerror}") from None
    if not raw.strip():
        return {}
    import tomllib  # only for a file with something in it: an empty one costs no parser

    try:
        data = tomllib.loads(raw.decode())
    except tomllib.TOMLDecodeError as e:
        raise errors.ConfigError(f"{path}: invalid TOML: {e}") from None
    except UnicodeDecodeError:
        raise errors.ConfigError(f"{path}: invalid TOML: not UTF-8") from None
    except RecursionError:
        raise errors.ConfigError(f"{path}: invalid TOML: nested too deeply") from None
    return data


def _merge(into: dict[str, Any], new: dict[str, Any], origins: _Origins, source: str, prefix: str = "") -> None:
    for key, value in new.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value, origins, source, dotted + ".")
        else:
            into[key] = value
            origins[dotted] = source
            if isinstance(value, dict):
                for sub in value:
                    origins[f"{dotted}.{sub}"] = source


def config_files(env: dict[str, str], explicit: str | None = None) -> list[Path]:
    """The main file (`--config`, else $NOTIFYQ_CONFIG, else the default), then its conf.d/."""
    named_by = "--config" if explicit else "NOTIFYQ_CONFIG" if env.get("NOTIFYQ_CONFIG") else None
    main = Path(explicit or env.get("NOTIFYQ_CONFIG") or DEFAULT_CONFIG_PATH)
    try:
        exists = main.exists()
        if named_by and not exists:
            raise errors.ConfigError(f"{named_by} names {values.shown(str(main))}, which does not exist")
        if exists and main.is_dir():
            raise errors.ConfigError(f"{named_by or 'config'} {values.shown(str(main))} is a directory")
        found = [main] if exists else []
        confd = main.parent / "conf.d"
        if confd.is_dir():
            found += sorted(confd.glob("*.toml"))
    except OSError as e:  # a name too long, a loop of links
        raise errors.ConfigError(f"{named_by or 'config'} {values.shown(str(main))}: {e.strerror}") from None
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
    "NOTIFYQ_SHARDS": (None, "shards"),  # a=mysql://...,b=mysql://... (parse_shards_env)
    "NOTIFYQ_PASSWORD_FILE": (None, "password_file"),
    "NOTIFYQ_CONNECT_RETRY_S": (None, "connect_retry_s"),
    "NOTIFYQ_PRODUCER_CONNECT_RETRY_S": ("producer", "connect_retry_s"),
    "NOTIFYQ_LOG_LEVEL": ("log", "level"),
    "NOTIFYQ_LOG_FORMAT": ("log", "format"),
    "NOTIFYQ_LOG_FILE": ("log", "file"),
    "NOTIFYQ_POLL_MAX_S": ("wakeup", "poll_max_s"),
    "NOTIFYQ_INSTANT_WAKE": ("wakeup", "instant_wake"),
    "NOTIFYQ_METRICS_PORT": ("consumer", "metrics_port"),
    "NOTIFYQ_VERSION": ("consumer", "version"),
    "NOTIFYQ_METRICS_ADDR": ("consumer", "metrics_addr"),
    "NOTIFYQ_METRICS_PAGES": ("consumer", "metrics_pages"),
}
_ENV_TEXT = ("dsn", "shards", "password_file", "level", "format", "file", "metrics_addr")
_ENV_BOOL = ("instant_wake",)  # 1/0, true/false, yes/no, on/off (any case); instant_wake also auto
# What a `--command` child must not inherit (handlers.py): the ways notifyq is given a password.
SECRET_ENV = ("NOTIFYQ_PASSWORD", "NOTIFYQ_PASSWORD_FILE")


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


def _env_bool(var: str, raw: str) -> bool | str:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    if var == "NOTIFYQ_INSTANT_WAKE" and low == "auto":
        return "auto"
    also = " or auto" if var == "NOTIFYQ_INSTANT_WAKE" else ""
    raise errors.ConfigError(f"{var}: expected 1 or 0 (or true/false, yes/no, on/off){also}, got {values.shown(raw)}")


def _has_password(dsn: Any) -> bool:
    try:
        return DSN.parse(str(dsn)).password is not None
    except errors.ConfigError:
        return False  # reported when the config is built


def load(env: dict[str, str] | None = None, overrides: dict[str, Any] | None = None, warn=None,
         config_path: str | None = None) -> Config:
    """The configuration every producer and consumer takes: `notifyq.load_config()`.

    Merged from the defaults, the config file (`/etc/notifyq/notifyq.toml`, or the one
    `$NOTIFYQ_CONFIG` names), the `NOTIFYQ_*` environment variables, then `overrides`, each
    winning over the one before.

    Args:
        env: the environment to read (None: `os.environ`).
        overrides: settings that win over everything else, shaped as the file is:
            `{"dsn": "mysql://...", "queue": {"emails": {"max_attempts": 3}}}`.
        warn: called with each warning's text (a world-readable password file, ...).
        config_path: the config file to read instead of `$NOTIFYQ_CONFIG` (`--config FILE`).

    Raises:
        notifyq.errors.ConfigError: an unreadable file, an unknown key or a bad value (one line
            that names it).
    """
    try:
        return _load(dict(os.environ if env is None else env), overrides, warn or (lambda msg: None),
                     config_path)
    except RecursionError:  # tables nested thousands deep, in two files: merged recursively
        raise errors.ConfigError("config: tables nested too deeply") from None


def _load(env: dict[str, str], overrides: dict[str, Any] | None, warn, config_path: str | None) -> Config:
    raw: dict[str, Any] = {}
    origins = _Origins()
    files = config_files(env, config_path)
    for path in files:
        data = _read_toml(path)
        shard_dsns = data.get("shards") if isinstance(data.get("shards"), dict) else {}
        shard_dsns = [v.get("dsn") if isinstance(v, dict) else v for v in shard_dsns.values()]
        if any(_has_password(d) for d in [data.get("dsn", ""), *shard_dsns] if d):
            warn_if_readable(path, warn)
        _merge(raw, data, origins, str(path))
    for var, (section, key) in ENV_KEYS.items():
        if env.get(var):
            target = raw.setdefault(section, {}) if section else raw
            if not isinstance(target, dict):
                continue  # the file's section is not a table: _build says so
            if key in _ENV_BOOL:
                target[key] = _env_bool(var, env[var])
            else:
                target[key] = env[var] if key in _ENV_TEXT else _env_value(env[var])
            origins[f"{section}.{key}" if section else key] = var
    _merge(raw, overrides or {}, origins, "the command line")
    return _build(raw, env, tuple(str(p) for p in files), warn, origins)


def _build(raw: dict[str, Any], env: dict[str, str], sources: tuple[str, ...], warn, origins: _Origins) -> Config:
    raw = dict(raw)
    top_known = {"dsn", "password_file", "connect_retry_s", "log", "wakeup", "consumer", "producer",
                 "defaults", "queue", "tls", "shards"}
    unknown = sorted(set(raw) - top_known)
    if unknown:
        # Each named with where it was set: the keys may come from different files or variables
        named = (f"{k if str(k).isprintable() else values.shown(k)}{origins.at(str(k))}" for k in unknown)
        raise errors.ConfigError(f"unknown config key(s) {', '.join(named)}")
    for key in ("dsn", "password_file"):
        if key in raw and not isinstance(raw[key], str):
            raise errors.ConfigError(f"{key}: expected a string{origins.at(key)}")
    shard_urls = _shard_urls(raw, origins)
    if shard_urls:
        raw.pop("dsn", None)
    dsn = DSN.parse(raw.get("dsn") or DEFAULT_DSN)
    tls = _table(raw.get("tls", {}), "tls", origins)
    bad_tls = sorted(set(tls) - set(TLS_KEYS))
    if bad_tls:
        raise errors.ConfigError(f"tls: unknown key(s) {', '.join(map(str, bad_tls))}{origins.at('tls')}")
    if tls:
        given = tls_options({f"ssl_{k}": str(v) for k, v in tls.items()}, "tls.mode")
        dsn = replace(dsn, tls={**dsn.tls, **given})
    password_file = str(raw.get("password_file") or "")
    shards = {}
    for name, (url, own_password_file) in shard_urls.items():
        try:
            shard = DSN.parse(url)
        except errors.ConfigError as e:
            raise errors.ConfigError(f"shards.{name}: {e}{origins.at(f'shards.{name}')}") from None
        shard = replace(shard, tls={**shard.tls, **dsn.tls})
        shard.check_files()
        shards[name] = replace(shard, password=_password(shard, own_password_file or password_file, env, warn))
    if shards:
        dsn = shards[min(shards)]
    dsn.check_files()
    dsn = replace(dsn, password=_password(dsn, password_file, env, warn)) if not shards else dsn
    defaults = _coerce(QueueConfig, raw.get("defaults", {}), "defaults", origins)
    producer = _coerce(ProducerConfig, raw.get("producer", {}), "producer", origins)  # (periodic payloads' bound)
    queues: dict[str, QueueConfig] = {}
    periodic: dict[str, tuple[dict[str, Any], ...]] = {}
    for name, section in _table(raw.get("queue", {}), "queue", origins).items():
        validate_queue_name(name, errors.ConfigError)
        section = dict(_table(section, f"queue.{name}", origins))
        entries = section.pop("periodic", [])
        queues[name] = _coerce(QueueConfig, section, f"queue.{name}", origins, defaults)
        if not isinstance(entries, list):
            raise errors.ConfigError(f"queue.{name}.periodic: expected [[queue.{name}.periodic]] entries"
                                     f"{origins.at(f'queue.{name}.periodic')}")
        if entries:
            periodic[name] = periodic_entries(name, entries, producer.max_payload_bytes)
    connect_retry_s = raw.get("connect_retry_s")  # unset: each command's own default
    if connect_retry_s is not None:
        connect_retry_s = check_setting("connect_retry_s", connect_retry_s, "connect_retry_s",
                                        suffix=origins.at("connect_retry_s"))
    cfg = Config(
        dsn=dsn,
        password_file=password_file,
        connect_retry_s=connect_retry_s,
        log=_coerce(LogConfig, raw.get("log", {}), "log", origins),
        wakeup=_coerce(WakeupConfig, raw.get("wakeup", {}), "wakeup", origins),
        consumer=_coerce(ConsumerConfig, raw.get("consumer", {}), "consumer", origins),
        producer=producer,
        defaults=defaults,
        defaults_given="defaults" in raw,
        queues=queues,
        periodic=periodic,
        sources=sources,
        shards=shards,
    )
    _check_ranges(cfg, origins)
    _check_placement(cfg, origins, overridden="shards" in raw and not shards)
    return cfg


SHARD_NAME_RE = re.compile(r"[A-Za-z0-9_]{1,32}")
_LEVELS = {"the command line": 2}  # where a setting came from: files 0, NOTIFYQ_* 1, flags 2


def _level(source: str | None) -> int:
    return _LEVELS.get(source or "", 1 if (source or "").startswith("NOTIFYQ_") else 0)


def parse_shards_env(text: str) -> dict[str, str]:
    """NOTIFYQ_SHARDS: `a=mysql://...,b=mysql://...`. A comma ends a DSN only where the next
    `name=` begins, so a Galera host list (h1:p1,h2:p2) stays whole; a comma in a password
    must be percent-encoded (%2C) here."""
    out: dict[str, str] = {}
    for item in re.split(r"[,\s]+(?=[A-Za-z0-9_]+=)", text.strip()):
        name, eq, url = item.partition("=")
        if not eq or not url.strip():
            raise errors.ConfigError("NOTIFYQ_SHARDS: expected name=mysql://...,name=mysql://...")
        out[name] = url.strip().rstrip(",")
    return out


def _shard_urls(raw: dict[str, Any], origins: _Origins) -> dict[str, tuple[str, str]]:
    """[shards] as name -> (DSN text, own password_file); {} for one server.

    `dsn` and [shards] both name where the queues live: the one set at the higher level wins
    (a --dsn flag looks at one server of a sharded config), both at one level is an error."""
    if "shards" not in raw:
        return {}
    given = raw["shards"]
    shard_level = max(_level(v) for k, v in origins.items() if k == "shards" or k.startswith("shards."))
    if "dsn" in raw:
        dsn_level = _level(origins.get("dsn"))
        if dsn_level == shard_level:
            raise errors.ConfigError(f"set dsn or [shards], not both{origins.at('dsn')}")
        if dsn_level > shard_level:
            return {}
    if isinstance(given, str):
        given = parse_shards_env(given)
    given = _table(given, "shards", origins)
    if not given:
        raise errors.ConfigError(f"shards: an empty [shards] table: name at least one server{origins.at('shards')}")
    out = {}
    for name, value in given.items():
        where = f"shards.{name}"
        if not SHARD_NAME_RE.fullmatch(str(name)):
            raise errors.ConfigError(f"shards: invalid shard name {values.shown(name)}: use 1-32 characters "
                                     f"from A-Z a-z 0-9 _{origins.at('shards')}")
        if isinstance(value, dict):
            unknown = sorted(set(value) - {"dsn", "password_file"})
            if unknown or not isinstance(value.get("dsn"), str) or not isinstance(value.get("password_file", ""), str):
                raise errors.ConfigError(f"{where}: expected a DSN string, or a table with dsn = \"...\" "
                                         f"and optionally password_file = \"...\"{origins.at(where)}")
            out[name] = (value["dsn"], value.get("password_file", ""))
        elif isinstance(value, str):
            out[name] = (value, "")
        else:
            raise errors.ConfigError(f"{where}: expected a DSN string, got {values.shown(value)}{origins.at(where)}")
    return out


def _check_placement(cfg: Config, origins: _Origins, overridden: bool) -> None:
    """A queue's shard must exist; `shard` and `spread` need [shards] and exclude each other.
    (`overridden`: a --dsn or NOTIFYQ_DSN replaced the [shards] of the files: placement is moot.)"""
    if overridden:
        return
    for name, qc in [("defaults", cfg.defaults), *((f"queue.{q}", c) for q, c in cfg.queues.items())]:
        if (qc.shard or qc.spread) and not cfg.shards:
            key = "shard" if qc.shard else "spread"
            raise errors.ConfigError(f"{name}.{key}: no [shards] configured (one server: dsn){origins.at(name)}")
        if qc.shard and qc.spread:
            raise errors.ConfigError(f"{name}: set shard or spread, not both{origins.at(name)}")
        if qc.shard and qc.shard not in cfg.shards:
            raise errors.ConfigError(f"{name}.shard: unknown shard {values.shown(qc.shard)}: [shards] names "
                                     f"{', '.join(sorted(cfg.shards))}{origins.at(f'{name}.shard')}")


def periodic_entries(queue: str, entries: Any, max_payload_bytes: int) -> tuple[dict[str, Any], ...]:
    """A queue's [[queue.NAME.periodic]] entries checked by the one set of rules, the config's
    load's and the scheduler's (consume/periodic.py) alike: each as given, its name (the cron
    expression when unnamed) and payload ({}) filled in. The first entry broken is one error."""
    where = f"queue.{queue}.periodic"
    out: list[dict[str, Any]] = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("cron"), str):
            raise errors.ConfigError(f"{where}: each entry needs a cron = \"...\" expression")
        unknown = sorted(set(entry) - {"cron", "payload", "name", "priority"})
        if unknown:
            raise errors.ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
        name = entry.get("name", entry["cron"])
        if not isinstance(name, str) or not 0 < len(name) <= 191 or any(e["name"] == name for e in out):
            raise errors.ConfigError(f"{where} {values.shown(name)}: names must be unique per queue, 1-191 characters")
        from croniter import croniter  # imported here: only periodic configs need it

        if not croniter.is_valid(entry["cron"]):
            raise errors.ConfigError(f"{where}: invalid cron expression {values.shown(entry['cron'])}")
        if "priority" in entry:
            values.number(f"{where}.priority", entry["priority"], lo=-32768, hi=32767, integer=True,
                          error=errors.ConfigError)
        payload = entry.get("payload", {})
        if not isinstance(payload, dict) or "tick" in payload or "periodic" in payload:
            raise errors.ConfigError(f"{where}.payload: must be a table without the keys 'tick' and "
                                     "'periodic' (the scheduler adds them)")
        try:  # nan and inf are valid TOML but no JSON: refused here, not at the first tick
            size = len(json.dumps(payload, allow_nan=False))
        except (TypeError, ValueError) as e:
            raise errors.ConfigError(f"{where}.payload: not JSON: {e}") from None
        if size + 100 > max_payload_bytes:
            raise errors.ConfigError(f"{where}.payload: over producer.max_payload_bytes")
        out.append({"name": name, "payload": payload, **entry})
    return tuple(out)


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
                raise errors.ConfigError(f"password_file {values.shown(str(path))}: cannot read: {e.strerror}") from None
            except ValueError:  # not UTF-8, or a NUL in the name
                raise errors.ConfigError(f"password_file {values.shown(str(path))}: not a readable text file") from None
            warn_if_readable(path, warn)
    return password


def _check_ranges(cfg: Config, origins: _Origins) -> None:
    """What no single value shows: combinations, and the words a text setting may hold.
    (Every number's own range is checked as it is read: _RANGES.)"""
    for name, qc in [("defaults", cfg.defaults), *((f"queue.{q}", c) for q, c in cfg.queues.items())]:
        if qc.handler and qc.command:
            raise errors.ConfigError(f"{name}: set handler or command, not both{origins.at(name)}")
        if qc.tasks and (qc.handler or qc.command):
            raise errors.ConfigError(f"{name}: set tasks or a handler/command, not both{origins.at(name)}")
    if cfg.log.level.lower() not in ("debug", "info", "warning", "error"):
        raise errors.ConfigError(f"log.level must be debug, info, warning or error{origins.at('log.level')}")
    if cfg.log.format not in ("auto", "kv", "json"):
        raise errors.ConfigError(f"log.format must be auto, kv or json{origins.at('log.format')}")
    if cfg.log.file:
        try:
            values.writable_file("log.file", cfg.log.file)
        except errors.ConfigError as e:
            raise errors.ConfigError(f"{e}{origins.at('log.file')}") from None
    if cfg.wakeup.poll_max_s < cfg.wakeup.poll_initial_s:
        raise errors.ConfigError(f"wakeup.poll_max_s: must be >= poll_initial_s "
                                 f"({cfg.wakeup.poll_initial_s:g}){origins.at('wakeup.poll_max_s')}")
