"""Start-up cost: a consumer or producer without metrics or periodic jobs never imports
prometheus_client, croniter or http.server; the package's public names still resolve."""

import json
import subprocess
import sys

import pytest

import notifyq

HEAVY = ("prometheus_client", "croniter", "http.server")


def loaded_after(code: str, modules: tuple[str, ...] = HEAVY) -> set[str]:
    """The `modules` in sys.modules after running `code` in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport json, sys\n"
                          f"print(json.dumps([m for m in {modules!r} if m in sys.modules]))"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_importing_the_library_loads_no_metrics_or_cron_modules():
    code = ("import notifyq, notifyq.consume.service, notifyq.consume.worker\n"
            "import notifyq.produce.producer, notifyq.run.cli\n"
            "notifyq.Producer, notifyq.ConsumerService, notifyq.ConsumeOptions\n"
            "notifyq.figures.handler_seconds_histogram().observe(0.2)")
    assert loaded_after(code) == set()


def test_a_consumers_start_path_loads_neither_the_producer_nor_the_log_file_handlers():
    # What `notifyq consume` imports and runs before its first job, with logs on stderr
    code = ("import logging\nfrom notifyq import config, logs\nfrom notifyq.run import cli, runner\n"
            "from notifyq.run import daemon as daemon_mod\nfrom notifyq.consume import service\n"
            "from notifyq.store.locks import QueueLocks\nQueueLocks('notifyq', 'emails')\n"
            "cli.parse(['consume', '-q', 'q', '--handler', 'pkg.mod:fn'])\n"
            "logs.setup_logging('info', 'auto', None, False)")
    lazy = ("notifyq.produce.producer", "notifyq.produce.lines", "notifyq.store.inserts", "logging.handlers",
            # python-daemon is for --daemon; sd_notify's socket only under systemd; uuid (and the
            # platform module it loads) not at all: each costs every consumer process its import
            "daemon", "socket", "uuid", "importlib.metadata", "shutil",
            # hashlib (OpenSSL's) only hashes lock names that are not plain and [shards] keys
            "hashlib")
    assert loaded_after(code, lazy) == set()
    # (and the probe can fail: a producer loads them)
    assert loaded_after("import notifyq.produce.producer", lazy) >= {"notifyq.produce.producer",
                                                                       "notifyq.store.inserts"}


def test_the_check_sees_them_once_metrics_and_cron_are_used():
    # The probe above must be able to fail: using the features loads the modules.
    code = ("import datetime as dt\n"
            "from notifyq.consume import periodic\n"
            "from notifyq.ops import metrics\n"
            "periodic.latest_tick('* * * * *', dt.datetime.now(dt.timezone.utc))\n"
            "metrics.MetricsServer(('127.0.0.1', 0), metrics.ServiceCollector(None, None), bool).httpd.server_close()")
    assert loaded_after(code) == set(HEAVY)


def test_the_lazy_public_names_resolve_to_the_real_objects():
    from notifyq.consume import service
    from notifyq.consume.supervisor import Supervisor
    from notifyq.produce import producer as one_server
    from notifyq.sharding import producer
    from notifyq.sharding import service as sharded_service

    # notifyq.Producer is sharding's composition of one-server producers (one without [shards]),
    # as ConsumerService is: no __new__ handing back another class
    assert notifyq.Producer is producer.Producer and not issubclass(notifyq.Producer, one_server.Producer)
    assert "__new__" not in vars(notifyq.Producer)
    # notifyq.ConsumerService is sharding's composition of one-server services (one without [shards])
    assert notifyq.ConsumerService is sharded_service.ConsumerService
    assert issubclass(notifyq.ConsumerService, Supervisor)
    assert notifyq.ConsumeOptions is service.ConsumeOptions
    assert set(notifyq.__all__) <= set(dir(notifyq))
    namespace: dict = {}
    exec("from notifyq import *", namespace)
    assert set(notifyq.__all__) <= set(namespace)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        notifyq.Nope  # noqa: B018
