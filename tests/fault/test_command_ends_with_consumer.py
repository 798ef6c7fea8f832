"""A `--command` ends with its consumer on the two stops that do not wait for the server: a second
stop signal (the consumer exits 130 at once) and the grace's expiry while the server is frozen.
(tests/fault/test_command_outlives_stop.py covers the stop that ends a retry of a gone server.)

Regressions: on a second SIGTERM the consumer exited and left the command's process group running
under init, while the reaper gave its job to another consumer (two copies of the job at once);
with the server frozen (SIGSTOP), the command was killed only 9-15 s after the grace expired,
once the shutdown's session had given up connecting, and the consumer exited 86 s after SIGTERM.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from conftest import alive, wait_until

from notifyq.consume import commands

from .conftest import command_setup, produce

QUEUE = "cq"

# Ignores SIGTERM, as do both its children (so only the SIGKILL of its process group ends them);
# writes its pid and theirs, one a line.
COMMAND = """#!/bin/sh
trap '' TERM
sh -c "trap '' TERM; exec sleep 1001" &
echo $! >> "$NQ_TEST_OUT/pids"
(trap '' TERM; exec sleep 1002) &
echo $! >> "$NQ_TEST_OUT/pids"
echo $$ >> "$NQ_TEST_OUT/pids"
while :; do sleep 1; done
"""


def _start(tmp_path: Path, fdb, procs, grace_s: float):
    out, script, env = command_setup(fdb, tmp_path, COMMAND, f"[consumer]\nshutdown_grace_s = {grace_s}\n"
                                                             "[defaults]\ncommand_timeout_s = 600\n")
    consumer = procs.start(env, "consume", "-q", QUEUE, "--batch-size", "1", "--command", str(script))
    produce(fdb, QUEUE, 1)
    pids_file = out / "pids"
    wait_until(lambda: pids_file.exists() and len(pids_file.read_text().split()) == 3, 30,
               message="the command and its children started")
    return consumer, [int(p) for p in pids_file.read_text().split()]


def _kill_left(pids: list[int]) -> None:
    for pid in pids:
        if alive(pid):  # (left running: the test failed)
            os.kill(pid, signal.SIGKILL)


def test_a_second_stop_signal_kills_the_running_commands_process_group_before_the_consumer_exits(
        server, fdb, procs, tmp_path):
    # Given a consumer running a command (whose processes all ignore SIGTERM), with a long grace
    consumer, pids = _start(tmp_path, fdb, procs, grace_s=30)
    try:
        # When it is stopped, and stopped again during the grace
        consumer.signal(signal.SIGTERM)
        wait_until(lambda: fdb.scalar("SELECT stopping FROM nq_consumer WHERE pid = %s", (consumer.pid,)),
                   30, message="the consumer draining (its registration says so)")
        consumer.signal(signal.SIGTERM)
        # Then it exits at once (130), and the command's process group is gone with it (a second
        # for init to reap what was left to it)
        assert consumer.wait(30) == 130, consumer.stderr_text()[-3000:]
        wait_until(lambda: not any(alive(p) for p in pids), 1,
                   message="the command's process group gone when its consumer had exited")
    finally:
        _kill_left(pids)


def test_the_grace_expiring_with_the_server_frozen_kills_the_command_at_once_and_the_consumer_exits_soon(
        server, fdb, procs, tmp_path):
    # Given a consumer running a command (whose processes all ignore SIGTERM), with a 3 s grace
    consumer, pids = _start(tmp_path, fdb, procs, grace_s=3)
    server_pid = server._proc.pid
    try:
        # When the server freezes (SIGSTOP: connections hang, nothing is refused), and the
        # consumer is stopped
        os.kill(server_pid, signal.SIGSTOP)
        t0 = time.monotonic()
        consumer.signal(signal.SIGTERM)
        # Then the command's process group is killed at the grace's end (SIGTERM, SIGKILL 2 s
        # later), whatever the consumer waits for meanwhile from the frozen server (marking itself
        # stopping, a stall look: a few seconds each, which used to delay the kill by as much)
        wait_until(lambda: not any(alive(p) for p in pids), 30,
                   message="the command's process group gone after the grace")
        gone_s = time.monotonic() - t0
        assert gone_s < 3 + commands.TERM_WAIT_S + 3, f"the command ended {gone_s:.1f} s after SIGTERM"
        # And the consumer exits well within systemd's TimeoutStopSec (90 s), non-zero or not
        consumer.wait(60)
        exit_s = time.monotonic() - t0
        print(f"command gone {gone_s:.1f} s, consumer exited {exit_s:.1f} s after SIGTERM")
        assert exit_s < 45, consumer.stderr_text()[-3000:]
    finally:
        os.kill(server_pid, signal.SIGCONT)
        _kill_left(pids)


def test_a_second_stop_signal_exits_at_once_with_the_server_frozen(server, fdb, procs, tmp_path):
    # Given a consumer running a command (whose processes all ignore SIGTERM), with a long grace
    consumer, pids = _start(tmp_path, fdb, procs, grace_s=30)
    server_pid = server._proc.pid
    try:
        # When the server freezes, the consumer is stopped, and stopped again 0.5 s later (its
        # stop's first connect to the frozen server under way)
        os.kill(server_pid, signal.SIGSTOP)
        consumer.signal(signal.SIGTERM)
        deadline = time.monotonic() + 0.5
        wait_until(lambda: time.monotonic() >= deadline, 2, 0.05, "half a second")
        consumer.signal(signal.SIGTERM)
        t0 = time.monotonic()
        # Then it exits 130 at once (the code before: when that connect gave up, 2.5-2.9 s on),
        # the command's process group gone with it
        assert consumer.wait(30) == 130, consumer.stderr_text()[-3000:]
        exit_s = time.monotonic() - t0
        print(f"exit 130 {exit_s:.2f} s after the second SIGTERM")
        assert exit_s < 1.5, consumer.stderr_text()[-3000:]
        wait_until(lambda: not any(alive(p) for p in pids), 1,
                   message="the command's process group gone when its consumer had exited")
    finally:
        os.kill(server_pid, signal.SIGCONT)
        _kill_left(pids)
