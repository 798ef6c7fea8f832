"""A `--command` never outlives its consumer, whichever way the consumer's worker ends: here the
worker ends through "worker stopped while retrying" (the consumer was stopped while a lease
extension under the command was retrying a server that is gone), not through the grace expiry
that kills the command's process group (tests/system/test_handlers.py covers that one).

Regression: that path left the command's process group running after the consumer had exited
(the fault schedule's orphaned_run), while the reaper gave its job to another consumer.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from conftest import alive, wait_until

from .conftest import command_setup, produce

QUEUE = "q"

# Records its start, its pid and its child's; ignores SIGTERM, as does the child that sleeps
# (so only the SIGKILL of its process group ends them); records its end.
COMMAND = """#!/bin/sh
echo "$NOTIFYQ_JOB_ID $$ start" >> "$NQ_TEST_OUT/command.log"
trap '' TERM
sleep "$NQ_TEST_SLEEP" &
echo "$NOTIFYQ_JOB_ID $! child" >> "$NQ_TEST_OUT/command.log"
wait
echo "$NOTIFYQ_JOB_ID $$ end" >> "$NQ_TEST_OUT/command.log"
"""


def command_log(out: Path) -> list[tuple[int, int, str]]:
    """(job, pid, tag) of each line the command wrote."""
    path = out / "command.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(job), int(pid), tag) for job, pid, tag in (line.split() for line in lines)]


def test_a_command_running_when_its_consumer_stops_with_the_server_gone_ends_before_the_consumer_exits(
        server, fdb, procs, tmp_path):
    # Given a consumer whose 3 s lease is extended every second under a 60 s command (that
    # ignores SIGTERM, its child too), with a grace (30 s) and connect retries (60 s) that do not
    # end before the test does
    out, script, env = command_setup(fdb, tmp_path, COMMAND, "[consumer]\nshutdown_grace_s = 30\n"
                                     "[defaults]\nlease_s = 3\ncommand_timeout_s = 120\n", script_name="job.sh")
    env.update(NOTIFYQ_CONNECT_RETRY_S="60", NQ_TEST_SLEEP="60")
    consumer = procs.start(env, "consume", "-q", QUEUE, "--command", str(script))
    produce(fdb, QUEUE, 1)
    wait_until(lambda: any(tag == "child" for _, _, tag in command_log(out)), 30, message="the command started")
    [(job, shell, _)] = [r for r in command_log(out) if r[2] == "start"]
    [child] = [pid for _, pid, tag in command_log(out) if tag == "child"]
    pids = [shell, child]
    try:
        # When the server goes away (the extension under the command retries), and the consumer
        # is stopped
        server.stop()
        wait_until(lambda: "database error, retrying" in consumer.stderr_text(), 30,
                   message="the consumer retrying the server")
        consumer.signal(signal.SIGTERM)
        consumer.wait(60)
        # Then its worker ended on the stop of that retry, not at the grace's end
        log = consumer.stderr_text()
        assert "worker stopped while retrying" in log, log[-3000:]
        assert "grace period over" not in log
        # And the command and its child are gone once the consumer has exited (a second for
        # their SIGKILL to land, and for init to reap them, should they have been left to it)
        wait_until(lambda: not alive(shell) and not alive(child), 1,
                   message="the command's process group gone when its consumer had exited")
        assert (job, shell, "end") not in command_log(out)

        # And its job is not lost: with the server back, another consumer runs it to the end
        server.start()
        again = procs.start({**env, "NQ_TEST_SLEEP": "0"}, "consume", "-q", QUEUE, "--command", str(script))
        wait_until(lambda: any(tag == "end" for _, _, tag in command_log(out)), 90, message="the job run again")
        assert [j for j, _, tag in command_log(out) if tag == "end"] == [job]
        again.signal(signal.SIGTERM)
        assert again.wait(30) == 0, again.stderr_text()[-3000:]
    finally:
        for pid in pids:
            if alive(pid):  # (left running: the test failed)
                os.kill(pid, signal.SIGKILL)
