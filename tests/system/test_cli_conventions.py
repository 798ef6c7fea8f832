"""CLI conventions through the real command: global options anywhere, --config, usage errors,
bad values refused in one line before anything is written, what a --command child sees, and
what a consumer logs about failures and about itself."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import RUNTIME_PASSWORD, notifyq_cmd, run_cli, wait_until

from notifyq import errors

TABLES = ("nq_job", "nq_queue", "nq_signal", "nq_consumer", "nq_periodic")


def one_line(result: subprocess.CompletedProcess, code: int, mentions: str = "") -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("notifyq: error: "), result.stderr
    assert mentions in lines[0], lines[0]
    return lines[0]


def nothing_written(db) -> bool:
    return all(db.scalar(f"SELECT COUNT(*) FROM {t}") == 0 for t in TABLES)


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / f"nq-{time.monotonic_ns()}.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path


def dsn_with_password(db, password: str) -> str:
    d = db.dsn
    return f"mysql://{d.user}:{password}@{d.host}:{d.port}/{d.database}"


# ------------------------------------------------------------------ 14.6 global options


def test_global_options_work_before_and_after_the_command_and_config_names_a_file(db, tmp_path):
    # Given no DSN in the environment, and a config file that names the test database
    env = {k: v for k, v in db.env.items() if k != "NOTIFYQ_DSN"}
    env["NOTIFYQ_CONFIG"] = "/dev/null"
    url = dsn_with_password(db, RUNTIME_PASSWORD).replace(f":{RUNTIME_PASSWORD}@", "@")
    cfg = config_file(tmp_path, f'dsn = "{url}"\n[log]\nlevel = "warning"\n')
    # When the DSN or the file is given after the command, or before it
    for args in (["status", "--dsn", url], ["--dsn", url, "status"], ["status", "--config", str(cfg)],
                 ["--config", str(cfg), "status"], ["jobs", "list", "--dsn", url], ["jobs", "--dsn", url, "list"]):
        result = run_cli(env, *args)
        # Then each works
        assert result.returncode == 0, (args, result.stderr)
    # And `config` shows the file's values with --config given after the command
    shown = json.loads(run_cli(env, "config", "--json", "--config", str(cfg)).stdout)
    assert shown["log"]["level"] == "warning" and shown["sources"] == [str(cfg)]
    # And a --config that does not exist is one line, exit 2
    one_line(run_cli(env, "status", "--config", str(tmp_path / "nope.toml")), errors.EXIT_USAGE, "does not exist")


@pytest.mark.parametrize("args", [("produce", "{}"), ("consume", "--handler", "nqhandlers:record"), ("pause",),
                                  ("resume",)])
def test_a_missing_queue_is_a_usage_error_in_one_line(db, args):
    one_line(run_cli(db.env, *args), errors.EXIT_USAGE, "-q")
    assert nothing_written(db)


@pytest.mark.parametrize("args", [("produce", "-q", "q", "--dedup-key", "k", "{}", "{}"),
                                  ("produce", "-q", "q", "--dedup-key", "k"),
                                  ("consume", "-q", "q", "--handler", "a:b", "--command", "true")])
def test_a_wrong_combination_of_flags_is_a_usage_error_like_a_missing_one(db, args):
    one_line(run_cli(db.env, *args, input=""), errors.EXIT_USAGE)
    assert nothing_written(db)


def test_the_exit_codes_are_listed_in_help(db):
    out = run_cli(db.env, "--help").stdout
    for code, word in ((2, "usage"), (3, "configuration"), (4, "bad input"), (5, "database"), (6, "schema")):
        assert f"{code}  {word}" in out


# ------------------------------------------------------------------ 13.18 purge needs an age


@pytest.mark.parametrize("age", ["", " ", "abc", "nan", "inf", "9" * 400, "-1d"])
def test_a_purge_with_an_empty_or_invalid_age_deletes_nothing(db, age):
    # Given dead jobs, finished long ago
    run_cli(db.env, "produce", "-q", "p", '{"n": 1}', '{"n": 2}')
    db.query("UPDATE nq_job SET status = 4, finished_at = NOW(6) - INTERVAL 30 DAY")
    # When a purge is given an empty or invalid age
    result = run_cli(db.env, "jobs", "purge", "--dead", "--older-than", age)
    # Then it is refused in one line, and every job is still there
    one_line(result, errors.EXIT_INPUT, "age")
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 2


# ------------------------------------------------------------------ 13.23 queue names


@pytest.mark.parametrize("command", [("produce", "{}"), ("pause",), ("status",), ("jobs", "list")])
def test_a_queue_name_with_a_trailing_newline_is_refused_and_nothing_written(db, command):
    *cmd, = command
    args = [*cmd[:2], "-q", "fz\n", *cmd[2:]] if cmd[0] == "jobs" else [cmd[0], "-q", "fz\n", *cmd[1:]]
    one_line(run_cli(db.env, *args), errors.EXIT_INPUT, "invalid queue name")
    assert nothing_written(db)


# ------------------------------------------------------------------ 13.21 passwords


@pytest.mark.parametrize("password", ["Slash/TailPw9", "Qmark?TailPw9", "Hash#TailPw9", "At@Slash/TailPw9"])
def test_no_part_of_an_unencoded_password_appears_in_any_output(db, password):
    env = {**db.env, "NOTIFYQ_DSN": dsn_with_password(db, password)}
    del env["NOTIFYQ_PASSWORD"]
    for args in (("status",), ("produce", "-q", "q", "{}"), ("config",), ("--dsn", env["NOTIFYQ_DSN"], "status")):
        result = run_cli(env, *args)
        line = one_line(result, errors.EXIT_CONFIG, "percent-encoded")
        for piece in ("Tail", "Slash", "Qmark", "Hash", "Pw9"):
            assert piece not in result.stdout + line, (args, line)
    assert nothing_written(db)


# ------------------------------------------------------------------ 13.22 / 14.7 numbers


@pytest.mark.parametrize("var, value", [("NOTIFYQ_CONNECT_RETRY_S", "nan"), ("NOTIFYQ_CONNECT_RETRY_S", "inf"),
                                        ("NOTIFYQ_POLL_MAX_S", "nan"), ("NOTIFYQ_METRICS_PORT", "70000")])
def test_a_non_finite_or_out_of_range_number_in_the_environment_stops_at_once(db, var, value):
    started = time.monotonic()
    one_line(run_cli({**db.env, var: value}, "status"), errors.EXIT_CONFIG, var)
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("text, key", [("[defaults]\nlease_s = 0\n", "defaults.lease_s"),
                                       ("[queue.q]\nlease_s = -5\n", "queue.q.lease_s"),
                                       ("[consumer]\nshutdown_grace_s = nan\n", "consumer.shutdown_grace_s"),
                                       ("[defaults]\ncommand_timeout_s = inf\n", "defaults.command_timeout_s"),
                                       ("[producer]\nchunk_size = 0\n", "producer.chunk_size"),
                                       ("[wakeup]\nidle_wait_s = -1\n", "wakeup.idle_wait_s")])
def test_a_bad_number_in_the_config_file_is_one_line_naming_the_key_and_the_file(db, tmp_path, text, key):
    path = config_file(tmp_path, text)
    env = {**db.env, "NOTIFYQ_CONFIG": str(path)}
    for args in (("consume", "-q", "q", "--handler", "nqhandlers:record"), ("produce", "-q", "q", "{}")):
        line = one_line(run_cli(env, *args), errors.EXIT_CONFIG, key)
        assert str(path) in line
    assert nothing_written(db)


@pytest.mark.parametrize("flag, value", [("--delay", "nan"), ("--delay", "inf"), ("--delay", "1e12"),
                                         ("--delay", "-1"), ("--priority", "99999"), ("--at", ""),
                                         ("--dedup-key", ""), ("--max-attempts", "0")])
def test_a_bad_flag_value_is_a_usage_error_and_nothing_is_written(db, flag, value):
    one_line(run_cli(db.env, "produce", "-q", "q", flag, value, "{}"), errors.EXIT_USAGE, flag)
    assert nothing_written(db)


@pytest.mark.parametrize("flag", ["--log-file", "--pidfile", "--reject-file"])
def test_a_file_in_a_missing_directory_is_refused_before_anything_starts(db, tmp_path, flag):
    missing = str(tmp_path / "no" / "such" / "file")
    one_line(run_cli(db.env, "produce", "-q", "q", flag, missing, input='{"n": 1}\n'), errors.EXIT_USAGE, flag)
    one_line(run_cli({**db.env, "NOTIFYQ_LOG_FILE": missing}, "status"), errors.EXIT_CONFIG, "NOTIFYQ_LOG_FILE")
    assert nothing_written(db)


def test_a_stream_with_rejected_lines_says_how_many_were_written_and_rejected_also_with_print_ids(db):
    result = run_cli(db.env, "produce", "-q", "q", "--print-ids", input='{"n": 1}\n{nope\n{"n": 2}\n')
    assert result.returncode == errors.EXIT_INPUT
    assert len(result.stdout.split()) == 2  # the two ids
    assert result.stderr.splitlines()[-1] == "enqueued 2, rejected 1"


# ------------------------------------------------------------------ 14.6 --command environment


def test_a_per_batch_command_gets_the_job_ids_and_no_secret_of_notifyq(db, tmp_path):
    # Given jobs, and a consumer whose DSN holds the password, running a per-batch command
    ids = [int(x) for x in run_cli(db.env, "produce", "-q", "c", '{"n": 1}', '{"n": 2}').stdout.split()]
    out = tmp_path / "env.json"
    command = f"""python3 -c 'import json, os; json.dump(dict(os.environ), open("{out}", "w"))'"""
    env = {**db.env, "NOTIFYQ_DSN": dsn_with_password(db, RUNTIME_PASSWORD), "NOTIFYQ_PASSWORD_FILE": "",
           "NOTIFYQ_CONFIG": str(config_file(tmp_path, "[defaults]\nbatch_size = 10\n"))}
    result = run_cli(env, "consume", "-q", "c", "--command", command, "--per-batch", "--exit-when-empty")
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())
    # Then it got the batch's ids, and neither the password nor a DSN holding it
    assert sorted(map(int, seen["NOTIFYQ_JOB_IDS"].split())) == ids and seen["NOTIFYQ_QUEUE"] == "c"
    assert "NOTIFYQ_PASSWORD" not in seen and "NOTIFYQ_DSN" not in seen
    assert RUNTIME_PASSWORD not in json.dumps(seen)


# ------------------------------------------------------------------ 14.4 / 14.5 what a consumer logs

FAST = "[defaults]\nmax_attempts = 2\nretry_base_s = 0.05\nretry_max_s = 0.1\n[wakeup]\npoll_max_s = 0.1\n"


def consume_log(db, tmp_path, config: str, *args: str) -> str:
    env = {**db.env, "NOTIFYQ_CONFIG": str(config_file(tmp_path, config))}
    env.pop("JOURNAL_STREAM", None)
    err = tmp_path / f"consume-{time.monotonic_ns()}.err"
    with err.open("w") as f:
        proc = subprocess.Popen(notifyq_cmd("consume", *args), env=env, stdout=subprocess.DEVNULL, stderr=f)
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 4") == 1, 30,
                   message="the job dead")
    finally:
        proc.terminate()
        proc.wait(30)
    return err.read_text()


def test_a_handler_failure_is_logged_once_per_attempt_with_what_happens_next_and_the_traceback(db, tmp_path):
    # Given a job whose handler raises every time, with 2 attempts
    (job,) = run_cli(db.env, "produce", "-q", "f", "--max-attempts", "2", "{}").stdout.split()
    # When a consumer runs it until it is dead
    log = consume_log(db, tmp_path, FAST, "-q", "f", "--handler", "nqhandlers:fail_always")
    failed = [ln for ln in log.splitlines() if "job failed, retrying" in ln]
    dead = [ln for ln in log.splitlines() if "job dead" in ln]
    # Then the first attempt says when it is retried, the second that it is dead, each with the
    # job id, queue, attempt and the handler's traceback, once each
    assert len(failed) == 1 and len(dead) == 1, log
    assert f"job={job}" in failed[0] and "queue=f" in failed[0] and "attempt=1/2" in failed[0]
    assert 'next="retry at 20' in failed[0] and "level=warning" in failed[0]
    assert "attempt=2/2" in dead[0] and "next=dead" in dead[0] and "level=error" in dead[0]
    for line in failed + dead:
        assert "traceback=\"Traceback (most recent call last):\\n" in line
        assert "nqhandlers.py" in line and "RuntimeError: boom on attempt" in line


def test_a_command_failure_logs_its_exit_status_and_the_tail_of_its_stderr(db, tmp_path):
    run_cli(db.env, "produce", "-q", "cf", "--max-attempts", "2", "{}")
    command = "sh -c 'echo first line >&2; echo disk full >&2; exit 3'"
    log = consume_log(db, tmp_path, FAST, "-q", "cf", "--command", command)
    (dead,) = [ln for ln in log.splitlines() if "job dead" in ln]
    assert 'error="exit status 3: first line\\ndisk full"' in dead


def test_a_consumer_logs_one_start_line_and_a_periodic_summary_also_when_idle(db, tmp_path):
    env = {**db.env, "NOTIFYQ_CONFIG": str(config_file(tmp_path, "[log]\nsummary_s = 0.3\n"))}
    err = tmp_path / "consume.err"
    with err.open("w") as f:
        proc = subprocess.Popen(notifyq_cmd("consume", "-q", "s", "--handler", "nqhandlers:record", "--workers", "3"),
                                env=env, stdout=subprocess.DEVNULL, stderr=f)
    try:
        wait_until(lambda: err.read_text().count("consumer summary") >= 2, 30, message="two summaries")
    finally:
        proc.terminate()
        proc.wait(30)
    lines = err.read_text().splitlines()
    assert sum("consumer started" in ln for ln in lines) == 1
    assert not any("worker started" in ln for ln in lines)
    summaries = [ln for ln in lines if "consumer summary" in ln]
    assert all("level=info" in ln and "idle=yes" in ln and "done=0" in ln for ln in summaries)
