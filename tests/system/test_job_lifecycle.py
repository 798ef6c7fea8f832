"""A job's life in a live `notifyq consume`: crashes are charged to the job that caused them, a
live consumer keeps the leases of the jobs it holds, and nothing is left claimed when it stops.

Every test drives real consumer processes (handlers in tests/helpers/nqlifecycle.py) and reads
back what each handler start and end recorded.
"""

from __future__ import annotations

import collections
import json
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import notifyq_cmd, run_cli, wait_until
from notifyq import errors

QUEUE = "life"


@dataclass(frozen=True)
class Run:
    job: int
    attempt: int
    pid: int
    tag: str  # "start" or "end"


def runs(out: Path) -> list[Run]:
    rows = []
    for path in out.glob("*.log"):
        for line in path.read_text().splitlines():
            job, attempt, pid, tag = line.split()
            rows.append(Run(int(job), int(attempt), int(pid), tag))
    return rows


def ends(out: Path) -> collections.Counter:
    return collections.Counter(r.job for r in runs(out) if r.tag == "end")


def setup(db, tmp_path: Path, config: str = "", sleep_s: float = 0.0, grace_s: float = 10) -> dict[str, str]:
    out = tmp_path / "runs"
    out.mkdir(exist_ok=True)
    cfg = tmp_path / "nq.toml"
    cfg.write_text(f"[consumer]\nreap_interval_s = 0.5\nshutdown_grace_s = {grace_s}\n"
                   "[wakeup]\npoll_max_s = 0.2\n" + config)
    return {**db.env, "NQ_TEST_OUT": str(out), "NQ_TEST_SLEEP": str(sleep_s), "NOTIFYQ_CONFIG": str(cfg)}


def consume(env: dict[str, str], tmp_path: Path, *args: str,
            handler: str = "nqlifecycle:run") -> subprocess.Popen:
    err = (tmp_path / f"consume-{time.monotonic_ns()}.err").open("w")
    return subprocess.Popen(notifyq_cmd("consume", "-q", QUEUE, "--handler", handler, *args), env=env,
                            stdout=subprocess.DEVNULL, stderr=err, text=True)


def stderr_of(tmp_path: Path) -> str:
    return "".join(p.read_text() for p in sorted(tmp_path.glob("consume-*.err")))


def produce(db, payloads: list[dict], *args: str) -> list[int]:
    result = run_cli(db.env, "produce", "-q", QUEUE, *args, *[json.dumps(p) for p in payloads])
    assert result.returncode == 0, result.stderr
    return [int(x) for x in result.stdout.split()]


def registered(db, n: int) -> None:
    wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == n, 30, message=f"{n} registered")


def unsettled(db) -> int:
    """Jobs still ready, scheduled or claimed."""
    return db.scalar("SELECT COUNT(*) FROM nq_job WHERE status IN (0, 1, 2)")


def stop(proc: subprocess.Popen, timeout: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise


def summary(tmp_path: Path) -> dict[str, int]:
    """The counts of the last "consumer stopped" line."""
    line = [ln for ln in stderr_of(tmp_path).splitlines() if "consumer stopped" in ln][-1]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


# ------------------------------------------------------------------ a crash is charged to its job


def test_a_poison_job_dies_alone_and_the_rest_of_its_batch_is_done(db, tmp_path):
    # Given 10 jobs of 3 attempts that one consumer claims as one batch; the 5th kills the process
    env = setup(db, tmp_path)
    ids = produce(db, [{"n": i, "poison": i == 5} for i in range(1, 11)], "--max-attempts", "3")
    poison = ids[4]

    # When a consumer is started again after each death, until nothing is left to run
    deaths = 0
    for _ in range(15):
        proc = consume(env, tmp_path, "--batch-size", "10")
        wait_until(lambda: proc.poll() is not None or unsettled(db) == 0, 60, 0.05,
                   message="a crash or every job settled")
        if proc.poll() is None:
            assert stop(proc) == errors.EXIT_OK
            break
        deaths += 1
    else:
        raise AssertionError("jobs still unsettled after 15 consumers")

    # Then only the poison job is dead, charged for its own crashes, with the reason
    rows = db.query("SELECT id, status, attempts, last_error FROM nq_job")
    assert [(r[0], r[1], r[2]) for r in rows] == [(poison, 4, 3)], rows
    assert "consumer died" in rows[0][3] and "out of attempts" in rows[0][3]
    # And the 9 innocent jobs ran to the end exactly once each (a crash lost no finished ack
    # here: the poison killed its claim before any ack was flushed, so 1-4 may run twice)
    finished = ends(tmp_path / "runs")
    assert set(finished) == set(ids) - {poison}
    assert all(finished[j] == 1 for j in ids[5:]), finished
    assert all(finished[j] <= 2 for j in ids[:4]), finished
    # And it crashed its consumer 4 times: in the batch (uncharged: the crash could not be
    # pinned on it), then once alone per attempt
    assert deaths == 4
    assert sorted(r.attempt for r in runs(tmp_path / "runs") if r.job == poison) == [1, 1, 2, 3]
    print(f"\npoison batch: {deaths} consumer deaths, poison dead after {rows[0][2]} attempts, "
          f"9 innocent jobs done")


# ------------------------------------------------------------------ leases of a live consumer


def test_a_live_consumer_keeps_the_leases_of_its_waiting_jobs_nothing_runs_twice(db, tmp_path):
    # Given two live consumers, a 3 s lease and a 20-job batch that takes 8 s to run
    env = setup(db, tmp_path, "[defaults]\nlease_s = 3\n", sleep_s=0.4)
    procs = [consume(env, tmp_path, "--batch-size", "20") for _ in range(2)]
    try:
        registered(db, 2)

        # When the 20 jobs are enqueued at once (one consumer claims them all)
        ids = produce(db, [{"n": i} for i in range(20)])
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0, 60, 0.1, "all 20 acked")
    finally:
        codes = [stop(p) for p in procs]

    # Then every job ran exactly once: no lease of a waiting job ran out under its live consumer
    started = collections.Counter(r.job for r in runs(tmp_path / "runs") if r.tag == "start")
    assert sorted(started) == sorted(ids)
    assert max(started.values()) == 1, {j: n for j, n in started.items() if n > 1}
    assert codes == [errors.EXIT_OK] * 2


# ------------------------------------------------------------------ stopping


def test_a_batch_running_when_the_shutdown_grace_expires_is_interrupted_uncharged(db, tmp_path):
    # Given a per-batch handler inside a 30 s batch of 4 jobs, and a 1 s shutdown grace
    env = setup(db, tmp_path, sleep_s=30, grace_s=1)
    proc = consume(env, tmp_path, "--per-batch", "--batch-size", "4", handler="nqlifecycle:run_batch")
    try:
        registered(db, 1)
        ids = produce(db, [{"n": i} for i in range(4)])
        wait_until(lambda: len(runs(tmp_path / "runs")) == 4, 30, message="the batch started")

        # When the consumer is stopped and the grace expires with the batch still running
        code = stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()

    # Then it exits 0, and the batch is on record as interrupted: ready again, no attempt
    # charged, each attempt recorded 'interrupted' with the reason; nothing is left claimed
    assert code == errors.EXIT_OK
    rows = db.query("SELECT id, status, attempts, owner, last_error FROM nq_job ORDER BY id")
    assert [r[0] for r in rows] == ids
    assert {r[1:5] for r in rows} == {(0, 0, None, None)}
    records = db.query("SELECT outcome, error FROM nq_attempt ORDER BY job_id")
    assert [r[0] for r in records] == ["interrupted"] * 4
    assert all("shutdown grace expired" in r[1] for r in records)
    assert summary(tmp_path)["failed"] == 0 and summary(tmp_path)["given_back"] == 4


def test_sigterm_mid_batch_reports_how_many_jobs_it_gave_back(db, tmp_path):
    # Given a consumer that claimed 8 one-second jobs and has started the first
    env = setup(db, tmp_path, sleep_s=1.0)
    proc = consume(env, tmp_path, "--batch-size", "8")
    try:
        registered(db, 1)
        produce(db, [{"n": i} for i in range(8)])
        wait_until(lambda: runs(tmp_path / "runs"), 30, message="a job started")
        # When it gets SIGTERM
        code = stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Then its summary counts the 7 jobs it gave back (not the row count of a signal bump)
    assert code == errors.EXIT_OK
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 0 AND attempts = 0") == 7
    assert summary(tmp_path)["given_back"] == 7


@pytest.mark.parametrize("payload, error", [
    ({"exit": 3}, "SystemExit: 3"),
    # Regression: a BaseException that is neither (asyncio.CancelledError, GeneratorExit, a class
    # of the handler's own) ended the worker thread; with two workers the other died on the retry,
    # and the consumer then exited by itself with status 0, which Restart=on-failure never restarts
    ({"raise": "cancelled"}, "CancelledError: from the handler"),
    ({"raise": "unwound", "async": True}, "Unwound: from the handler"),
])
def test_a_handler_calling_sys_exit_fails_its_job_and_the_consumer_goes_on(db, tmp_path, payload, error):
    # Given a running consumer of two workers and a job, allowed one attempt, whose handler calls
    # sys.exit(3) (or raises another BaseException)
    env = setup(db, tmp_path)
    proc = consume(env, tmp_path, "--workers", "2")
    try:
        registered(db, 1)
        [exiting] = produce(db, [payload], "--max-attempts", "1")

        # When it has run, and another job comes after it
        wait_until(lambda: db.scalar("SELECT status FROM nq_job WHERE id = %s", (exiting,)) == 4, 30,
                   message="the exiting job settled")
        [after] = produce(db, [{"n": 1}])
        wait_until(lambda: ends(tmp_path / "runs")[after] == 1, 30, message="the next job done")
        alive = proc.poll() is None
        code = stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()

    # Then the job failed like any other exception (dead: its only attempt), the consumer kept
    # going, nothing is left claimed, and the exit code and the summary tell the truth
    assert alive
    assert db.query("SELECT status, owner, last_error FROM nq_job WHERE id = %s", (exiting,)) == [
        (4, None, error)]
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2") == 0
    assert code == errors.EXIT_OK
    counts = summary(tmp_path)
    assert (counts["done"], counts["failed"], counts["dead"]) == (1, 1, 1)


# ------------------------------------------------------------------ cancel requests


def test_a_job_cancelled_while_running_is_not_run_again_when_its_consumer_dies(db, tmp_path):
    # Given a consumer inside a 30 s job that an operator asked to cancel
    env = setup(db, tmp_path, sleep_s=30)
    victim = consume(env, tmp_path)
    try:
        registered(db, 1)
        [job] = produce(db, [{"n": 1}])
        wait_until(lambda: runs(tmp_path / "runs"), 30, message="the job started")
        result = run_cli(db.env, "jobs", "cancel", str(job))
        assert result.returncode == 0, result.stderr

        # When the consumer is killed, and another consumer's reaper takes the job back
        victim.kill()
        victim.wait(10)
    finally:
        if victim.poll() is None:
            victim.kill()
    env["NQ_TEST_SLEEP"] = "0"
    survivor = consume(env, tmp_path)
    try:
        wait_until(lambda: db.scalar("SELECT status FROM nq_job WHERE id = %s", (job,)) == 5, 30,
                   message="the cancelled job cancelled")
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 1, 30, message="victim reaped")
    finally:
        assert stop(survivor) == errors.EXIT_OK

    # Then it ends cancelled with the reason, and never ran again
    assert db.scalar("SELECT last_error FROM nq_job WHERE id = %s", (job,)).startswith("cancelled")
    assert [r.pid for r in runs(tmp_path / "runs")] == [victim.pid]


def test_a_job_cancelled_while_running_is_not_run_again_when_its_lease_runs_out(db, tmp_path):
    # Given a 2 s lease, two consumers, and one of them frozen (SIGSTOP) inside a cancelled job
    env = setup(db, tmp_path, "[defaults]\nlease_s = 2\n", sleep_s=30)
    frozen = consume(env, tmp_path)
    try:
        registered(db, 1)
        [job] = produce(db, [{"n": 1}])
        wait_until(lambda: runs(tmp_path / "runs"), 30, message="the job started")
        frozen.send_signal(signal.SIGSTOP)
        result = run_cli(db.env, "jobs", "cancel", str(job))
        assert result.returncode == 0, result.stderr

        # When its lease runs out and the other consumer's reaper takes it back
        env["NQ_TEST_SLEEP"] = "0"
        other = consume(env, tmp_path)
        try:
            wait_until(lambda: db.scalar("SELECT status FROM nq_job WHERE id = %s", (job,)) == 5, 30,
                       message="the cancelled job cancelled")
        finally:
            assert stop(other) == errors.EXIT_OK
    finally:
        frozen.kill()
        frozen.wait(10)

    # Then it ends cancelled with the reason, and never ran again
    assert db.scalar("SELECT last_error FROM nq_job WHERE id = %s", (job,)) == \
        "cancelled; lease expired while it ran"
    assert [r.pid for r in runs(tmp_path / "runs")] == [frozen.pid]
