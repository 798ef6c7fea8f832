"""A server that goes away for good ends a daemon with exit 5 within connect_retry_s of its going,
plus a small bound (docs/configuration.md), whatever the daemon was doing then: an idle consumer
waiting in GET_LOCK, a busy one claiming and acking, one extending the lease of a long job, one
whose worker runs a long Python handler that says nothing to the server, a `notifyq produce`
stream. The retries of its calls share one deadline, counted from the first
failure: one call's retry that gives up is not followed by another call's (a give-back, a
re-registration) with a budget of its own, and every session goes by connect_retry_s."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import pytest
from conftest import run_cli, wait_until

from .conftest import read_runs, recorder_env, write_config

RETRY_S = 4.0
# The documented bound past connect_retry_s: the last connect attempt (a refused connect fails at
# once) and the shutdown (its sessions give up at once too), 0.5 to 1.5 s here; the rest is room
# for a noisy machine. The code before took 60 s at least in a consumer (its work session's own
# minute, then another for the call after it), and 3 x connect_retry_s in a produce stream (one
# budget per session and call).
EXIT_BOUND_S = 6.0


def _in_get_lock(fdb) -> bool:
    rows = fdb.query("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = %s "
                     "AND INFO LIKE %s", (fdb.dsn.user, "%GET_LOCK%"))
    return rows[0][0] > 0


def _exit_after_stop(server, proc) -> tuple[int, float]:
    """Stop the server for good; (the exit code, seconds from the stop's start to the exit)."""
    stopped_at = time.monotonic()
    server.stop()
    code = proc.wait(RETRY_S + 180)  # the old code's worst case, with room: a failure, not a hang
    return code, time.monotonic() - stopped_at


def _exit_after_freeze(server, proc) -> tuple[int, float]:
    """Freeze the server (SIGSTOP) until the process exits; (its exit code, seconds from the
    freeze to the exit)."""
    server_pid = server._proc.pid
    frozen_at = time.monotonic()
    os.kill(server_pid, signal.SIGSTOP)
    try:
        code = proc.wait(RETRY_S + 180)  # the old code's worst case, with room: a failure, not a hang
        return code, time.monotonic() - frozen_at
    finally:
        os.kill(server_pid, signal.SIGCONT)


def _assert_prompt_exit_5(code: int, took_s: float, proc, setting: str = ": connect_retry_s") -> None:
    log = proc.stderr_text()
    print(f"exit {code} after {took_s:.1f} s")  # the measurement (pytest -rA shows it)
    assert code == 5, log[-3000:]
    assert took_s < RETRY_S + EXIT_BOUND_S, f"exit 5 after {took_s:.1f} s\n{log[-3000:]}"
    # The line names the budget that was applied (the code before named a minute of connect_retry_s)
    assert f"retried for {RETRY_S:g} s{setting})" in log, log[-3000:]
    # And the last line says why, as every command's error does (a daemon that was running when
    # the server went away ended with log lines only)
    assert log.rstrip().splitlines()[-1].startswith("notifyq: error: "), log[-3000:]


def test_an_idle_consumer_waiting_in_get_lock_exits_5_within_connect_retry_s(server, fdb, procs, tmp_path):
    # Given an idle consumer with connect_retry_s = 4, waiting for work in GET_LOCK
    env = recorder_env(fdb, tmp_path / "out", NOTIFYQ_CONNECT_RETRY_S=str(RETRY_S))
    consumer = procs.consumer(env, "q", handler="nqhandlers:record")
    wait_until(lambda: _in_get_lock(fdb), 60, 0.05, "the consumer waiting in GET_LOCK")
    # When the server stops and stays down
    code, took_s = _exit_after_stop(server, consumer)
    # Then the consumer exits 5 within connect_retry_s and the bound
    _assert_prompt_exit_5(code, took_s, consumer)


def test_a_busy_consumer_claiming_and_acking_exits_5_within_connect_retry_s(server, fdb, procs, tmp_path):
    # Given a consumer with connect_retry_s = 4 busy with short jobs (claims and acks all the time)
    env = recorder_env(fdb, tmp_path / "out", sleep_s=0.01, NOTIFYQ_CONNECT_RETRY_S=str(RETRY_S))
    put = run_cli(env, "produce", "-q", "q", input="{}\n" * 20000)
    assert put.returncode == 0, put.stderr
    consumer = procs.consumer(env, "q", "--batch-size", "5")
    wait_until(lambda: int(fdb.scalar("SELECT COUNT(*) FROM nq_job")) < 19900, 60, 0.05, "jobs done")
    # When the server stops and stays down
    code, took_s = _exit_after_stop(server, consumer)
    # Then the consumer exits 5 within connect_retry_s and the bound
    _assert_prompt_exit_5(code, took_s, consumer)


def test_a_consumer_extending_a_long_commands_lease_exits_5_within_connect_retry_s(server, fdb, procs, tmp_path):
    # Given a consumer with connect_retry_s = 4 running a long command on a 3 s lease (extended
    # each second while it runs)
    config = write_config(tmp_path / "nq.toml", "[defaults]\nlease_s = 3.0\n")
    env = recorder_env(fdb, tmp_path / "out", NOTIFYQ_CONNECT_RETRY_S=str(RETRY_S), NOTIFYQ_CONFIG=str(config))
    started = tmp_path / "started"
    assert run_cli(env, "produce", "-q", "q", "{}").returncode == 0
    consumer = procs.start(env, "consume", "-q", "q", "--command", f"sh -c 'touch {started}; exec sleep 120'")
    wait_until(started.exists, 60, 0.05, "the command started")
    # When the server stops and stays down
    code, took_s = _exit_after_stop(server, consumer)
    # Then the consumer exits 5 within connect_retry_s and the bound, its command still running
    _assert_prompt_exit_5(code, took_s, consumer)


@pytest.mark.parametrize("idle", [True, False], ids=["idle", "busy"])
def test_a_produce_stream_exits_5_within_connect_retry_s(server, fdb, procs, tmp_path, idle):
    # Given `notifyq produce` reading a stream, with connect_retry_s = 4, that has put a line
    env = {**fdb.env, "NOTIFYQ_CONNECT_RETRY_S": str(RETRY_S)}
    producer = procs.start(env, "produce", "-q", "q", "--print-ids", stdin=True)
    producer.stdin.write("{}\n")
    producer.stdin.flush()
    wait_until(lambda: producer.stdout_text().strip(), 60, 0.05, "the first id")
    # When the server stops and stays down, and (busy) lines keep coming
    stopped_at = time.monotonic()
    server.stop()
    if not idle:
        for _ in range(5):
            producer.stdin.write("{}\n")
            producer.stdin.flush()
    # Then the stream exits 5 within connect_retry_s and the bound (idle: at its next line)
    if idle:
        producer.stdin.write("{}\n")
        producer.stdin.flush()
    code = producer.wait(RETRY_S + 180)
    took_s = time.monotonic() - stopped_at
    _assert_prompt_exit_5(code, took_s, producer)


# A frozen server (SIGSTOP) accepts connections and answers nothing: the bound past
# connect_retry_s is then the stall watch's (a put overdue STALL_S, its look's connect) and the
# last connect attempt's timeout (max(3, connect_retry_s) s here), besides the room above. The
# code before waited for each read's timeout, a minute at least.
FROZEN_EXIT_BOUND_S = EXIT_BOUND_S + 12
# A consumer whose worker runs a silent handler learns of the freeze from its liveness session's
# keeper: its next ping (session_idle_s / 4, 2 s here) is overdue after the stall watch's 2 s (and
# a main-loop turn), whose look at it fails after its connect's 3 s. Its first failure, from which
# connect_retry_s counts, comes up to that much after the freeze; the ping's own give-up comes
# sooner than connect_retry_s after it, and the next ping's (2 s on) is the one that ends the
# process. 3 s more of room: the shutdown's connect attempts take up to 15 s (measured 12 s).
KEEPER_FINDS_FREEZE_S = 2.0 + 2.5 + 3.0 + 2.0 + 3.0


def test_a_produce_stream_exits_5_within_connect_retry_s_when_the_server_freezes(server, fdb, procs, tmp_path):
    # Given `notifyq produce` reading a stream (a line every 0.2 s), with connect_retry_s = 4
    env = {**fdb.env, "NOTIFYQ_CONNECT_RETRY_S": str(RETRY_S)}
    producer = procs.start(env, "produce", "-q", "q", "--print-ids", stdin=True)
    producer.stdin.write("{}\n")
    producer.stdin.flush()
    wait_until(lambda: producer.stdout_text().strip(), 60, 0.05, "the first id")
    server_pid = server._proc.pid
    # When the server freezes (SIGSTOP: connections hang, nothing is refused), lines still coming
    frozen_at = time.monotonic()
    os.kill(server_pid, signal.SIGSTOP)
    try:
        code = None
        while code is None and time.monotonic() - frozen_at < RETRY_S + 180:
            try:
                producer.stdin.write("{}\n")
                producer.stdin.flush()
            except (BrokenPipeError, ValueError):  # it exited
                pass
            with contextlib.suppress(subprocess.TimeoutExpired):  # (a line each 0.2 s meanwhile)
                code = producer.wait(0.2)
        took_s = time.monotonic() - frozen_at
    finally:
        os.kill(server_pid, signal.SIGCONT)
    # Then the stream exits 5 within connect_retry_s and the bound, naming the setting
    log = producer.stderr_text()
    print(f"exit {code} after {took_s:.1f} s")
    assert code == 5, log[-3000:]
    assert took_s < RETRY_S + FROZEN_EXIT_BOUND_S, f"exit 5 after {took_s:.1f} s\n{log[-3000:]}"
    assert f"retried for {RETRY_S:g} s: connect_retry_s)" in log, log[-3000:]


def test_a_consumer_in_a_long_python_handler_exits_5_within_connect_retry_s_when_the_server_freezes(
        server, fdb, procs, tmp_path):
    # Given a consumer with connect_retry_s = 4 whose one worker runs a Python handler of 120 s,
    # which says nothing to the server (its liveness session's keeper pings every 2 s)
    config = write_config(tmp_path / "nq.toml", "[consumer]\nsession_idle_s = 8\n")
    out = tmp_path / "out"
    env = recorder_env(fdb, out, sleep_s=120.0, NOTIFYQ_CONNECT_RETRY_S=str(RETRY_S), NOTIFYQ_CONFIG=str(config))
    assert run_cli(env, "produce", "-q", "q", "{}").returncode == 0
    consumer = procs.consumer(env, "q")
    wait_until(lambda: read_runs(out), 60, 0.05, "the handler started")
    # When the server freezes (SIGSTOP: connections hang, nothing is refused)
    code, took_s = _exit_after_freeze(server, consumer)  # the code before: when the handler returned
    # Then it exits 5 within connect_retry_s and the bound (its keeper's ping finds the server
    # gone), its handler still running: a Python handler cannot be interrupted, and its thread
    # ends with the process. The code before exited only once the handler had returned.
    log = consumer.stderr_text()
    print(f"exit {code} after {took_s:.1f} s")
    assert code == 5, log[-3000:]
    bound_s = RETRY_S + FROZEN_EXIT_BOUND_S + KEEPER_FINDS_FREEZE_S
    assert took_s < bound_s, f"exit 5 after {took_s:.1f} s\n{log[-3000:]}"
    assert f"retried for {RETRY_S:g} s: connect_retry_s)" in log, log[-3000:]
    assert [r.finished for r in read_runs(out)] == [False]  # started, never finished


# With connect_retry_s = 10 a connect's timeout is 10 s: the last attempt against a frozen server
# overran the outage's budget by up to that much, and an exit the documented bound
# (connect_retry_s + 25 s) allows came 36-40 s after the freeze (an outside attack).
FROZEN_RETRY_S = 10.0
FROZEN_DOCUMENTED_BOUND_S = 25.0


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
def test_a_consumer_exits_5_within_the_documented_bound_when_the_server_freezes(server, fdb, procs, tmp_path, busy):
    # Given a consumer with connect_retry_s = 10, idle in GET_LOCK or busy claiming and acking
    out = tmp_path / "out"
    env = recorder_env(fdb, out, sleep_s=0.01, NOTIFYQ_CONNECT_RETRY_S=str(FROZEN_RETRY_S))
    if busy:
        assert run_cli(env, "produce", "-q", "q", "--count", *["{}"] * 3000).returncode == 0
    consumer = procs.consumer(env, "q", handler="nqhandlers:record_slow")
    if busy:
        wait_until(lambda: len(read_runs(out)) > 20, 60, 0.05, "the consumer at work")
    else:
        wait_until(lambda: _in_get_lock(fdb), 60, 0.05, "the consumer waiting in GET_LOCK")
    # When the server freezes (SIGSTOP: connections hang, nothing is refused)
    code, took_s = _exit_after_freeze(server, consumer)
    # Then it exits 5 within connect_retry_s + 25 s
    log = consumer.stderr_text()
    print(f"exit {code} after {took_s:.1f} s")
    assert code == 5, log[-3000:]
    assert took_s < FROZEN_RETRY_S + FROZEN_DOCUMENTED_BOUND_S, f"exit 5 after {took_s:.1f} s\n{log[-3000:]}"
