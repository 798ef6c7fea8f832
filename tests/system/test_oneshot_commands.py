"""One-shot commands (status, init, pause, resume, jobs, produce) as a new user meets them: an
unreachable server costs a few seconds and one line naming host:port; success prints the
result and no log lines; a pause of a queue nobody used says so."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid

import pytest
from conftest import admin_connect, notifyq_cmd, run_cli

from notifyq import errors
from notifyq.store import schema

ONESHOT = [("status",), ("init",), ("pause", "-q", "q"), ("resume", "-q", "q"), ("jobs", "list"),
           ("jobs", "show", "1"), ("produce", "-q", "q", "{}")]


@pytest.fixture
def closed_port():
    """A port bound but not listening: connections are refused, deterministically."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def unreachable(db, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in db.env.items() if k != "NOTIFYQ_CONNECT_RETRY_S"}
    return {**env, "NOTIFYQ_DSN": f"mysql://nq_runtime@127.0.0.1:{port}/{db.dsn.database}", **extra}


def assert_one_unreachable_line(result, port: int) -> str:
    assert result.returncode == errors.EXIT_DB, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(f"notifyq: error: cannot reach the database server at 127.0.0.1:{port}: "), line
    assert "Can't connect" in line  # the reason, as the driver gives it
    assert "/mysql" not in line  # init connects without a database; it never names `mysql`
    return line


@pytest.mark.parametrize("args", ONESHOT, ids=" ".join)
def test_a_one_shot_command_honours_connect_retry_0_and_fails_at_once_with_one_line(db, closed_port, args):
    # Given a server nobody listens for, and NOTIFYQ_CONNECT_RETRY_S=0
    env = unreachable(db, closed_port, NOTIFYQ_CONNECT_RETRY_S="0")
    # When a one-shot command runs
    started = time.monotonic()
    result = run_cli(env, *args)
    took = time.monotonic() - started
    # Then it fails at once (one attempt) with one line naming host:port and the reason
    assert_one_unreachable_line(result, closed_port)
    assert took < 4.5, took  # the 5 s default would show here


@pytest.mark.parametrize("args", [("status",), ("init",)], ids=" ".join)
def test_a_one_shot_command_gives_up_after_a_few_seconds_by_default(db, closed_port, args):
    # Given a server nobody listens for, and no connect_retry_s set anywhere
    env = unreachable(db, closed_port)
    # When a one-shot command runs
    started = time.monotonic()
    result = run_cli(env, *args)
    took = time.monotonic() - started
    # Then it retried quietly for the short one-shot default (5 s), not a daemon's 30 s
    line = assert_one_unreachable_line(result, closed_port)
    assert "retried for 5 s" in line
    assert 4.5 <= took < 12.0, took


def test_connect_retry_s_sets_how_long_a_one_shot_command_retries(db, closed_port):
    # Given NOTIFYQ_CONNECT_RETRY_S=1.5
    env = unreachable(db, closed_port, NOTIFYQ_CONNECT_RETRY_S="1.5")
    started = time.monotonic()
    result = run_cli(env, "jobs", "list")
    took = time.monotonic() - started
    # Then `jobs list` retried for that long (not its old fixed 10 s), still printing one line
    assert "retried for 1.5 s" in assert_one_unreachable_line(result, closed_port)
    assert 1.5 <= took < 8.0, took


def test_retries_of_a_one_shot_command_are_shown_with_log_level_debug(db, closed_port):
    env = unreachable(db, closed_port, NOTIFYQ_CONNECT_RETRY_S="0.5")
    result = run_cli(env, "--log-level", "debug", "status")
    assert result.returncode == errors.EXIT_DB
    assert "database error, retrying what=connect status attempt=1" in result.stderr


def test_one_shot_commands_are_quiet_on_success_and_log_only_when_asked(db):
    # Given a database that does not exist yet, and root's DSN for it
    name = f"nq_t_{uuid.uuid4().hex[:12]}"
    env = {**db.env, "NOTIFYQ_DSN": f"mysql://root@{db.admin.host}:{db.admin.port}/{name}"}
    env.pop("NOTIFYQ_PASSWORD")
    try:
        # When a new user runs the quick start's one-shot commands
        results = [run_cli(env, "init"),
                   run_cli(env, "produce", "-q", "emails", '{"to": "a@example.com"}'),
                   run_cli(env, "produce", "-q", "emails", input='{"n": 1}\n{"n": 2}\n'),
                   run_cli(env, "status"),
                   run_cli(env, "pause", "-q", "emails"),
                   run_cli(env, "resume", "-q", "emails"),
                   run_cli(env, "jobs", "list")]
        # Then each prints its result and nothing on stderr: no "applying migration",
        # "producer started" or "batch enqueued" lines
        for result in results:
            assert result.returncode == 0, result.stderr
            assert result.stderr == "", result.args
            assert result.stdout.strip()
        assert f"version none -> {schema.code_version()}" in results[0].stdout
        # And with --log-level info the log lines are there
        again = run_cli(env, "--log-level", "info", "produce", "-q", "emails", input='{"n": 3}\n')
        assert "producer started" in again.stderr
    finally:
        conn = admin_connect(db.admin)
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()


def test_init_with_log_level_info_shows_the_migrations(db):
    name = f"nq_t_{uuid.uuid4().hex[:12]}"
    env = {**db.env, "NOTIFYQ_DSN": f"mysql://root@{db.admin.host}:{db.admin.port}/{name}"}
    env.pop("NOTIFYQ_PASSWORD")
    try:
        result = run_cli(env, "--log-level", "info", "init")
        assert result.returncode == 0, result.stderr
        assert "applying migration version=1" in result.stderr
    finally:
        conn = admin_connect(db.admin)
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()


def test_pause_of_a_queue_never_seen_says_it_was_created_paused(db):
    # Given a queue name nothing has used
    first = run_cli(db.env, "pause", "-q", "typo-queue")
    # Then pausing it says it was created, paused (a typo does not pass in silence)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "typo-queue: created paused (no job or consumer had used this queue yet)"
    # And once it exists, pause and resume are the plain answers
    assert run_cli(db.env, "pause", "-q", "typo-queue").stdout.strip() == "typo-queue: paused"
    assert run_cli(db.env, "resume", "-q", "typo-queue").stdout.strip() == "typo-queue: resumed"
    assert db.scalar("SELECT paused FROM nq_queue WHERE queue = 'typo-queue'") == 0


def test_status_shows_ages_in_human_units_and_seconds_in_json(db):
    # Given a job that has waited 200 s and one due in 2 hours
    db.query("INSERT INTO nq_queue (queue) VALUES ('aged')")
    db.query("INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload) "
             "VALUES ('aged', 0, 0, NOW(6) - INTERVAL 200 SECOND, 5, '{}'), "
             "('aged', 1, 0, NOW(6) + INTERVAL 7500 SECOND, 5, '{}')")
    table = run_cli(db.env, "status")
    as_json = run_cli(db.env, "status", "--json")
    assert table.returncode == 0 and as_json.returncode == 0, table.stderr + as_json.stderr
    lines = table.stdout.splitlines()
    head = lines[0].split()
    row = dict(zip(head, next(line.split() for line in lines if line.startswith("aged"))))
    # Then the table says 3m20s and 2h04m (or 2h05m), the JSON keeps seconds (columns by name:
    # a new state's column must not move them)
    assert row["oldest_ready"] in ("3m20s", "3m21s", "3m22s"), row
    assert row["next_due"] in ("2h04m", "2h05m"), row

    figures = json.loads(as_json.stdout)["queues"]["aged"]
    assert 199 <= figures["oldest_ready_age_s"] < 260
    assert 7400 < figures["next_due_in_s"] <= 7500


@pytest.mark.parametrize("args", [("config",), ("status",), ("jobs", "list")])
def test_output_whose_reader_has_gone_ends_quietly_with_exit_0(db, args):
    # Given a pipe whose reader has gone, as after `| head -1` read its line
    read_end, write_end = os.pipe()
    os.close(read_end)
    # When a command writes its answer there
    try:
        result = subprocess.run(notifyq_cmd(*args), env=db.env, stdout=write_end, stderr=subprocess.PIPE,
                                text=True, timeout=60)
    finally:
        os.close(write_end)
    # Then it ends with exit 0 and says nothing: no traceback about the pipe
    assert (result.returncode, result.stderr) == (errors.EXIT_OK, "")
