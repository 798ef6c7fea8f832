"""A `--command` never outlives the call that started it, nor the consumer: a call that ends by
raising (a lease extension that met a lost server, the consumer's stop ending its retry) ends
the command's process group first, and the supervision loop, however it ends, has its handlers
end what they still run (Supervisor.run -> end_handlers)."""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import alive, wait_until

from notifyq import errors
from notifyq.consume import commands
from notifyq.consume.supervisor import Supervisor
from notifyq.jobs import Job, run_of

# Its pid and its child's, one a line; both ignore SIGTERM: only the group's SIGKILL ends them.
COMMAND = """#!/bin/sh
trap '' TERM
echo $$ >> "$1"
sleep 60 &
echo $! >> "$1"
wait
"""


def _handler(script: Path, text: str, args: str, per_batch: bool = False, timeout_s: float = 60.0):
    """A command handler running `text`, written to `script`, with `args`."""
    script.write_text(text)
    script.chmod(0o755)
    return commands.CommandHandler(f"{script} {args}", per_batch, timeout_s)


def _jobs(*ids: int) -> list[Job]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return [Job(id=i, queue="q", payload={}, priority=0, attempts=1, max_attempts=3, run_at=now, created_at=now)
            for i in ids]


def test_a_command_whose_lease_extension_raises_is_ended_with_its_group_before_the_call_raises(tmp_path):
    # Given a command (and the child it started) that ignore SIGTERM, whose lease extension
    # fails as a stopping consumer's retry of a lost server does
    script, pids_file = tmp_path / "job.sh", tmp_path / "pids"
    handler = _handler(script, COMMAND, str(pids_file))
    [job] = _jobs(1)

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



# Waits for the file named by $1, then exits 0: the job run to its end.
RELEASED = """#!/bin/sh
while [ ! -e "$1" ]; do sleep 0.01; done
"""


def _released_command_call(tmp_path, monkeypatch, release_call: threading.Event):
    """A per-job command handler's call, on a thread of its own: its command exits 0 once the
    call's first lease extension (after a slice of 0.05 s) released it, and that extension
    then waits for `release_call` (a call waiting on the server while its command exits).
    Returns (the handler, the job, the call's thread, the command's exit seen (not reaped), its
    outcome)."""
    monkeypatch.setattr(commands, "EXTEND_EVERY_S", 0.05)
    script, release = tmp_path / "job.sh", tmp_path / "release"
    handler = _handler(script, RELEASED, str(release))
    [job] = _jobs(1)
    exited = threading.Event()

    def extend() -> None:
        if exited.is_set():
            return
        [proc] = [c.proc for c in handler._running.values()]
        release.touch()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped yet
        exited.set()
        assert release_call.wait(30)

    outcome: dict = {}
    call = threading.Thread(target=lambda: outcome.setdefault("error", handler([job], extend)), daemon=True)
    call.start()
    return handler, job, call, exited, outcome


def test_the_stop_sees_a_command_that_exited_while_another_thread_holds_its_popen_wait_lock(tmp_path, monkeypatch):
    """Regression: stop_running learnt which commands had ended with Popen.poll(), which says
    nothing (None) while another thread holds the Popen's wait lock (the worker's own brief
    waitpid at that instant): a command that had run to its end was taken for a running one,
    and its job given back interrupted, to run again."""
    stopped = threading.Event()
    handler, _, call, exited, outcome = _released_command_call(tmp_path, monkeypatch, stopped)
    try:
        assert exited.wait(10), "the command exited while its call waits"
        [(tid, command)] = handler._running.items()
        proc = command.proc
        # When the stop comes while another thread holds the command's Popen wait lock (as the
        # worker's thread does, inside its waitpid, for an instant)
        with proc._waitpid_lock:
            started = time.monotonic()
            handler.stop_running(wait_s=0.1)
            look_s = time.monotonic() - started
        # Then the command counts as run to its end (exit 0): its job is done, not interrupted;
        # and the stop was not held for long
        assert handler.ran_to_end(tid)
        assert look_s < 1.5
    finally:
        stopped.set()
        call.join(30)
    assert not call.is_alive() and outcome == {"error": None}


# Obeys the stop's SIGTERM cleanly, exit 0, its work NOT done (as many applications do); writes its
# pid, then its child's (which holds its stderr), one a line.
TERM_EXITS_0 = """#!/bin/sh
trap 'exit 0' TERM
echo $$ >> "$1"
sleep 60 &
echo $! >> "$1"
wait
echo finished >> "$1"
"""


def _term_exits_0_call(tmp_path, per_batch: bool, extend=None):
    """A call of a command handler (per job or per batch, two jobs) whose command obeys SIGTERM
    with exit 0, on a thread of its own: (the handler, the jobs, the call's thread, its pids' file)."""
    script, pids_file = tmp_path / "job.sh", tmp_path / "pids"
    handler = _handler(script, TERM_EXITS_0, str(pids_file), per_batch)
    jobs = _jobs(1, 2) if per_batch else _jobs(1)
    call = threading.Thread(target=handler, args=(jobs, extend or (lambda: None)), daemon=True)
    call.start()
    # (the command may write its pids before the handler has recorded it as running)
    wait_until(lambda: pids_file.exists() and len(pids_file.read_text().split()) == 2 and handler._running, 10,
               message="the command and its child started")
    return handler, jobs, call, pids_file


def _kill_left(pids_file: Path) -> None:
    for pid in (int(p) for p in pids_file.read_text().split() if p.isdigit()):
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("per_batch", [False, True], ids=["per-job", "per-batch"])
def test_a_command_that_obeys_the_stops_sigterm_with_exit_0_is_interrupted_not_done(tmp_path, per_batch):
    """Regression (an outside attack on the deploys page): a command still running at the
    grace's end that obeyed the stop's SIGTERM with `exit 0`, its work unfinished, was recorded
    done and its job deleted (lost), though the stop said it was given back interrupted."""
    handler, jobs, call, pids_file = _term_exits_0_call(tmp_path, per_batch)
    [(tid, _)] = handler._running.items()
    try:
        # When the grace ends with the command running: the stop signals it, and it exits 0
        handler.stop_running(wait_s=2.0)
        call.join(10)
        assert not call.is_alive()
        # Then its jobs were interrupted (given back uncharged, to run again), as the stop's
        # abandon says too: not run to their end
        assert "finished" not in pids_file.read_text()
        for job in jobs:
            assert run_of(job).interrupted and run_of(job).error == commands.GRACE_EXPIRED
        assert not handler.ran_to_end(tid)
    finally:
        _kill_left(pids_file)


def test_a_command_the_stop_signalled_while_its_call_waits_on_the_server_stays_interrupted(tmp_path, monkeypatch):
    """Its call waiting on the server (a lease extension) as the stop signals it, and the
    process's exit ending the handlers again (end_handlers: a second stop_running) before that
    call returns: its exit 0 on the first stop's SIGTERM is not an end of its own, for the
    stop's abandon (ran_to_end) nor for the call once it returns."""
    monkeypatch.setattr(commands, "EXTEND_EVERY_S", 0.05)
    waiting, release = threading.Event(), threading.Event()

    def extend() -> None:
        waiting.set()
        assert release.wait(30)

    handler, [job], call, pids_file = _term_exits_0_call(tmp_path, False, extend)
    [(tid, command)] = handler._running.items()
    try:
        assert waiting.wait(10), "the call waiting on the server"
        handler.stop_running(wait_s=2.0)
        assert command.status() == 0  # (it obeyed the SIGTERM with exit 0)
        assert not handler.ran_to_end(tid)
        handler.stop_running(wait_s=0.1)  # the process exits: its handlers end what they run
        assert not handler.ran_to_end(tid)
        release.set()
        call.join(10)
        assert not call.is_alive()
        assert run_of(job).interrupted and run_of(job).error == commands.GRACE_EXPIRED
    finally:
        release.set()
        _kill_left(pids_file)


def test_a_command_that_ended_by_itself_before_the_stop_keeps_its_outcome(tmp_path, monkeypatch):
    """The other side: one that exited 0 before the stop's look (its call still waiting on the
    server) ran to its end: done, not interrupted, for the call and for the stop's abandon."""
    stopped = threading.Event()
    handler, job, call, exited, outcome = _released_command_call(tmp_path, monkeypatch, stopped)
    try:
        assert exited.wait(10), "the command exited while its call waits"
        [tid] = handler._running
        handler.stop_running(wait_s=0.1)
        handler.stop_running(wait_s=0.1)
        assert handler.ran_to_end(tid)
    finally:
        stopped.set()
        call.join(30)
    assert outcome == {"error": None}
    assert not run_of(job).interrupted and run_of(job).error is None


# Exits (with the status given) 0.2 s in, leaving a child in its group that holds its stderr
# open; writes the child's pid.
LEAVES_A_CHILD = """#!/bin/sh
echo "before the child" >&2
sleep 0.2
sleep 60 &
echo $! > "$1"
echo "its own last words" >&2
exit "$2"
"""


@pytest.mark.parametrize("status", [0, 3])
def test_a_command_that_exits_leaving_a_child_holding_its_stderr_ends_at_its_exit_not_its_timeout(
        tmp_path, status):
    """Regression (an outside attack): the call waited for the EOF of the command's stderr, which a
    child it left running held open: a command that exited 0 a second in failed "timed out"."""
    script, pid_file = tmp_path / "job.sh", tmp_path / "child"
    handler = _handler(script, LEAVES_A_CHILD, f"{pid_file} {status}", timeout_s=4.0)
    [job] = _jobs(1)
    started = time.monotonic()
    try:
        handler([job], lambda: None)
        took_s = time.monotonic() - started
        # Then its outcome is its exit status (with the stderr it wrote), well within its
        # timeout: the child is not the command
        assert took_s < 3.0, took_s
        if status == 0:
            assert run_of(job).error is None
        else:
            error = run_of(job).error
            assert error.startswith("exit status 3: ") and "its own last words" in error, error
            assert "before the child" in error
        assert handler._running == {}
    finally:
        if pid_file.exists() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
