"""Which database notifyq.testing works on: the Config a test passes, a DSN URL, or by default
the one the app's tasks enqueue on (the default TaskRegistry's): the project's database under
Django with notifyq.contrib.django installed (its test database while tests run), else the one
`notifyq.load_config()` finds ($NOTIFYQ_DSN, $NOTIFYQ_CONFIG). And the short sessions it opens
there. One server only: a test's database is one database."""

from __future__ import annotations

import sys

from notifyq import errors
from notifyq.config import values
from notifyq.config import Config, load
from notifyq.store.db import Session

RETRY_S = 10.0  # a test's server is local: past this it is not coming


def config_of(config: Config | str | None) -> Config:
    if config is None:
        config = django_config() or load()
    elif isinstance(config, str):
        config = load(overrides={"dsn": config})
    elif not isinstance(config, Config):
        raise errors.InputError(f"notifyq.testing: expected a Config, a DSN URL or None, got {values.shown(config)}")
    if config.shards:
        raise errors.ConfigError("notifyq.testing: this config has [shards]; a test database is one server: "
                                 "pass a config (or DSN) of that server alone")
    return config


def session_for(config: Config, name: str) -> Session:
    return Session(config.dsn, name=name, retry_s=RETRY_S)


def django_config() -> Config | None:
    """contrib.django's config, in a Django project with notifyq's app installed and its apps
    ready. Django is never imported here for a process that has not imported it already."""
    if "django" not in sys.modules:
        return None
    from django.apps import apps
    from django.conf import settings

    if not settings.configured or not apps.ready or not apps.is_installed("notifyq.contrib.django"):
        return None
    from notifyq.contrib.django import get_config

    return get_config()
