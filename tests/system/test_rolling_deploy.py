"""A rolling deploy with real processes (issue 40 items 10 and 11): consumers of the old code
version and of the new one serve one queue at once while the old ones are stopped one by one.
Nothing is lost, nothing runs twice, and no job that needs the new code runs on the old."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import notifyq
from conftest import notifyq_cmd, wait_until
from notifyq import errors

QUEUE = "deploy"


def _consume(env: dict[str, str], tmp_path: Path, version: int) -> subprocess.Popen:
    err = (tmp_path / f"consume-v{version}-{time.monotonic_ns()}.err").open("w")
    return subprocess.Popen(notifyq_cmd("consume", "-q", QUEUE, "--handler", "nqhandlers:record_slow",
                                        "--batch-size", "5", "--version", str(version)),
                            env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)


def _finished(out: Path) -> list[tuple[int, int]]:
    """(job, pid) of every run that finished."""
    rows = []
    for path in out.glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                rows.append((int(parts[0]), int(parts[2])))
    return rows


def test_old_and_new_consumers_on_one_queue_lose_nothing_double_nothing_and_keep_new_jobs_off_old_code(db, tmp_path):
    out = tmp_path / "runs"
    out.mkdir()
    cfg = tmp_path / "nq.toml"
    cfg.write_text("[consumer]\nshutdown_grace_s = 60\nreap_interval_s = 0.5\n[wakeup]\npoll_max_s = 0.2\n")
    env = {**db.env, "NQ_TEST_OUT": str(out), "NQ_TEST_SLEEP": "0.02", "NOTIFYQ_CONFIG": str(cfg)}
    # Given two consumers of code version 1 working through plain jobs
    old = [_consume(env, tmp_path, 1) for _ in range(2)]
    new: list[subprocess.Popen] = []
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 2, 30, message="old registered")
        with notifyq.Producer(QUEUE, db.config()) as p:
            plain = p.put_many([{"n": i} for i in range(150)])
            # When the new code ships: its producers put jobs only it can run (ahead of the plain
            # ones: the old consumers' claims meet them first), a new consumer starts, and the
            # old ones are stopped one at a time while both kinds keep coming
            needs_new = p.put_many([{"n": i, "v": 2} for i in range(50)], min_version=2, priority=5)
            new.append(_consume(env, tmp_path, 2))
            for consumer in old:
                plain += p.put_many([{"n": i} for i in range(50)])
                needs_new += p.put_many([{"n": i, "v": 2} for i in range(25)], min_version=2, priority=5)
                consumer.send_signal(signal.SIGTERM)
                assert consumer.wait(60) == errors.EXIT_OK
                new.append(_consume(env, tmp_path, 2))
            needs_new += p.put_many([{"n": i, "v": 2} for i in range(25)], min_version=2, priority=5)
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0, 120, message="every job done")
    finally:
        for proc in old + new:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(60) for proc in old + new]
    assert codes == [errors.EXIT_OK] * len(codes)
    runs = _finished(out)
    # Then every job ran exactly once (lost: none; doubled: none)
    ran = sorted(job for job, _ in runs)
    assert ran == sorted(plain + needs_new)
    # And no job that needs version 2 ran on a version-1 process
    old_pids = {proc.pid for proc in old}
    wrong = [job for job, pid in runs if pid in old_pids and job in set(needs_new)]
    assert wrong == []
    # And the old consumers did take part (the test is of a mixed fleet, not a new one alone)
    assert any(pid in old_pids for _, pid in runs)
    # And nothing was interrupted or failed on the way: each job's one record says done
    assert db.query("SELECT DISTINCT outcome FROM nq_attempt") in ([], [("done",)])
