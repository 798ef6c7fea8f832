"""A `--command` never outlives the call that started it, nor the consumer: a call that ends by
raising (a lease extension that met a lost server, the consumer's stop ending its retry) ends
the command's process group first, and the supervision loop, however it ends, has its handlers
end what they still run (Supervisor.run -> end_handlers)."""

from __future__ import annotations

import datetime
import os
import signal
import threading
from pathlib import Path

import pytest
from conftest import alive, wait_until

from notifyq import errors
from notifyq.consume import commands
from notifyq.consume.supervisor import Supervisor
from notifyq.jobs import Job

# Its pid and its child's, one a line; both ignore SIGTERM: only the group's SIGKILL ends them.
COMMAND = """#!/bin/sh
trap '' TERM
echo $$ >> "$1"
sleep 60 &
echo $! >> "$1"
wait
"""


def test_a_command_whose_lease_extension_raises_is_ended_with_its_group_before_the_call_raises(tmp_path):
    # Given a command (and the child it started) that ignore SIGTERM, whose lease extension
    # fails as a stopping consumer's retry of a lost server does
    script, pids_file = tmp_path / "job.sh", tmp_path / "pids"
    script.write_text(COMMAND)
    script.chmod(0o755)
    handler = commands.CommandHandler(f"{script} {pids_file}", False, 60.0)
    now = datetime.datetime.now(datetime.timezone.utc)
    job = Job(id=1, queue="q", payload={}, priority=0, attempts=1, max_attempts=3, run_at=now, created_at=now)

    def extend() -> None:
        wait_until(lambda: pids_file.exists() and len(pids_file.read_text().split()) == 2, 10,
                   message="the command and its child started")
        raise errors.TransientDBError("stopped while connecting")

    # When the call runs into it
    with pytest.raises(errors.TransientDBError):
        handler([job], extend)

    # Then the error is the call's, raised only once the command and its child are gone
    shell, child = (int(p) for p in pids_file.read_text().split())
    try:
        wait_until(lambda: not alive(shell) and not alive(child), 1, message="the command's group gone")
        assert handler._running == {}
    finally:
        for pid in (shell, child):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


class Failing(Supervisor):
    """A supervision loop whose start raises (any error of the loop's own)."""

    def __init__(self) -> None:
        self.ended = 0

    def start(self, stop_requested=None) -> None:
        raise RuntimeError("the loop's own error")

    def end_handlers(self) -> None:
        self.ended += 1


def test_the_supervision_loop_ends_its_handlers_commands_however_it_ends():
    loop = Failing()
    with pytest.raises(RuntimeError):
        loop.run(threading.Event())
    assert loop.ended == 1
