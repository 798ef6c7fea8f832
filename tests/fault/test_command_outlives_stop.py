"""A `--command` never outlives its consumer, whichever way the consumer's worker ends: here the
worker ends through "worker stopped while retrying" (the consumer was stopped while a lease
extension under the command was retrying a server that is gone, and the grace ended that retry).
And a server that comes back within the grace is waited for: the command runs to its end and
its job is acked, as the grace promises.

Regressions: that path left the command's process group running after the consumer had exited
(the fault schedule's orphaned_run), while the reaper gave its job to another consumer; and the
stop ended the retry at once, so a server restarting for 2-4 s during the grace killed a command
that needed only the grace to finish (its job left claimed until a reaper took it back).
"""

from __future__ import annotations

import os
import signal
import time
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


def _released_command_running(fdb, procs, tmp_path, grace_s: int):
    """A consumer running RELEASED_COMMAND's one job under a long lease (none ends within the
    test), with `grace_s` and connect retries that outlast the test: (its output directory, the
    consumer, the job, the command's pid)."""
    out, script, env = command_setup(fdb, tmp_path, RELEASED_COMMAND, f"[consumer]\nshutdown_grace_s = {grace_s}\n"
                                     "[defaults]\nlease_s = 120\ncommand_timeout_s = 120\n", script_name="job.sh")
    env.update(NOTIFYQ_CONNECT_RETRY_S="60")
    consumer = procs.start(env, "consume", "-q", QUEUE, "--command", str(script))
    produce(fdb, QUEUE, 1)
    wait_until(lambda: any(tag == "start" for _, _, tag in command_log(out)), 30, message="the command started")
    [(job, shell, _)] = [r for r in command_log(out) if r[2] == "start"]
    return out, consumer, job, shell


def _assert_acked_once(fdb, consumer, job: int) -> None:
    """The consumer exits 0 with the job done: gone (or kept done), its one attempt `done`."""
    assert consumer.wait(60) == 0, consumer.stderr_text()[-3000:]
    log = consumer.stderr_text()
    assert fdb.scalar("SELECT COUNT(*) FROM nq_job WHERE id = %s AND status <> 3", (job,)) == 0, log[-3000:]
    assert [o for (o,) in fdb.query("SELECT outcome FROM nq_attempt WHERE job_id = %s", (job,))] == ["done"], \
        log[-3000:]


def _assert_ran_as_long_as_its_command(fdb, job: int, command_s: float) -> None:
    """Its attempt record lasts as long as its command ran (`command_s`, from its start seen to
    its end seen), not until the outcome was sent (the server back, or the stop's settle)."""
    [run_s] = [float(s) for (s,) in fdb.query(
        "SELECT TIMESTAMPDIFF(MICROSECOND, started_at, ended_at) / 1e6 FROM nq_attempt WHERE job_id = %s", (job,))]
    assert run_s < command_s + 1.0, (run_s, command_s)


def command_log(out: Path) -> list[tuple[int, int, str]]:
    """(job, pid, tag) of each line the command wrote."""
    path = out / "command.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(job), int(pid), tag) for job, pid, tag in (line.split() for line in lines)]


def test_a_command_running_when_its_consumer_stops_with_the_server_gone_ends_before_the_consumer_exits(
        server, fdb, procs, tmp_path):
    # Given a consumer whose 3 s lease is extended every second under a 60 s command (that
    # ignores SIGTERM, its child too), with a 5 s grace and connect retries (60 s) that do not
    # end before the test does
    out, script, env = command_setup(fdb, tmp_path, COMMAND, "[consumer]\nshutdown_grace_s = 5\n"
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
        stopped_at = time.monotonic()
        consumer.wait(60)
        # Then its worker's retry ran on for the grace (the server might have come back), and
        # ended with it
        log = consumer.stderr_text()
        assert "worker stopped while retrying" in log, log[-3000:]
        assert time.monotonic() - stopped_at >= 5 - 0.5, log[-3000:]
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


def test_a_server_restarting_during_the_grace_is_waited_for_and_the_running_command_ends_acked(
        server, fdb, procs, tmp_path):
    # Given a consumer whose 3 s lease is extended every second under a 6 s command, with a
    # 30 s grace
    out, script, env = command_setup(fdb, tmp_path, COMMAND, "[consumer]\nshutdown_grace_s = 30\n"
                                     "[defaults]\nlease_s = 3\ncommand_timeout_s = 120\n", script_name="job.sh")
    env.update(NOTIFYQ_CONNECT_RETRY_S="30", NQ_TEST_SLEEP="6")
    consumer = procs.start(env, "consume", "-q", QUEUE, "--command", str(script))
    produce(fdb, QUEUE, 1)
    wait_until(lambda: any(tag == "child" for _, _, tag in command_log(out)), 30, message="the command started")
    [(job, shell, _)] = [r for r in command_log(out) if r[2] == "start"]
    [child] = [pid for _, pid, tag in command_log(out) if tag == "child"]
    try:
        # When the consumer is stopped, and its server restarts during the grace (its lease
        # extensions meet the restart)
        consumer.signal(signal.SIGTERM)
        wait_until(lambda: fdb.scalar("SELECT stopping FROM nq_consumer WHERE pid = %s", (consumer.pid,)),
                   30, message="the consumer draining (its registration says so)")
        server.restart()

        # Then the command runs to its end, its job is acked, and the consumer exits 0
        assert consumer.wait(60) == 0, consumer.stderr_text()[-3000:]
        assert (job, shell, "end") in command_log(out), consumer.stderr_text()[-3000:]
        assert fdb.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = %s", (QUEUE,)) == 0, \
            consumer.stderr_text()[-3000:]
    finally:
        for pid in (shell, child):
            if alive(pid):  # (left running: the test failed)
                os.kill(pid, signal.SIGKILL)


# Runs until the test releases it, then exits 0 (the job done).
RELEASED_COMMAND = """#!/bin/sh
echo "$NOTIFYQ_JOB_ID $$ start" >> "$NQ_TEST_OUT/command.log"
while [ ! -e "$NQ_TEST_OUT/release" ]; do sleep 0.05; done
echo "$NOTIFYQ_JOB_ID $$ end" >> "$NQ_TEST_OUT/command.log"
"""


def test_a_command_that_ended_while_its_call_retried_the_server_is_acked_not_given_back(
        server, fdb, procs, tmp_path):
    """Regression: a command that exited 0 while its handler's call was retrying the server (a
    lease extension or a cancel check under it) had its exit ignored when the stop ended that
    retry: its job was given back as interrupted and ran again (an outside attack on the
    deploys page)."""
    # Given a consumer running a command under a long lease (none ends within the test), a 4 s
    # grace and connect retries that outlast the test
    out, consumer, job, shell = _released_command_running(fdb, procs, tmp_path, grace_s=4)
    started = time.monotonic()
    try:
        # When the server goes away under the command (its call retries it), the command then
        # ends, exit 0, and the consumer is stopped: the grace ends with the server still away
        server.stop()
        wait_until(lambda: "database error, retrying" in consumer.stderr_text(), 30,
                   message="the command's call retrying the server")
        (out / "release").touch()
        wait_until(lambda: (job, shell, "end") in command_log(out), 10, message="the command ended")
        command_s = time.monotonic() - started
        consumer.signal(signal.SIGTERM)
        wait_until(lambda: "worker stopped while retrying" in consumer.stderr_text(), 30,
                   message="the grace's end ending the retry")
        server.start()

        # Then the job is acked before the consumer exits: done (gone), not ready to run again,
        # its attempt ended when its command did
        _assert_acked_once(fdb, consumer, job)
        _assert_ran_as_long_as_its_command(fdb, job, command_s)
    finally:
        if alive(shell):  # (left running: the test failed)
            os.kill(shell, signal.SIGKILL)


def test_a_command_that_ended_in_the_grace_with_the_server_frozen_past_it_is_acked_not_given_back(
        server, fdb, procs, tmp_path):
    """Regression (an outside attack on the deploys page): the server frozen (SIGSTOP) during the
    grace and answering again after it: a command that had exited 0 within the grace, its call
    still waiting on the frozen server, was given back as interrupted at the grace's end and ran
    again. The stop now reads the command's exit: done."""
    out, consumer, job, shell = _released_command_running(fdb, procs, tmp_path, grace_s=8)
    started = time.monotonic()
    server_pid = server._proc.pid
    try:
        # When the consumer is stopped, the server freezes, and the command then ends (exit 0)
        # within the grace, whose end passes with the server still frozen
        consumer.signal(signal.SIGTERM)
        wait_until(lambda: fdb.scalar("SELECT stopping FROM nq_consumer WHERE pid = %s", (consumer.pid,)),
                   10, message="the consumer draining (its registration says so)")
        os.kill(server_pid, signal.SIGSTOP)
        # (once the command's call waits on the frozen server: a lease extension's or a cancel
        # check's read under it)
        wait_until(lambda: "stalled: a call has waited" in consumer.stderr_text(), 10,
                   message="the command's call waiting on the frozen server")
        (out / "release").touch()
        wait_until(lambda: (job, shell, "end") in command_log(out), 10, message="the command ended")
        command_s = time.monotonic() - started
        wait_until(lambda: "grace period over" in consumer.stderr_text(), 20, message="the grace's end")
    finally:
        os.kill(server_pid, signal.SIGCONT)  # answering again within the stop's 12 s
    try:
        # Then the job is acked before the consumer exits: done, not ready to run again, its
        # attempt ended when its command did, not when the stop sent its outcome
        _assert_acked_once(fdb, consumer, job)
        _assert_ran_as_long_as_its_command(fdb, job, command_s)
    finally:
        if alive(shell):  # (left running: the test failed)
            os.kill(shell, signal.SIGKILL)
