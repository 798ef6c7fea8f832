"""Handlers of every kind get what the delivery contract promises, in a live `notifyq consume`:
a coroutine is awaited before its job counts as done, a command keeps its lease while it runs and
dies with the consumer whose grace expired, a huge non-ASCII error is recorded without killing
the worker, and a handler's forked child never runs consumer code.

Python handlers are in tests/helpers/nqunusual.py; the command is a shell script written per test.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from pathlib import Path

from conftest import alive, notifyq_cmd, run_cli, wait_until
from test_job_lifecycle import registered, stderr_of, unsettled
from notifyq import errors

QUEUE = "odd"


def setup(db, tmp_path: Path, config: str = "", grace_s: float = 10) -> dict[str, str]:
    out = tmp_path / "runs"
    out.mkdir(exist_ok=True)
    cfg = tmp_path / "nq.toml"
    cfg.write_text(f"[consumer]\nreap_interval_s = 0.5\nshutdown_grace_s = {grace_s}\n"
                   "[wakeup]\npoll_max_s = 0.2\n" + config)
    return {**db.env, "NQ_TEST_OUT": str(out), "NOTIFYQ_CONFIG": str(cfg)}


def consume(env: dict[str, str], tmp_path: Path, *args: str) -> subprocess.Popen:
    err = (tmp_path / f"consume-{time.monotonic_ns()}.err").open("w")
    return subprocess.Popen(notifyq_cmd("consume", "-q", QUEUE, *args), env=env,
                            stdout=subprocess.DEVNULL, stderr=err, text=True)


def produce(db, payloads: list[dict], *args: str) -> list[int]:
    result = run_cli(db.env, "produce", "-q", QUEUE, *args, *[json.dumps(p) for p in payloads])
    assert result.returncode == 0, result.stderr
    return [int(x) for x in result.stdout.split()]


def records(tmp_path: Path) -> list[tuple[int, str]]:
    """(job, tag) of every line the handlers (or the command) recorded."""
    rows = []
    for path in (tmp_path / "runs").glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            rows.append((int(parts[0]), parts[-1]))
    return rows


def stop(proc: subprocess.Popen, timeout: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


# ------------------------------------------------------------------ async def handlers


def test_a_coroutine_handler_is_awaited_and_its_outcome_is_the_jobs(db, tmp_path):
    # Given a consumer whose handler is an `async def`
    env = setup(db, tmp_path)
    proc = consume(env, tmp_path, "--handler", "nqunusual:run_async")
    try:
        registered(db, 1)
        # When it gets a job that succeeds after an await, and one that raises after an await
        ok, bad = produce(db, [{"n": 1}, {"raise": True}], "--max-attempts", "1")
        wait_until(lambda: unsettled(db) == 0, 30, message="both jobs settled")
        code = stop(proc)
    finally:
        stop(proc, 10)

    # Then the first ran to its end and was acked; the second failed with the coroutine's error
    assert [job for job, tag in records(tmp_path) if tag == "end"] == [ok]
    assert db.query("SELECT id, status, last_error FROM nq_job ORDER BY id") == [
        (bad, 4, "RuntimeError: raised after an await")]
    assert "never awaited" not in stderr_of(tmp_path)
    assert code == errors.EXIT_OK


def test_a_coroutine_batch_handler_is_awaited_and_may_fail_jobs_one_by_one(db, tmp_path):
    # Given a consumer whose per-batch handler is an `async def`
    env = setup(db, tmp_path)
    proc = consume(env, tmp_path, "--handler", "nqunusual:run_async_batch", "--per-batch",
                   "--batch-size", "3")
    try:
        registered(db, 1)
        # When it gets three jobs, one of which it fails after an await
        ids = produce(db, [{"n": 1}, {"raise": True}, {"n": 3}], "--max-attempts", "1")
        wait_until(lambda: unsettled(db) == 0, 30, message="the jobs settled")
        code = stop(proc)
    finally:
        stop(proc, 10)

    # Then the two it did not fail ran and were acked, the third is dead with its reason
    assert sorted(job for job, tag in records(tmp_path) if tag == "end") == [ids[0], ids[2]]
    assert db.query("SELECT id, status, last_error FROM nq_job") == [(ids[1], 4, "failed after an await")]
    assert code == errors.EXIT_OK


# ------------------------------------------------------------------ commands


COMMAND = """#!/bin/sh
# Records its start, its pid and its child's, sleeps in the child, records its end.
echo "$NOTIFYQ_JOB_ID $$ start" >> "$NQ_TEST_OUT/command.log"
if [ -n "$NQ_IGNORE_TERM" ]; then trap '' TERM; fi
sleep "$NQ_TEST_SLEEP" &
echo "$NOTIFYQ_JOB_ID $! child" >> "$NQ_TEST_OUT/command.log"
wait
echo "$NOTIFYQ_JOB_ID $$ end" >> "$NQ_TEST_OUT/command.log"
"""


def command(tmp_path: Path) -> str:
    path = tmp_path / "job.sh"
    path.write_text(COMMAND)
    path.chmod(0o755)
    return str(path)


def command_pids(tmp_path: Path, tag: str) -> list[int]:
    lines = (tmp_path / "runs" / "command.log").read_text().splitlines()
    return [int(line.split()[1]) for line in lines if line.split()[2] == tag]


def test_a_command_longer_than_its_lease_keeps_it_and_runs_once(db, tmp_path):
    # Given two consumers of a queue with a 3 s lease, running a command that takes 8 s
    env = {**setup(db, tmp_path, "[defaults]\nlease_s = 3\ncommand_timeout_s = 60\n"), "NQ_TEST_SLEEP": "8"}
    procs = [consume(env, tmp_path, "--command", command(tmp_path)) for _ in range(2)]
    try:
        registered(db, 2)
        # When one job is produced
        [job] = produce(db, [{"n": 1}])
        log = tmp_path / "runs" / "command.log"

        def starts() -> int:
            return log.read_text().count(" start") if log.exists() else 0

        wait_until(lambda: unsettled(db) == 0 or starts() > 1, 40, message="the job settled or started twice")
        codes = [stop(p) for p in procs]
    finally:
        for p in procs:
            stop(p, 10)

    # Then it started once, its lease was extended while it ran, and its ack landed
    assert starts() == 1
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    assert "acks lost" not in stderr_of(tmp_path)
    assert codes == [errors.EXIT_OK, errors.EXIT_OK]


@contextlib.contextmanager
def inside_a_long_command(db, tmp_path: Path, env: dict[str, str], *args: str):
    """A consumer inside a 30 s command that ignores SIGTERM, as does the child it started (so
    only SIGKILL ends them): yields (consumer, job, the command's pid, its child's); what is left
    of them is killed at the end."""
    env = {**env, "NQ_TEST_SLEEP": "30", "NQ_IGNORE_TERM": "1"}
    proc = consume(env, tmp_path, *args)
    pids: list[int] = []
    try:
        registered(db, 1)
        [job] = produce(db, [{"n": 1}])
        wait_until(lambda: command_pids(tmp_path, "child") if (tmp_path / "runs" / "command.log").exists()
                   else None, 30, message="the command started")
        [shell], [child] = command_pids(tmp_path, "start"), command_pids(tmp_path, "child")
        pids += [shell, child]
        yield proc, job, shell, child
    finally:
        stop(proc, 10)
        for pid in pids:
            if alive(pid):
                subprocess.run(["kill", "-KILL", str(pid)], check=False)


def test_a_command_running_when_the_grace_expires_is_killed_with_its_children_before_the_consumer_exits(
        db, tmp_path):
    # Given a 1 s shutdown grace and a consumer inside a 30 s command that ignores SIGTERM
    env = setup(db, tmp_path, grace_s=1)
    with inside_a_long_command(db, tmp_path, env, "--command", command(tmp_path)) as (proc, job, shell, child):
        # When the consumer is stopped and the grace expires with the command still running
        sent = time.monotonic()
        code = stop(proc)
        took = time.monotonic() - sent
        # Then the command and its child are gone once the consumer has exited (a second for
        # the orphans' reaper, should they have been left to init)
        wait_until(lambda: not alive(shell) and not alive(child), 1, message="the command's processes gone")

    # And the consumer exited 0 after the grace and a bounded wait for the TERM, the job is
    # back, interrupted: ready, no attempt charged, its attempt recorded with the reason; and
    # the command never finished
    assert code == errors.EXIT_OK
    assert took < 8
    assert command_pids(tmp_path, "end") == []
    status, attempts, owner = db.query("SELECT status, attempts, owner FROM nq_job WHERE id = %s", (job,))[0]
    assert (status, attempts, owner) == (0, 0, None)
    [(outcome, error)] = db.query("SELECT outcome, error FROM nq_attempt WHERE job_id = %s", (job,))
    assert outcome == "interrupted" and "shutdown grace expired" in error
    # And the summary counts it as given back (its worker settled it once the command was killed)
    assert "consumer stopped claimed=1 done=0 failed=0 dead=0 given_back=1" in stderr_of(tmp_path)


def test_a_command_that_runs_across_a_reload_is_still_killed_when_the_grace_expires(db, tmp_path):
    """Regression: after a SIGHUP the worker's handler was the reloaded one, which knew of no
    running command: at shutdown nothing was killed, and the command ran on after its consumer
    had exited while its job was failed and retried elsewhere (a second run)."""
    # Given a queue run by a config's command (a reload makes a new handler for it), a 1 s
    # grace, and a consumer inside a 30 s command that ignores SIGTERM
    env = setup(db, tmp_path, f'[queue.{QUEUE}]\ncommand = "{command(tmp_path)}"\n', grace_s=1)
    with inside_a_long_command(db, tmp_path, env) as (proc, job, shell, child):
        # When the consumer reloads its config while the command runs, then is stopped and the
        # grace expires
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "reloaded config" in stderr_of(tmp_path), 20, message="the reload")
        code = stop(proc)
        # Then the command and its child are gone once the consumer has exited
        wait_until(lambda: not alive(shell) and not alive(child), 1, message="the command's processes gone")
    # And the job is back, interrupted: ready, no attempt charged
    assert code == errors.EXIT_OK
    status, attempts = db.query("SELECT status, attempts FROM nq_job WHERE id = %s", (job,))[0]
    assert (status, attempts) == (0, 0)
    assert db.query("SELECT outcome FROM nq_attempt WHERE job_id = %s", (job,)) == [("interrupted",)]


# ------------------------------------------------------------------ errors the server refuses


def test_a_huge_non_ascii_error_is_recorded_cut_to_the_column_and_the_consumer_goes_on(db, tmp_path):
    # Given a server in strict mode, and a consumer that claims three jobs at once: one raises
    # 30,000 x U+6F22 (90 KB of UTF-8), one that plus lone surrogates, one succeeds
    assert "STRICT_TRANS_TABLES" in db.scalar("SELECT @@GLOBAL.sql_mode")
    env = setup(db, tmp_path)
    ids = produce(db, [{"error": "han"}, {"error": "surrogate"}, {"n": 3}], "--max-attempts", "1")
    proc = consume(env, tmp_path, "--handler", "nqunusual:raise_huge", "--batch-size", "3")
    try:
        # When it runs them
        wait_until(lambda: unsettled(db) == 0 or proc.poll() is not None, 30,
                   message="the jobs settled or the consumer exited")
        alive_after = proc.poll() is None
        code = stop(proc)
    finally:
        stop(proc, 10)

    # Then the consumer lived on; both errors are recorded, cut to the column's 65,535 bytes
    # on a character boundary; the third job was acked
    assert alive_after, stderr_of(tmp_path)[-3000:]
    rows = db.query("SELECT id, status, OCTET_LENGTH(last_error), last_error FROM nq_job ORDER BY id")
    assert [(r[0], r[1]) for r in rows] == [(ids[0], 4), (ids[1], 4)]
    for _, _, size, error in rows:
        assert 60000 < size <= 65535
        assert "\ufffd" not in error[-10:]
    assert rows[0][3].startswith("RuntimeError: \u6f22\u6f22")
    assert [job for job, tag in records(tmp_path) if tag == "end"] == [ids[2]]
    assert code == errors.EXIT_OK
    assert "worker failed" not in stderr_of(tmp_path)


def test_a_failure_the_server_refuses_to_record_never_ends_the_worker(db, tmp_path):
    # Given a trigger that refuses every error text longer than 1,000 bytes, and every one that
    # says "refuse-all", and a consumer that claims three jobs at once: one with a long error,
    # one with an error the server never takes, one that succeeds
    db.query("CREATE TRIGGER refuse BEFORE UPDATE ON nq_job FOR EACH ROW "
             "IF OCTET_LENGTH(NEW.last_error) > 1000 OR NEW.last_error LIKE '%refuse-all%' THEN "
             "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test'; END IF")
    env = setup(db, tmp_path, "[defaults]\nlease_s = 3\n")
    ids = produce(db, [{"error": "han"}, {"error": "refuse-all"}, {"n": 3}], "--max-attempts", "1")
    proc = consume(env, tmp_path, "--handler", "nqunusual:raise_huge", "--batch-size", "3")
    try:
        # When it runs them
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE id = %s", (ids[2],)) == 0
                   or proc.poll() is not None, 30, message="the good job acked or the consumer exited")
        wait_until(lambda: db.scalar("SELECT status FROM nq_job WHERE id = %s", (ids[0],)) == 4
                   or proc.poll() is not None, 30, message="the long error recorded or the consumer exited")
        alive_after = proc.poll() is None
        # the job whose every error is refused waits for its lease, then the reaper buries it
        wait_until(lambda: unsettled(db) == 0, 30, message="the refused job taken back at its lease")
        code = stop(proc)
    finally:
        stop(proc, 10)

    # Then the worker lived on; the long error was recorded short, the refused one was left to
    # its lease (then dead: out of attempts), and the good job was acked
    assert alive_after, stderr_of(tmp_path)[-3000:]
    rows = dict(db.query("SELECT id, last_error FROM nq_job"))
    assert rows[ids[0]].startswith("RuntimeError: \u6f22") and len(rows[ids[0]].encode()) <= 1000
    assert "lease" in rows[ids[1]]
    assert ids[2] not in rows
    assert "could not record" in stderr_of(tmp_path)
    assert code == errors.EXIT_OK


# ------------------------------------------------------------------ forking handlers


def test_a_handlers_forked_child_exits_with_its_code_and_never_runs_consumer_code(db, tmp_path):
    # Given a consumer whose handler forks a child that calls sys.exit(7), raises, or returns
    env = setup(db, tmp_path)
    proc = consume(env, tmp_path, "--handler", "nqunusual:fork")
    try:
        registered(db, 1)
        # When it runs one job of each
        ids = produce(db, [{"child": "exit"}, {"child": "raise"}, {"child": "return"}])
        wait_until(lambda: unsettled(db) == 0 and len(records(tmp_path)) == 3, 60,
                   message="the three jobs done")
        alive_after = proc.poll() is None
        sent = time.monotonic()
        code = stop(proc)
        took = time.monotonic() - sent
    finally:
        stop(proc, 10)

    # Then each child exited at once with the code Python would give it (7, 1, 0), each job
    # ran once and was acked, and the consumer lived on and drained at once on SIGTERM
    assert sorted(records(tmp_path)) == [(ids[0], "child=7"), (ids[1], "child=1"), (ids[2], "child=0")]
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    assert alive_after
    assert code == errors.EXIT_OK and took < 5
    assert stderr_of(tmp_path).count("consumer stopped") == 1, stderr_of(tmp_path)[-3000:]
