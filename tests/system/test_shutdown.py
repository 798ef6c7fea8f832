"""SIGTERM drains a `notifyq consume`: stop claiming, finish the running job, give back the rest.

A second SIGTERM exits 130 at once; what it held goes back to work through the reaper.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

from conftest import notifyq_cmd, run_cli, wait_until
from notifyq import errors


def _runs(out: Path) -> list[tuple[int, int, int, bool]]:
    """(job, attempt, pid, finished) from the record/record_slow handlers' files."""
    rows = []
    for path in out.glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            rows.append((int(parts[0]), int(parts[1]), int(parts[2]), len(parts) == 3))
    return rows


def _setup(db, tmp_path, sleep_s: float, grace_s: float = 10.0) -> dict[str, str]:
    out = tmp_path / "runs"
    out.mkdir()
    cfg = tmp_path / "nq.toml"
    cfg.write_text(f"[consumer]\nshutdown_grace_s = {grace_s}\nreap_interval_s = 0.5\n"
                   "[wakeup]\npoll_max_s = 0.2\n")
    return {**db.env, "NQ_TEST_OUT": str(out), "NQ_TEST_SLEEP": str(sleep_s), "NOTIFYQ_CONFIG": str(cfg)}


def _consume(env: dict[str, str], tmp_path: Path, *args: str) -> subprocess.Popen:
    err = (tmp_path / f"consume-{time.monotonic_ns()}.err").open("w")
    return subprocess.Popen(notifyq_cmd("consume", "-q", "s", *args), env=env,
                            stdout=subprocess.DEVNULL, stderr=err, text=True)


def _produce(db, n: int) -> list[int]:
    result = run_cli(db.env, "produce", "-q", "s", *[f'{{"n": {i}}}' for i in range(n)])
    assert result.returncode == 0, result.stderr
    return [int(x) for x in result.stdout.split()]


def _started(out: Path) -> list[int]:
    return [job for job, _, _, finished in _runs(out) if not finished]


class NotifySocket:
    """Stands in for systemd's NOTIFY_SOCKET: STOPPING=1 proves the first signal was handled."""

    def __init__(self):
        self.name = f"@nq-test-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])

    def wait_for(self, line: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if line in self.sock.recv(65536).decode().splitlines():
                    return
            except TimeoutError:
                raise AssertionError(f"no {line} within {timeout}s") from None

    def close(self) -> None:
        self.sock.close()


def _busy(db, tmp_path: Path, n: int) -> tuple[list[int], int]:
    """Wait for one registered consumer, give it n jobs, wait until one has started."""
    wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 1, 30, message="registered")
    ids = _produce(db, n)
    running = wait_until(lambda: _started(tmp_path / "runs"), 30, message="a job started")[0]
    return ids, running


def _sigterm(proc: subprocess.Popen, timeout: float = 15) -> tuple[int, float]:
    """Send SIGTERM; return the exit code and the seconds it took to exit."""
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    code = proc.wait(timeout)
    return code, time.monotonic() - sent


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_sigterm_mid_batch_finishes_the_running_job_gives_back_the_rest_and_exits_0(db, tmp_path):
    # Given a consumer that claimed a batch of 8 one-second jobs and has started the first
    env = _setup(db, tmp_path, sleep_s=1.0)
    proc = _consume(env, tmp_path, "--handler", "nqhandlers:record_slow", "--batch-size", "8")
    try:
        ids, running = _busy(db, tmp_path, 8)

        # When it gets SIGTERM
        code, took = _sigterm(proc)
    finally:
        _stop(proc)

    # Then it exits 0 within the grace period, once the running job is done
    assert code == errors.EXIT_OK
    assert took < 10.0
    runs = _runs(tmp_path / "runs")
    assert [(job, finished) for job, _, _, finished in runs if job == running] == [(running, False), (running, True)]
    assert {job for job, _, _, _ in runs} == {running}
    # And the finished job is acked, the 7 never started are ready again, attempts not counted
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE id = %s", (running,)) == 0
    rows = db.query("SELECT status, attempts, owner FROM nq_job WHERE id IN %s", (tuple(ids),))
    assert rows == [(0, 0, None)] * 7
    assert db.scalar("SELECT COUNT(*) FROM nq_consumer") == 0


def test_sigterm_to_an_idle_consumer_exits_0_at_once_despite_the_25_s_idle_wait(db, tmp_path):
    # Given two idle consumers with the default 25 s idle wait: one watching, one queued for it
    env = {**_setup(db, tmp_path, sleep_s=0.0), "NOTIFYQ_CONFIG": "/dev/null"}
    procs = [_consume(env, tmp_path, "--handler", "nqhandlers:record") for _ in range(2)]
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 2, 30, message="registered")
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = %s "
                                     "AND INFO LIKE %s", (db.dsn.user, "%GET_LOCK%")) >= 1, 30,
                   message="a consumer waiting in GET_LOCK")

        # When both get SIGTERM
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        codes = [proc.wait(30) for proc in procs]
        took = time.monotonic() - sent
    finally:
        for proc in procs:
            _stop(proc)

    # Then both exit 0 within a few seconds: their waits were interrupted, not sat out
    assert codes == [errors.EXIT_OK, errors.EXIT_OK]
    assert took < 5.0
    assert db.scalar("SELECT COUNT(*) FROM nq_consumer") == 0


def test_a_second_sigterm_exits_130_at_once_and_the_reaper_returns_what_it_held(db, tmp_path):
    # Given a consumer draining after SIGTERM, inside a 30-second job
    notify = NotifySocket()
    env = {**_setup(db, tmp_path, sleep_s=30.0, grace_s=60.0), "NOTIFY_SOCKET": notify.name}
    proc = _consume(env, tmp_path, "--handler", "nqhandlers:record_slow", "--batch-size", "5")
    try:
        ids, running = _busy(db, tmp_path, 5)
        proc.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1", 10)
        assert proc.poll() is None, "did not wait for its running job"

        # When a second SIGTERM arrives
        code, took = _sigterm(proc)
    finally:
        _stop(proc)
        notify.close()

    # Then it exits 130 at once
    assert code == errors.EXIT_KILLED
    assert took < 2.0
    # And a new consumer's reaper returns the 5 held jobs, which then all run
    env["NQ_TEST_SLEEP"] = "0"
    del env["NOTIFY_SOCKET"]
    fresh = _consume(env, tmp_path, "--handler", "nqhandlers:record_slow")
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0, 30, message="all 5 done")
    finally:
        fresh.send_signal(signal.SIGTERM)
        assert fresh.wait(30) == errors.EXIT_OK
    finished = [(job, attempt) for job, attempt, pid, done in _runs(tmp_path / "runs") if done and pid == fresh.pid]
    assert sorted(job for job, _ in finished) == sorted(ids)
    # The killed claim held 5 jobs: the crash cannot be pinned on one, so none is charged
    assert dict(finished)[running] == 1


def test_a_handler_outliving_the_grace_period_is_interrupted_uncharged_and_the_rest_is_given_back(db, tmp_path):
    # Given a 1 s grace period and a consumer inside a 30-second job, 4 more claimed behind it
    env = _setup(db, tmp_path, sleep_s=30.0, grace_s=1.0)
    proc = _consume(env, tmp_path, "--handler", "nqhandlers:record_slow", "--batch-size", "5")
    try:
        ids, running = _busy(db, tmp_path, 5)

        # When it gets SIGTERM
        code, took = _sigterm(proc)
    finally:
        _stop(proc)

    # Then it exits 0 once the grace period is over, not when the job would end
    assert code == errors.EXIT_OK
    assert 1.0 <= took < 5.0
    # And the 4 unstarted jobs are ready again with their attempt undone; the running one was
    # interrupted, not failed: ready again, no attempt charged, no error of its own, and its
    # attempt on record as 'interrupted' with the reason
    rows = {r[0]: r[1:] for r in db.query("SELECT id, status, attempts, owner, last_error FROM nq_job")}
    assert sorted(rows) == sorted(ids)
    assert rows.pop(running) == (0, 0, None, None)
    assert {r[:3] for r in rows.values()} == {(0, 0, None)}
    [(outcome, attempt, error)] = db.query(
        "SELECT outcome, attempt, error FROM nq_attempt WHERE job_id = %s", (running,))
    assert (outcome, attempt) == ("interrupted", 1) and "shutdown grace expired" in error


# A --command that obeys SIGTERM cleanly with exit 0, its work not done (as many applications do):
# writes "JOB start" once running, "JOB finished" only if it ran to its end.
TERM_EXITS_0 = """#!/bin/sh
trap 'exit 0' TERM
echo "$NOTIFYQ_JOB_ID start" >> "$NQ_TEST_OUT/command.log"
sleep 30 &
wait
echo "$NOTIFYQ_JOB_ID finished" >> "$NQ_TEST_OUT/command.log"
"""


def test_a_command_that_exits_0_on_the_stops_sigterm_at_the_graces_end_is_given_back_interrupted(db, tmp_path):
    """Regression (an outside attack on the deploys page): a command still running at the
    grace's end that obeyed the stop's SIGTERM with exit 0, unfinished, was recorded done and
    its job deleted, never to run again, though the consumer logged it given back interrupted."""
    env = _setup(db, tmp_path, sleep_s=0, grace_s=1.0)
    script = tmp_path / "job.sh"
    script.write_text(TERM_EXITS_0)
    script.chmod(0o755)
    log = tmp_path / "runs" / "command.log"
    proc = _consume(env, tmp_path, "--command", str(script))
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 1, 30, message="registered")
        [job] = _produce(db, 1)
        wait_until(lambda: log.exists() and f"{job} start" in log.read_text(), 30, message="the command started")
        # When the consumer is stopped and its 1 s grace ends with the command running
        code, _ = _sigterm(proc)
    finally:
        _stop(proc)
    # Then the command was stopped unfinished, and its job is ready again, uncharged, its
    # attempt recorded interrupted: it runs again
    assert code == errors.EXIT_OK
    assert f"{job} finished" not in log.read_text()
    assert db.query("SELECT status, attempts, owner FROM nq_job WHERE id = %s", (job,)) == [(0, 0, None)]
    [(outcome, error)] = db.query("SELECT outcome, error FROM nq_attempt WHERE job_id = %s", (job,))
    assert outcome == "interrupted" and "shutdown grace expired" in error


def test_when_the_grace_expires_the_jobs_that_finished_before_the_stuck_one_are_acked(db, tmp_path):
    """Regression: the acks of a batch's finished jobs go out about once a second, before a job
    starts; when the grace expired in the job after them, the exit left them claimed, and they
    ran again after their lease."""
    # Given a consumer whose batch is a quick job, then a 30-second one
    env = _setup(db, tmp_path, sleep_s=0.0, grace_s=1.0)
    proc = _consume(env, tmp_path, "--handler", "nqlifecycle:run", "--batch-size", "2")
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 1, 30, message="registered")
        result = run_cli(db.env, "produce", "-q", "s", '{"n": 0}', '{"n": 1, "sleep": 30}')
        assert result.returncode == 0, result.stderr
        quick, slow = (int(x) for x in result.stdout.split())
        wait_until(lambda: slow in _started(tmp_path / "runs"), 30, message="the slow job started")
        # When it gets SIGTERM and the grace expires
        code, _ = _sigterm(proc)
    finally:
        _stop(proc)
    # Then the quick job is acked (gone), and only the stuck one is back, interrupted (ready)
    assert code == errors.EXIT_OK
    assert db.query("SELECT id, status FROM nq_job") == [(slow, 0)]


def test_a_consumer_killed_while_it_stops_has_its_running_job_interrupted_not_charged(db, tmp_path):
    """Issue 40 item 10: systemd's SIGKILL after TimeoutStopSec (or a second SIGTERM) ends a
    consumer asked to stop while a job runs. The reaper used to charge that job, alone of its
    claim, as if it had crashed its consumer; a deploy is no crash. (Fails before the fix: the
    job ran again as attempt 2, its record 'taken back'.)"""
    # Given a consumer draining after SIGTERM inside a 30-second job, alone of its claim
    env = _setup(db, tmp_path, sleep_s=30.0, grace_s=60.0)
    proc = _consume(env, tmp_path, "--handler", "nqhandlers:record_slow", "--batch-size", "1")
    try:
        _, running = _busy(db, tmp_path, 1)
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: db.scalar("SELECT stopping FROM nq_consumer") == 1, 10, message="marked stopping")
        # When it is killed before the grace ends
        proc.kill()
        proc.wait(10)
    finally:
        _stop(proc)
    # Then a new consumer's reaper returns the job uncharged, its attempt recorded interrupted,
    # and it runs again as attempt 1
    env["NQ_TEST_SLEEP"] = "0"
    fresh = _consume(env, tmp_path, "--handler", "nqhandlers:record_slow")
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0, 30, message="the job done")
    finally:
        fresh.send_signal(signal.SIGTERM)
        assert fresh.wait(30) == errors.EXIT_OK
    finished = [(job, attempt) for job, attempt, pid, done in _runs(tmp_path / "runs") if done and pid == fresh.pid]
    assert finished == [(running, 1)]
    records = db.query("SELECT attempt, outcome FROM nq_attempt WHERE job_id = %s ORDER BY ended_at", (running,))
    assert records == [(1, "interrupted"), (1, "done")]


def test_a_consumer_killed_without_a_stop_still_has_its_running_job_charged(db, tmp_path):
    """The other side of the rule: a crash is not an interruption. A job alone in the hands of a
    consumer that dies unasked is charged, so one that kills its consumer every time ends dead."""
    env = _setup(db, tmp_path, sleep_s=30.0, grace_s=60.0)
    proc = _consume(env, tmp_path, "--handler", "nqhandlers:record_slow", "--batch-size", "1")
    try:
        _, running = _busy(db, tmp_path, 1)
        proc.kill()
        proc.wait(10)
    finally:
        _stop(proc)
    env["NQ_TEST_SLEEP"] = "0"
    fresh = _consume(env, tmp_path, "--handler", "nqhandlers:record_slow")
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0, 30, message="the job done")
    finally:
        fresh.send_signal(signal.SIGTERM)
        assert fresh.wait(30) == errors.EXIT_OK
    finished = [(job, attempt) for job, attempt, pid, done in _runs(tmp_path / "runs") if done and pid == fresh.pid]
    assert finished == [(running, 2)]
    records = db.query("SELECT attempt, outcome FROM nq_attempt WHERE job_id = %s ORDER BY ended_at", (running,))
    assert records == [(1, "taken back"), (2, "done")]
