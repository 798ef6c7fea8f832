"""notifyq's Config from Django's settings: the database of NOTIFYQ["DATABASE"] (an alias of
DATABASES, "default" unless set), never a second DSN.

    NOTIFYQ = {
        "DATABASE": "default",                            # the alias whose database holds the queue
        "QUEUES": {"emails": {"workers": 4}},             # [queue.NAME] tables of notifyq.toml
        "CONFIG": {"wakeup": {"poll_max_s": 5.0}},        # any other table of notifyq.toml
    }

The NOTIFYQ_* variables apply on top, as for the `notifyq` command, except the ones that name a
database (NOTIFYQ_DSN, NOTIFYQ_SHARDS, NOTIFYQ_PASSWORD, NOTIFYQ_PASSWORD_FILE): the database is
Django's. A config file is read only when $NOTIFYQ_CONFIG names one.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.db import connections

from notifyq import config as config_mod
from notifyq import errors
from notifyq.config import values
from notifyq.config.dsn import DSN, TLS_KEYS, tls_options

KNOWN = ("DATABASE", "QUEUES", "CONFIG")
_THE_DATABASES = ("NOTIFYQ_DSN", "NOTIFYQ_SHARDS", "NOTIFYQ_PASSWORD", "NOTIFYQ_PASSWORD_FILE")


def notifyq_settings() -> dict[str, Any]:
    raw = getattr(settings, "NOTIFYQ", {}) or {}
    if not isinstance(raw, dict):
        raise errors.ConfigError(f"settings.NOTIFYQ: expected a dict, got {values.shown(raw)}")
    unknown = sorted(set(raw) - set(KNOWN))
    if unknown:
        raise errors.ConfigError(f"settings.NOTIFYQ: unknown key(s) {', '.join(map(str, unknown))} "
                                 f"(known: {', '.join(KNOWN)})")
    return raw


def database_alias() -> str:
    alias = notifyq_settings().get("DATABASE", "default")
    if alias not in settings.DATABASES:
        raise errors.ConfigError(f"settings.NOTIFYQ['DATABASE']: {values.shown(alias)} is not in DATABASES")
    return alias


def dsn_of(alias: str) -> DSN:
    """The DSN of Django's database `alias` (its test database while tests run)."""
    conn = connections[alias]
    if conn.vendor != "mysql":
        raise errors.ConfigError(f"DATABASES[{alias!r}] is {conn.vendor}: notifyq needs MySQL or MariaDB")
    sd = conn.settings_dict
    options = sd.get("OPTIONS") or {}
    host = sd.get("HOST") or "localhost"
    socket = options.get("unix_socket") or (host if host.startswith("/") else None)
    name = sd.get("NAME") or ""
    if not values.DATABASE_NAME_RE.fullmatch(name):
        raise errors.ConfigError(f"DATABASES[{alias!r}]['NAME'] {values.shown(name)}: notifyq takes 1-64 "
                                 "characters from A-Z a-z 0-9 _")
    ssl = options.get("ssl") or {}
    tls = tls_options({f"ssl_{k}": str(v) for k, v in ssl.items() if k in TLS_KEYS}, "OPTIONS['ssl']") if ssl else {}
    return DSN(user=sd.get("USER") or "root", password=sd.get("PASSWORD") or None,
               host="localhost" if socket else host, port=int(sd.get("PORT") or 3306), database=name,
               unix_socket=socket, tls=tls)


TASK_BACKEND = "notifyq.contrib.django.tasks.NotifyqBackend"
TASK_RUNNER = "notifyq.contrib.django.task_runner:run"


def task_queue_defaults(alias: str) -> dict[str, dict[str, Any]]:
    """The queues of settings.TASKS's notifyq backends on database `alias`, and what they need
    unless NOTIFYQ["QUEUES"] says otherwise: the runner of Django's tasks as their handler, and
    their finished jobs kept (a TaskResult is read from its job's row, until retention_s)."""
    backends = getattr(settings, "TASKS", None)
    found: dict[str, dict[str, Any]] = {}
    if not isinstance(backends, dict):
        return found
    for params in backends.values():
        if not isinstance(params, dict) or params.get("BACKEND") != TASK_BACKEND:
            continue
        if ((params.get("OPTIONS") or {}).get("DATABASE") or database_alias()) != alias:
            continue
        for queue in params.get("QUEUES", ["default"]):
            found[queue] = {"handler": TASK_RUNNER, "keep_done": True}
    return found


def get_config(alias: str | None = None, overrides: dict[str, Any] | None = None, warn=None,
               config_path: str | None = None) -> config_mod.Config:
    """notifyq's Config for Django's database `alias` (default: NOTIFYQ["DATABASE"])."""
    raw = notifyq_settings()
    alias = alias or database_alias()
    tables = dict(raw.get("CONFIG") or {})
    for key in ("dsn", "shards", "password_file"):
        if key in tables:
            raise errors.ConfigError(f"settings.NOTIFYQ['CONFIG']: no {key!r} here: the database is "
                                     f"DATABASES[{alias!r}] (NOTIFYQ['DATABASE'])")
    queues = raw.get("QUEUES") or {}
    if not isinstance(queues, dict):
        raise errors.ConfigError(f"settings.NOTIFYQ['QUEUES']: expected a dict, got {values.shown(queues)}")
    if queues:
        tables["queue"] = {**(tables.get("queue") or {}), **queues}
    for queue, defaults in task_queue_defaults(alias).items():
        given = (tables.get("queue") or {}).get(queue) or {}
        if given.keys() & {"handler", "command", "tasks"}:
            defaults = {k: v for k, v in defaults.items() if k != "handler"}
        tables["queue"] = {**(tables.get("queue") or {}), queue: {**defaults, **given}}
    for key, value in (overrides or {}).items():
        tables[key] = {**tables.get(key, {}), **value} if isinstance(value, dict) else value
    env = {k: v for k, v in os.environ.items() if k not in _THE_DATABASES}
    env.setdefault("NOTIFYQ_CONFIG", "/dev/null")
    cfg = config_mod.load(env=env, overrides=tables, warn=warn, config_path=config_path)
    return replace(cfg, dsn=dsn_of(alias), password_file="", shards={})  # the one database: Django's
