"""Bad input and bad setups through the real CLI: one clear line on stderr, the exit code
errors.py documents, no traceback, and nothing written. Then the jobs that go wrong at run time
(handlers raising, commands timing out, poison jobs) end dead with their last error, and the
password never shows: not in `notifyq config`, error lines, logs or the process's command line.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import RUNTIME_PASSWORD, notifyq_cmd, run_cli, wait_until

from notifyq import errors
from notifyq.store import schema

TABLES = ("nq_job", "nq_queue", "nq_signal", "nq_consumer", "nq_periodic")


def assert_one_line_error(result: subprocess.CompletedProcess, code: int, *, mentions: str = "") -> str:
    assert result.returncode == code, f"exit {result.returncode}, stderr: {result.stderr}"
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {result.stderr}"
    assert lines[0].startswith("notifyq: error: ")
    assert mentions.lower() in lines[0].lower()
    return lines[0]


def row_counts(db) -> dict[str, int]:
    return {t: db.scalar(f"SELECT COUNT(*) FROM {t}") for t in TABLES}


def nothing_written(db) -> bool:
    return set(row_counts(db).values()) == {0}


def with_config(db, tmp_path: Path, text: str, mode: int = 0o600) -> dict[str, str]:
    path = tmp_path / f"nq-{time.monotonic_ns()}.toml"
    path.write_text(text)
    path.chmod(mode)
    return {**db.env, "NOTIFYQ_CONFIG": str(path)}


def dsn_with_password(db, password: str = RUNTIME_PASSWORD, port: int | None = None) -> str:
    d = db.dsn
    return f"mysql://{d.user}:{password}@{d.host}:{port or d.port}/{d.database}"


# ------------------------------------------------------------------ producing


def test_an_invalid_json_argument_refuses_the_whole_put_with_exit_4(db):
    # Given two payloads, the second not JSON
    # When they are produced together
    result = run_cli(db.env, "produce", "-q", "q", '{"ok": 1}', "{nope")
    # Then exit 4 names the bad argument, and not even the good one is written
    assert_one_line_error(result, errors.EXIT_INPUT, mentions="argument 2 is not valid JSON")
    assert nothing_written(db)


def test_an_oversize_payload_is_refused_with_exit_4(db, tmp_path):
    # Given a 100-byte payload limit
    env = with_config(db, tmp_path, "[producer]\nmax_payload_bytes = 100\n")
    # When a 200-byte payload is produced
    result = run_cli(env, "produce", "-q", "q", '"' + "x" * 198 + '"')
    # Then it is refused and nothing is written
    assert_one_line_error(result, errors.EXIT_INPUT, mentions="over the 100-byte limit")
    assert nothing_written(db)


def test_a_stream_rejects_bad_lines_by_number_and_enqueues_the_good_ones_with_exit_4(db, tmp_path):
    # Given a stream with an invalid line and an oversize line between good ones
    env = with_config(db, tmp_path, "[producer]\nmax_payload_bytes = 100\n")
    lines = '{"n": 1}\n{nope\n"' + "x" * 198 + '"\n{"n": 2}\n'
    # When it is produced
    result = run_cli(env, "produce", "-q", "q", input=lines)
    # Then both bad lines are reported by number, the two good lines are enqueued, and exit is 4
    assert result.returncode == errors.EXIT_INPUT
    assert "Traceback" not in result.stderr
    rejected = [ln for ln in result.stderr.splitlines() if ln.startswith("notifyq: rejected line")]
    assert [ln.split(":")[1] for ln in rejected] == [" rejected line 2", " rejected line 3"]
    assert result.stdout.strip() == "enqueued 2, rejected 2"
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 2


@pytest.mark.parametrize("queue", ["", "semi;colon", "x" * 65])
def test_an_invalid_queue_name_is_refused_with_exit_4_by_every_command(db, queue):
    # Given an invalid queue name
    for command in (("produce", "{}"), ("consume", "--handler", "nqhandlers:record"), ("status",), ("pause",)):
        # When a command is given it
        result = run_cli(db.env, command[0], "-q", queue, *command[1:])
        # Then it is refused before anything is written
        assert_one_line_error(result, errors.EXIT_INPUT, mentions="invalid queue name")
    assert nothing_written(db)


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize("text, mentions", [
    ("bogus = 1\n", "unknown config key(s) bogus"),
    ("[consumer]\nreap_intervall_s = 1\n", "consumer: unknown key(s) reap_intervall_s"),
    ("[queue.q]\nhandlr = 'x:y'\n", "queue.q: unknown key(s) handlr"),
    ("[tls]\nkey2 = 'x'\n", "tls: unknown key(s) key2"),
    ("[consumer]\nreap_interval_s = 'fast'\n", "consumer.reap_interval_s: expected a number"),
    ("connect_retry_s = -1\n", "connect_retry_s"),
    ("[consumer\n", "invalid TOML"),
])
def test_a_config_file_with_an_unknown_key_or_a_wrong_value_stops_every_command_with_exit_3(
        db, tmp_path, text, mentions):
    # Given a config file with a typo
    env = with_config(db, tmp_path, text)
    # When notifyq is run
    for args in (("config",), ("consume", "-q", "q", "--handler", "x:y")):
        result = run_cli(env, *args)
        # Then it stops with exit 3, naming the key, before touching the database
        assert_one_line_error(result, errors.EXIT_CONFIG, mentions=mentions)
    assert nothing_written(db)


@pytest.mark.parametrize("dsn, mentions", [
    ("http://nq:TopSecret1@localhost/db", "bad DSN: expected mysql://"),
    ("mysql://nq:TopSecret1@localhost:port/db", "the port must be a number"),
    ("mysql://nq:TopSecret1@localhost/bad-name!", "invalid database name"),
    ("mysql://nq:TopSecret1@localhost/db?bogus=1", "unknown option(s) bogus"),
])
def test_a_bad_dsn_is_refused_with_exit_3_without_echoing_its_password(db, dsn, mentions):
    # Given a malformed DSN holding a password
    env = {**db.env, "NOTIFYQ_DSN": dsn}
    # When a command is run
    result = run_cli(env, "produce", "-q", "q", "{}")
    # Then it is refused with exit 3, and the password is not repeated
    line = assert_one_line_error(result, errors.EXIT_CONFIG, mentions=mentions)
    assert "TopSecret1" not in line


# ------------------------------------------------------------------ the database


def test_a_wrong_password_is_refused_at_once_with_exit_5_and_neither_password_shown(db):
    # Given the runtime user with a wrong password
    env = {**db.env, "NOTIFYQ_PASSWORD": "Wrong-Secret-42"}
    for args in (("produce", "-q", "q", "{}"), ("consume", "-q", "q", "--handler", "nqhandlers:record"),
                 ("status",)):
        # When a command starts
        started = time.monotonic()
        result = run_cli(env, *args)
        # Then the login failure is not retried: one line, exit 5, no password in it
        line = assert_one_line_error(result, errors.EXIT_DB, mentions="refused user 'nq_runtime'")
        assert time.monotonic() - started < 10
        assert "Wrong-Secret-42" not in result.stderr + result.stdout
        assert RUNTIME_PASSWORD not in line
    assert nothing_written(db)


@pytest.fixture
def closed_port():
    """A port bound but not listening: connections are refused, deterministically."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


# One-shot commands (status, produce with arguments ...) retry quietly: test_oneshot_commands.py.
@pytest.mark.parametrize("args", [("consume", "-q", "q", "--handler", "nqhandlers:record"),
                                  ("produce", "-q", "q", "--follow", "--input", "/dev/null")])
def test_a_database_down_at_start_is_retried_with_backoff_then_fails_with_exit_5(db, closed_port, args):
    # Given a DSN (with a password) pointing at a port nobody listens on, and a 1.5 s retry window
    env = {**db.env, "NOTIFYQ_DSN": dsn_with_password(db, port=closed_port), "NOTIFYQ_CONNECT_RETRY_S": "1.5"}
    del env["NOTIFYQ_PASSWORD"]
    # When a command starts
    started = time.monotonic()
    result = run_cli(env, *args)
    took = time.monotonic() - started
    # Then it retried for the window, several times, and then failed with one clear error line
    assert result.returncode == errors.EXIT_DB, result.stderr
    assert 1.5 <= took < 20.0
    lines = result.stderr.splitlines()
    assert lines[-1].startswith(f"notifyq: error: cannot reach the database server at 127.0.0.1:{closed_port}: ")
    retries = [ln for ln in lines[:-1] if "retrying" in ln]
    assert len(retries) >= 2 and len(retries) == len(lines) - 1, result.stderr
    assert "Traceback" not in result.stderr
    assert RUNTIME_PASSWORD not in result.stderr + result.stdout


def test_a_database_without_the_schema_is_refused_with_exit_6_by_every_command(db):
    # Given the notifyq tables dropped (the runtime user keeps its grants on them)
    tables = [r[0] for r in db.query("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s",
                                      (db.admin.database,))]
    assert "nq_meta" in tables and "nq_job" in tables
    db.query("DROP TABLE " + ", ".join(tables))
    for args in (("produce", "-q", "q", "{}"), ("consume", "-q", "q", "--handler", "nqhandlers:record"),
                 ("status",), ("pause", "-q", "q")):
        # When a command starts
        result = run_cli(db.env, *args)
        # Then it points at `notifyq init`, with exit 6
        assert_one_line_error(result, errors.EXIT_SCHEMA, mentions="no notifyq schema: run `notifyq init`")
    assert db.scalar("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s",
                     (db.admin.database,)) == 0


@pytest.mark.parametrize("version, mentions", [("999", "is newer than this notifyq's"),
                                               ("0", "is older than this notifyq's")])
def test_a_schema_of_another_version_is_refused_with_exit_6(db, version, mentions):
    # Given a schema version this code was not written for
    db.query("UPDATE nq_meta SET value = %s WHERE name = 'schema_version'", (version,))
    for args in (("produce", "-q", "q", "{}"), ("consume", "-q", "q", "--handler", "nqhandlers:record"),
                 ("status",)):
        # When a command starts
        result = run_cli(db.env, *args)
        # Then it refuses with exit 6 and writes nothing
        assert_one_line_error(result, errors.EXIT_SCHEMA, mentions=mentions)
    assert nothing_written(db)


def test_init_refuses_to_touch_a_newer_schema_with_exit_6(db):
    # Given a schema newer than this code
    db.query("UPDATE nq_meta SET value = '999' WHERE name = 'schema_version'")
    # When `notifyq init` runs as the admin user
    env = {**db.env, "NOTIFYQ_DSN": f"mysql://{db.admin.user}@{db.admin.host}:{db.admin.port}/{db.admin.database}"}
    del env["NOTIFYQ_PASSWORD"]
    result = run_cli(env, "init")
    # Then it refuses, and the version stays as it was
    assert_one_line_error(result, errors.EXIT_SCHEMA, mentions="newer")
    assert db.scalar("SELECT value FROM nq_meta WHERE name = 'schema_version'") == "999"


@pytest.mark.parametrize("version, supported", [
    ("10.11.19-MariaDB-0+deb12u1", True),
    ("5.5.5-10.11.19-MariaDB-0+deb12u1", True),  # MariaDB 10's handshake, as libmysqlclient reports it
    ("10.6.0-MariaDB", True),
    ("11.4.2-MariaDB-log", True),
    ("8.0.1", True),
    ("8.4.3", True),
    ("9.1.0-commercial", True),
    ("10.5.22-MariaDB", False),
    ("5.5.5-10.5.2-MariaDB", False),
    ("10.3.39-MariaDB-0+deb10u1", False),
    ("8.0.0-dmr", False),
    ("5.7.44-log", False),
    ("8.0.11-TiDB-v7.5.0", False),  # TiDB reads past SKIP LOCKED rows instead of skipping them
])
def test_check_server_refuses_servers_without_skip_locked(version, supported):
    # Given a server version string
    # When it is checked
    if supported:
        schema.check_server(version)
    else:
        # Then a server without a real SKIP LOCKED is refused with exit code 7
        with pytest.raises(errors.UnsupportedServer) as raised:
            schema.check_server(version)
        assert raised.value.exit_code == errors.EXIT_SERVER == 7


# ------------------------------------------------------------------ handlers


@pytest.mark.parametrize("spec, mentions", [
    ("nosuchmodule:handle", "cannot import nosuchmodule"),
    ("nqhandlers:no_such_function", "has no attribute no_such_function"),
    ("nqhandlers", "expected pkg.module:function"),
    ("nqhandlers:_files", "is not callable"),
    ("broken_at_import:handle", "import-time boom"),
    ("exits_at_import:handle", "called sys.exit(7)"),
])
def test_a_handler_that_cannot_be_loaded_stops_the_consumer_with_exit_8(db, tmp_path, spec, mentions):
    # Given a handler spec that does not resolve to a callable (one module raises on import)
    (tmp_path / "broken_at_import.py").write_text("raise RuntimeError('import-time boom')\n")
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(7)\n")
    env = {**db.env, "PYTHONPATH": f"{db.env['PYTHONPATH']}{os.pathsep}{tmp_path}"}
    # When a consumer starts with it
    result = run_cli(env, "consume", "-q", "q", "--handler", spec)
    # Then it exits 8 before registering or claiming anything
    assert_one_line_error(result, errors.EXIT_HANDLER, mentions=mentions)
    assert nothing_written(db)


@pytest.mark.parametrize("command, mentions", [("no-such-command-xyz --flag", "command not found: no-such-command-xyz"),
                                               ("'unbalanced", "No closing quotation")])
def test_a_command_that_cannot_run_stops_the_consumer_with_exit_8(db, command, mentions):
    # Given a command handler that does not exist (or cannot be parsed)
    # When a consumer starts with it
    result = run_cli(db.env, "consume", "-q", "q", "--command", command)
    # Then it exits 8
    assert_one_line_error(result, errors.EXIT_HANDLER, mentions=mentions)
    assert nothing_written(db)


class Consumer:
    def __init__(self, env: dict[str, str], tmp_path: Path, *args: str):
        self.err = tmp_path / f"consume-{time.monotonic_ns()}.err"
        with self.err.open("w") as f:
            self.proc = subprocess.Popen(notifyq_cmd("consume", *args), env=env, stdout=subprocess.DEVNULL,
                                         stderr=f, text=True)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()

    def log(self) -> str:
        return self.err.read_text()


def _job(db, job_id: int) -> dict:
    cols = ("status", "attempts", "last_error", "finished_at", "owner")
    row = db.query(f"SELECT {', '.join(cols)} FROM nq_job WHERE id = %s", (job_id,))[0]
    return dict(zip(cols, row))


def _put(env, queue: str, payload: str = "{}") -> int:
    result = run_cli(env, "produce", "-q", queue, payload)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


FAST_RETRIES = "[defaults]\nmax_attempts = 3\nretry_base_s = 0.05\nretry_max_s = 0.1\n" \
               "[wakeup]\npoll_max_s = 0.1\n[consumer]\nreap_interval_s = 0.5\n"


def test_a_handler_that_always_raises_is_retried_then_the_job_dies_with_its_last_error(db, tmp_path):
    # Given a job for a handler that raises every time, 3 attempts, short backoff
    env = with_config(db, tmp_path, FAST_RETRIES)
    job = _put(env, "poison")
    # When a consumer runs it
    consumer = Consumer(env, tmp_path, "-q", "poison", "--handler", "nqhandlers:fail_always")
    try:
        wait_until(lambda: _job(db, job)["status"] == 4, 30, message="the job dead")
    finally:
        code = consumer.stop()
    # Then it is dead after exactly 3 attempts, with the last error kept, and the consumer lived on
    assert _job(db, job) | {"finished_at": None} == {
        "status": 4, "attempts": 3, "last_error": "RuntimeError: boom on attempt 3", "finished_at": None,
        "owner": None}
    assert _job(db, job)["finished_at"] is not None
    assert code == errors.EXIT_OK
    assert consumer.log().count("job failed, retrying") == 2 and "job dead" in consumer.log()


def test_a_command_that_fails_every_time_ends_dead_with_its_exit_status_and_stderr(db, tmp_path):
    # Given a job for a command that prints an error and exits 3, 2 attempts
    env = with_config(db, tmp_path, FAST_RETRIES + "[queue.cmdfail]\nmax_attempts = 2\n"
                      "command = \"sh -c 'echo disk full >&2; exit 3'\"\n")
    job = _put(env, "cmdfail")
    # When a consumer runs it
    consumer = Consumer(env, tmp_path, "-q", "cmdfail")
    try:
        wait_until(lambda: _job(db, job)["status"] == 4, 30, message="the job dead")
    finally:
        consumer.stop()
    # Then the job is dead after 2 attempts, with the command's exit status and stderr
    assert (_job(db, job)["attempts"], _job(db, job)["last_error"]) == (2, "exit status 3: disk full")


def _processes_with(argument: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if argument.encode() in (entry / "cmdline").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_a_command_timing_out_is_killed_with_its_children_and_the_job_dies(db, tmp_path):
    # Given a job for a command that would run 31.7 s, with a 0.3 s timeout and 1 attempt
    env = with_config(db, tmp_path, FAST_RETRIES + "[queue.slow]\nmax_attempts = 1\n"
                      "command_timeout_s = 0.3\ncommand = \"sh -c 'sleep 31.7; true'\"\n")
    job = _put(env, "slow")
    # When a consumer runs it
    consumer = Consumer(env, tmp_path, "-q", "slow")
    try:
        wait_until(lambda: _job(db, job)["status"] == 4, 30, message="the job dead")
        # Then the command and the sleep it started are gone, well before 31.7 s
        wait_until(lambda: _processes_with("31.7") == [], 5, message="the command's process group killed")
    finally:
        consumer.stop()
    # And the job is dead with the timeout as its last error
    assert (_job(db, job)["attempts"], _job(db, job)["last_error"]) == (1, "command timed out after 0.3s")


def test_a_payload_that_is_not_json_is_buried_at_once_without_calling_the_handler(db, tmp_path):
    # Given a row whose payload is not JSON (written behind notifyq's back)
    env = with_config(db, tmp_path, FAST_RETRIES)
    db.query("INSERT INTO nq_queue (queue) VALUES ('raw')")
    db.query("INSERT INTO nq_job (queue, status, run_at, max_attempts, payload) "
             "VALUES ('raw', 0, NOW(6), 5, '{not json')")
    job = db.scalar("SELECT MAX(id) FROM nq_job")
    out = tmp_path / "runs"
    out.mkdir()
    # When a consumer claims it
    consumer = Consumer({**env, "NQ_TEST_OUT": str(out)}, tmp_path, "-q", "raw", "--handler", "nqhandlers:record")
    try:
        wait_until(lambda: _job(db, job)["status"] == 4, 30, message="the job dead")
    finally:
        consumer.stop()
    # Then it is dead after one attempt, not retried, and the handler never saw it
    state = _job(db, job)
    assert state["attempts"] == 1 and state["last_error"].startswith("payload is not valid JSON")
    assert list(out.glob("*.log")) == []


def test_a_job_that_kills_its_consumer_every_time_still_ends_dead_after_max_attempts(db, tmp_path):
    # Given a handler that SIGKILLs its own consumer, and a job allowed 2 attempts
    (tmp_path / "suicidal.py").write_text("import os, signal\n\ndef handle(job):\n"
                                          "    os.kill(os.getpid(), signal.SIGKILL)\n")
    env = with_config(db, tmp_path, FAST_RETRIES + "[queue.deadly]\nmax_attempts = 2\n")
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}{os.pathsep}{tmp_path}"
    job = _put(env, "deadly")
    # When consumers are started one after the other, each killed by the job
    for attempt in (1, 2):
        consumer = Consumer(env, tmp_path, "-q", "deadly", "--handler", "suicidal:handle")
        assert consumer.proc.wait(30) == -signal.SIGKILL
        assert _job(db, job)["attempts"] == attempt
    # Then the next consumer's reaper buries the job instead of running it a third time
    survivor = Consumer(env, tmp_path, "-q", "deadly", "--handler", "suicidal:handle")
    try:
        wait_until(lambda: _job(db, job)["status"] == 4, 30, message="the job dead")
        assert survivor.proc.poll() is None
    finally:
        assert survivor.stop() == errors.EXIT_OK
    assert _job(db, job)["last_error"] == "consumer died; out of attempts"
    assert db.scalar("SELECT COUNT(*) FROM nq_consumer") == 0


# ------------------------------------------------------------------ the password


def test_notifyq_config_never_prints_the_password_from_any_source(db, tmp_path):
    secret = "Cfg-Secret-77"
    pw_file = tmp_path / "pw"
    pw_file.write_text(secret + "\n")
    pw_file.chmod(0o600)
    sources = {
        "dsn url": {"NOTIFYQ_DSN": dsn_with_password(db, secret)},
        "environment": {"NOTIFYQ_PASSWORD": secret},
        "password_file": {"NOTIFYQ_PASSWORD_FILE": str(pw_file)},
        "config file": with_config(db, tmp_path, f'dsn = "{dsn_with_password(db, secret)}"\n'),
    }
    for name, extra in sources.items():
        # Given the password from one source
        env = {**db.env, **extra}
        for args in (("config",), ("config", "--json")):
            # When the effective config is printed
            result = run_cli(env, *args)
            # Then the DSN shows *** and the secret appears nowhere
            assert result.returncode == 0, (name, result.stderr)
            assert secret not in result.stdout + result.stderr, name
            assert "nq_runtime:***@" in result.stdout, name


def test_a_running_consumer_never_logs_the_password_nor_shows_it_in_its_command_line(db, tmp_path):
    # Given a consumer at debug level whose DSN carries the password, and a failing job
    secret = RUNTIME_PASSWORD
    env = {**with_config(db, tmp_path, FAST_RETRIES), "NOTIFYQ_DSN": dsn_with_password(db, secret),
           "NOTIFYQ_LOG_LEVEL": "debug"}
    del env["NOTIFYQ_PASSWORD"]
    job = _put(env, "leak")
    consumer = Consumer(env, tmp_path, "-q", "leak", "--handler", "nqhandlers:fail_always")
    try:
        # When it runs the job to its death
        wait_until(lambda: _job(db, job)["status"] == 4, 30, message="the job dead")
        cmdline = Path(f"/proc/{consumer.proc.pid}/cmdline").read_bytes()
    finally:
        assert consumer.stop() == errors.EXIT_OK
    # Then its debug log and its command line never show the password
    assert "level=debug" in consumer.log()
    assert secret not in consumer.log()
    assert secret.encode() not in cmdline


@pytest.mark.parametrize("mode, warned", [(0o644, True), (0o604, True), (0o600, False)])
def test_a_config_file_with_a_password_that_others_can_read_draws_a_warning(db, tmp_path, mode, warned):
    # Given a config file holding the password, with these permissions
    env = with_config(db, tmp_path, f'dsn = "{dsn_with_password(db)}"\n', mode=mode)
    del env["NOTIFYQ_PASSWORD"], env["NOTIFYQ_DSN"]
    # When a command reads it
    result = run_cli(env, "status")
    # Then the command works, and warns (once, without the password) only if others can read it
    assert result.returncode == 0, result.stderr
    warnings = [ln for ln in result.stderr.splitlines() if ln.startswith("notifyq: warning:")]
    assert len(warnings) == (1 if warned else 0)
    assert all("readable by other users" in w and RUNTIME_PASSWORD not in w for w in warnings)


def test_a_password_file_that_others_can_read_draws_a_warning(db, tmp_path):
    # Given a world-readable password file
    pw_file = tmp_path / "pw"
    pw_file.write_text(RUNTIME_PASSWORD + "\n")
    pw_file.chmod(0o644)
    env = {**db.env, "NOTIFYQ_PASSWORD_FILE": str(pw_file)}
    del env["NOTIFYQ_PASSWORD"]
    # When a command uses it
    result = run_cli(env, "status")
    # Then it works and warns about the file
    assert result.returncode == 0, result.stderr
    assert f"notifyq: warning: {pw_file} holds a database password and is readable by other users" in result.stderr


def test_the_runtime_user_the_tests_run_as_has_only_dml_on_the_notifyq_tables(db):
    # Given the runtime user every test's producers and consumers log in as
    text = "\n".join(g[0] for g in db.query("SHOW GRANTS FOR %s@%s", (db.dsn.user, "%")))
    # Then it may not create, drop or alter anything, nor reach anything but notifyq tables
    assert "ALL PRIVILEGES" not in text and "CREATE" not in text and "DROP" not in text
    assert "ALTER" not in text and "SUPER" not in text and "CONNECTION ADMIN" not in text
    assert f"ON `{db.admin.database}`.`nq_job`" in text
    assert f"ON `{db.admin.database}`.*" not in text


def test_a_missing_grant_stops_the_consumer_with_exit_3_naming_it_and_gives_its_jobs_back(db, tmp_path):
    """Issue #31: before, the refused ack ended the worker as a bug (`worker failed … (1142, …)`,
    `exiting while holding claimed jobs`, exit 1) and left its jobs claimed until a reaper pass."""
    # Given a runtime user without INSERT on nq_attempt (as after an upgrade that added the table)
    for host in ("%", "localhost"):
        db.query(f"REVOKE INSERT ON `{db.admin.database}`.`nq_attempt` FROM %s@%s", (db.dsn.user, host))
    assert run_cli(db.env, "produce", "-q", "g", "{}", "{}").returncode == 0
    # When a consumer runs the queue's jobs
    result = run_cli({**db.env, "NQ_TEST_OUT": str(tmp_path)}, "consume", "-q", "g",
                     "--handler", "nqhandlers:record")
    # Then it exits 3 (configuration), with one error line naming the refused grant and the fix
    assert result.returncode == errors.EXIT_CONFIG, result.stderr
    refused = [ln for ln in result.stderr.splitlines() if "a grant is missing" in ln]
    assert refused and "INSERT command denied" in refused[0] and "nq_attempt" in refused[0], result.stderr
    assert "notifyq init --print-grants USER" in refused[0]
    assert "Traceback" not in result.stderr and "holding claimed jobs" not in result.stderr
    # And its jobs are given back, ready (uncharged), not left claimed
    assert db.query("SELECT status, claim_token, attempts FROM nq_job") == [(0, None, 0), (0, None, 0)]


def test_a_one_shot_command_refused_for_want_of_a_grant_says_so_in_one_line_with_exit_3(db):
    # Given a runtime user that may not read nq_attempt, and a job
    for host in ("%", "localhost"):
        db.query(f"REVOKE SELECT ON `{db.admin.database}`.`nq_attempt` FROM %s@%s", (db.dsn.user, host))
    job_id = run_cli(db.env, "produce", "-q", "g", "{}").stdout.split()[-1]
    # When `jobs show` reads the job's attempts
    result = run_cli(db.env, "jobs", "show", job_id)
    # Then it is one line naming the refused grant, exit 3
    line = assert_one_line_error(result, errors.EXIT_CONFIG, mentions="a grant is missing")
    assert "SELECT command denied" in line and "nq_attempt" in line
