"""Classic daemon mode: `notifyq consume|produce --daemon --pidfile P --log-file L`.

The launcher returns at once; the detached process takes the pidfile, opens the database only
after the fork, logs key=value lines to L, and on SIGTERM drains, exits and removes P. A second
start is refused with exit 10 and one line; a pidfile left by a dead process is replaced.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import alive, run_cli, wait_until
from notifyq import errors

KV_LINE = re.compile(r'^ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=(debug|info|warning|error) '
                     r'logger=notifyq[\w.]* msg=("[^"\\]*(\\.[^"\\]*)*"|\S+)( |$)')


def pid_in(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


@pytest.fixture
def daemons():
    """Pids to SIGKILL at teardown if a test left them running."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def start_daemon(env, daemons, pidfile: Path, *args: str) -> int:
    result = run_cli(env, *args)
    # The launcher returns once the daemon has detached, and says nothing
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    pid = wait_until(lambda: pid_in(pidfile), 30, message=f"the pid in {pidfile}")
    daemons.append(pid)
    assert alive(pid) and pid != os.getpid()
    assert b"notifyq" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return pid


def assert_clean_log(log: Path) -> str:
    text = log.read_text()
    assert "Traceback" not in text
    bad = [line for line in text.splitlines() if not KV_LINE.match(line)]
    assert bad == [], bad
    return text


def env_for(db, tmp_path: Path) -> dict[str, str]:
    out = tmp_path / "runs"
    out.mkdir()
    config = tmp_path / "nq.toml"
    config.write_text("[wakeup]\npoll_max_s = 0.2\nidle_wait_s = 1.0\n[producer]\nbatch_wait_s = 0.05\n")
    env = {**db.env, "NQ_TEST_OUT": str(out), "NOTIFYQ_CONFIG": str(config)}
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM"):
        env.pop(key, None)
    return env


def handled(out: Path) -> set[int]:
    return {int(line.split()[0]) for p in out.glob("*.log") for line in p.read_text().splitlines()}


def test_a_consumer_daemon_holds_its_pidfile_refuses_a_twin_and_stops_cleanly_on_sigterm(db, tmp_path, daemons):
    env = env_for(db, tmp_path)
    pidfile, log = tmp_path / "consumer.pid", tmp_path / "consumer.log"
    args = ("consume", "-q", "d", "--handler", "nqhandlers:record", "--daemon",
            "--pidfile", str(pidfile), "--log-file", str(log))
    # Given a consumer started as a daemon
    pid = start_daemon(env, daemons, pidfile, *args)
    wait_until(lambda: "consumer started" in log.read_text(), 30, message="the consumer to start")
    # When a second one is started with the same pidfile
    second = run_cli(env, *args)
    # Then it is refused with exit 10 and one line naming the running pid
    assert second.returncode == errors.EXIT_RUNNING
    assert second.stderr.splitlines() == [
        f"notifyq: error: another notifyq is running with pid {pid} (pidfile {pidfile})"]
    assert pid_in(pidfile) == pid
    # And the daemon does its work
    ids = run_cli(db.env, "produce", "-q", "d", *[f'{{"n": {i}}}' for i in range(5)]).stdout.split()
    wait_until(lambda: handled(tmp_path / "runs") == {int(i) for i in ids}, 30, message="5 jobs handled")
    wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0, 30, message="the acks")
    # When it gets SIGTERM
    os.kill(pid, signal.SIGTERM)
    # Then it exits, removes its pidfile, and its log is key=value lines without a traceback
    wait_until(lambda: not alive(pid), 30, message="the daemon to exit")
    assert not pidfile.exists()
    text = assert_clean_log(log)
    assert "consumer stopped" in text and "done=5" in text


def test_a_producer_daemon_replaces_a_stale_pidfile_and_follows_its_fifo(db, tmp_path, daemons):
    env = env_for(db, tmp_path)
    pidfile, log, fifo = tmp_path / "producer.pid", tmp_path / "producer.log", tmp_path / "in.fifo"
    os.mkfifo(fifo)
    # Given a pidfile left behind by a process that is gone
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True, timeout=30)
    dead_pid = int(dead.stdout)
    pidfile.write_text(f"{dead_pid}\n")
    # When a producer daemon starts on the FIFO (relative paths: it works from "/" once detached)
    args = ("produce", "-q", "f", "--daemon", "--pidfile", str(pidfile), "--log-file", "producer.log",
            "--input", "in.fifo", "--reject-file", "rejects.txt")
    result = subprocess.run([sys.executable, "-m", "notifyq", *args], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    # Then it takes the pidfile over, saying so in its log
    pid = wait_until(lambda: (p := pid_in(pidfile)) != dead_pid and p, 30, message="a new pid")
    daemons.append(pid)
    assert pid != dead_pid
    wait_until(lambda: "producer started" in log.read_text(), 30, message="the producer to start")
    assert f"removing stale pidfile {pidfile} (pid {dead_pid})" in log.read_text()
    # And a twin is refused
    twin = subprocess.run([sys.executable, "-m", "notifyq", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert twin.returncode == errors.EXIT_RUNNING and len(twin.stderr.splitlines()) == 1
    # When writers come and go on the FIFO, one of them with a bad line
    with open(fifo, "w") as writer:
        writer.write('{"n": 1}\n{oops\n')
    with open(fifo, "w") as writer:
        writer.write('{"n": 2}\n')
    # Then the good lines are enqueued and the bad one is logged and kept
    wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 2, 30, message="2 jobs")
    wait_until(lambda: "rejected line" in log.read_text(), 30, message="the rejected line in the log")
    assert (tmp_path / "rejects.txt").read_text() == "{oops\n"
    # When it gets SIGTERM, it exits and removes its pidfile; the log stays clean
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not alive(pid), 30, message="the daemon to exit")
    assert not pidfile.exists()
    text = assert_clean_log(log)
    assert "producer finished queue=f lines=3 enqueued=2 rejected=1 batches=" in text
    assert "reason=stop" in text
