"""The configuration: what it holds and how it is read, each in a module of its own.

loading.py reads it: defaults < config files < NOTIFYQ_* environment < command-line flags;
settings.py says what a configuration holds (its frozen dataclasses, defaults and ranges);
dsn.py parses and checks the DSN once; values.py is every range and finite-number check, for
the config, the flags and the API alike. Imports go one way: loading > settings > dsn > values.

The names users import come from here (`from notifyq.config import Config, load`).
"""

from notifyq.config.dsn import DEFAULT_DATABASE, DEFAULT_DSN, DSN, TLS_KEYS, tls_options
from notifyq.config.loading import (ENV_KEYS, SECRET_ENV, SHARD_NAME_RE, config_files, load, parse_shards_env,
                                    periodic_entries, warn_if_readable)
from notifyq.config.settings import (DAEMON_CONNECT_RETRY_S, DEFAULT_CONFIG_PATH, LIBRARY_CONNECT_RETRY_S,
                                     ONESHOT_CONNECT_RETRY_S, RANGES, Config, ConsumerConfig, LogConfig,
                                     ProducerConfig, QueueConfig, WakeupConfig, check_sections_kept, check_setting,
                                     instant_wake_value, validate_queue_name)

__all__ = [
    "DAEMON_CONNECT_RETRY_S", "DEFAULT_CONFIG_PATH", "DEFAULT_DATABASE", "DEFAULT_DSN", "DSN", "ENV_KEYS",
    "LIBRARY_CONNECT_RETRY_S", "ONESHOT_CONNECT_RETRY_S", "RANGES", "SECRET_ENV", "SHARD_NAME_RE", "TLS_KEYS",
    "Config", "ConsumerConfig", "LogConfig", "ProducerConfig", "QueueConfig", "WakeupConfig", "check_sections_kept",
    "check_setting", "config_files", "instant_wake_value", "load", "parse_shards_env", "periodic_entries", "tls_options",
    "validate_queue_name", "warn_if_readable",
]
