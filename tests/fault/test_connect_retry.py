"""A daemon started while the server is down: one log line per backoff step, then one that says
the server is back (one-shot commands give up quietly instead: tests/system/test_oneshot_commands.py)."""

from __future__ import annotations

import signal
import time

from conftest import run_cli, wait_until

from .conftest import finished_counts, read_runs, recorder_env


def test_a_consumer_started_while_the_server_is_down_logs_each_retry_and_says_when_it_is_back(
        server, fdb, procs, tmp_path):
    # Given the server down, and a consumer starting with a minute of connect retries
    env = recorder_env(fdb, tmp_path / "out", NOTIFYQ_CONNECT_RETRY_S="60")
    server.stop()
    consumer = procs.consumer(env, "q", handler="nqhandlers:record")
    # When it has retried a few times and the server comes back
    wait_until(lambda: consumer.stderr_text().count("database error, retrying what=connect startup") >= 3,
               30, message="retry lines")
    assert consumer.alive()
    server.start()
    # Then it says so once, and works: a job produced now is run
    wait_until(lambda: "database reachable again what=connect startup" in consumer.stderr_text(), 60,
               message="back line")
    assert run_cli(env, "produce", "-q", "q", "{}").returncode == 0
    wait_until(lambda: finished_counts(read_runs(tmp_path / "out")), 30, message="job ran")
    log = consumer.stderr_text()
    assert log.count("database reachable again") == 1
    retries = [ln for ln in log.splitlines() if "retrying what=connect startup" in ln]
    assert all("level=warning" in ln for ln in retries), retries


def test_sigterm_ends_a_connect_retry_at_once_at_start_and_while_running(server, fdb, procs, tmp_path):
    # Given a consumer started while the server is down, retrying for up to a minute
    env = recorder_env(fdb, tmp_path / "out", NOTIFYQ_CONNECT_RETRY_S="60")
    server.stop()
    starting = procs.consumer(env, "q", handler="nqhandlers:record")
    wait_until(lambda: "retrying what=connect startup" in starting.stderr_text(), 30, message="a retry")
    # When it is asked to stop
    asked = time.monotonic()
    starting.signal(signal.SIGTERM)
    # Then it exits at once, cleanly, instead of at the end of its retries
    assert starting.wait(10) == 0, starting.stderr_text()
    assert time.monotonic() - asked < 3

    # Given a consumer running, whose server then goes away (its sessions retry to reconnect)
    server.start()
    running = procs.consumer(env, "q", handler="nqhandlers:record")
    wait_until(lambda: "consumer started" in running.stderr_text(), 30, message="consumer started")
    server.stop()
    wait_until(lambda: "database error, retrying" in running.stderr_text().split("consumer started", 1)[1],
               30, message="the running consumer retrying")
    asked = time.monotonic()
    running.signal(signal.SIGTERM)
    assert running.wait(15) == 0, running.stderr_text()
    assert time.monotonic() - asked < 5
