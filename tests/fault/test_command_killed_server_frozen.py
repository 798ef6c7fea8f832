"""At the grace's end a `--command` gets SIGTERM, and SIGKILL commands.TERM_WAIT_S later, whether
the server answers or not (docs/deploys.md, docs/delivery-contract.md), also a command that traps
SIGTERM and goes on, with the consumer's default batch size (test_command_ends_with_consumer.py's
frozen test has a command that ignores SIGTERM, one job a batch).

Its pid is watched, not a `pgrep -f` of its path: the consumer's own command line names the
command too, and would make it look alive until the consumer exits.
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
GRACE_S = 3

# Traps SIGTERM, says so, and goes on (its `sleep` children die of it): only SIGKILL ends it.
COMMAND = """#!/bin/bash
echo $$ > "$NQ_TEST_OUT/pid.tmp" && mv "$NQ_TEST_OUT/pid.tmp" "$NQ_TEST_OUT/pid"
trap 'echo TERM >> "$NQ_TEST_OUT/signals"' TERM
while :; do sleep 0.5; done
"""


def test_a_command_that_traps_sigterm_is_killed_term_wait_s_after_it_with_the_server_frozen(
        server, fdb, procs, tmp_path):
    # Given a consumer (default batch size) running a command that traps SIGTERM, with a 3 s grace
    out, script, env = command_setup(fdb, tmp_path, COMMAND, f"[consumer]\nshutdown_grace_s = {GRACE_S}\n"
                                                             "[defaults]\ncommand_timeout_s = 600\n")
    consumer = procs.start(env, "consume", "-q", QUEUE, "--command", str(script))
    produce(fdb, QUEUE, 1)
    pid_file = out / "pid"
    wait_until(pid_file.exists, 30, message="the command started")
    pid = int(pid_file.read_text())
    server_pid = server._proc.pid
    try:
        # When the server freezes (SIGSTOP: connections hang, nothing is refused), and the
        # consumer is stopped
        os.kill(server_pid, signal.SIGSTOP)
        t0 = time.monotonic()
        consumer.signal(signal.SIGTERM)
        # Then the command gets SIGTERM at the grace's end, and is gone TERM_WAIT_S later
        wait_until(lambda: (out / "signals").exists(), 30, message="the command got SIGTERM")
        term_s = time.monotonic() - t0
        wait_until(lambda: not alive(pid), 60, message="the command gone")
        gone_s = time.monotonic() - t0
        print(f"SIGTERM {term_s:.1f} s, command gone {gone_s:.1f} s after the consumer's SIGTERM")
        assert gone_s < GRACE_S + commands.TERM_WAIT_S + 2.5, (
            f"the command ended {gone_s:.1f} s after SIGTERM\n" + consumer.stderr_text()[-3000:])
        consumer.wait(60)
    finally:
        os.kill(server_pid, signal.SIGCONT)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
