"""The wake-up protocol across real `notifyq consume` processes: SIGKILL of the watcher, bursts."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from conftest import client_ports, notifyq_cmd, wait_until

from notifyq.produce.producer import Producer
from notifyq.store.locks import QueueLocks

Q = "wq"


def runs(out: Path) -> list[tuple[int, int]]:
    """(job id, pid) per handler run (nqhandlers.record lines: "job_id attempt pid")."""
    found = []
    for path in out.glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                found.append((int(parts[0]), int(parts[2])))
    return found


def records(out: Path) -> dict[int, int]:
    return dict(runs(out))


def start_consumers(db, tmp_path: Path, n: int, *extra: str, config: str = "") -> list[subprocess.Popen]:
    conf = tmp_path / "notifyq.toml"
    conf.write_text("[wakeup]\npoll_max_s = 0.5\n[log]\nlevel = \"warning\"\n" + config)
    env = {**db.env, "NQ_TEST_OUT": str(tmp_path), "NOTIFYQ_CONFIG": str(conf)}
    with open(tmp_path / "consumers.err", "a") as err:  # a file: a full pipe would block them
        return [subprocess.Popen(notifyq_cmd("consume", "-q", Q, "--handler", "nqhandlers:record", *extra),
                                 env=env, stdout=subprocess.DEVNULL, stderr=err) for _ in range(n)]


def stop_consumers(procs: list[subprocess.Popen]) -> list[int | None]:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    return [proc.wait(60) for proc in procs]


def watcher_pid(db, procs: list[subprocess.Popen]) -> int | None:
    """The pid of the consumer process whose watcher session holds the watch lock."""
    watch = QueueLocks(db.dsn.database, Q).watch
    rows = db.query("SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = IS_USED_LOCK(%s)", (watch,))
    if not rows or ":" not in rows[0][0]:
        return None
    port = int(rows[0][0].rsplit(":", 1)[1])
    return next((p.pid for p in procs if p.poll() is None and port in client_ports(p.pid)), None)


def queued_on_watch(db) -> int:
    watch = QueueLocks(db.dsn.database, Q).watch
    return db.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE %s",
                     (f"SELECT GET_LOCK('{watch}',%",))


def test_the_watchers_death_by_sigkill_hands_the_watch_to_another_consumer(db, tmp_path):
    # Given three idle consumer processes: one watching, two queued behind it
    procs = start_consumers(db, tmp_path, 3)
    try:
        wait_until(lambda: watcher_pid(db, procs) is not None and queued_on_watch(db) == 2, 60,
                   message="a watcher and two queued consumers")
        victim = watcher_pid(db, procs)
        # When the watcher is killed with SIGKILL (its connections close, its locks go with them)
        os.kill(victim, signal.SIGKILL)
        next(p for p in procs if p.pid == victim).wait(10)
        # Then another consumer becomes the watcher at once, long before any lock timeout (25 s)
        wait_until(lambda: watcher_pid(db, procs) not in (None, victim), 5, message="a new watcher")
        # And it picks up the next job within the backoff cap plus a margin
        with Producer(Q, db.config()) as producer:
            job_id = producer.put({"after": "kill"})
            put_at = time.monotonic()
            wait_until(lambda: job_id in records(tmp_path), 3, 0.01, "the job to run")
            assert time.monotonic() - put_at < 3
        assert records(tmp_path)[job_id] != victim
        # And the dead consumer's registration is reaped by the survivors
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 2, 15,
                   message="the dead consumer reaped")
    finally:
        codes = stop_consumers(procs)
    assert sorted(codes) == [-signal.SIGKILL, 0, 0]


def test_a_burst_of_10000_jobs_makes_every_consumer_busy_then_they_fall_asleep(db, tmp_path):
    # Given four idle consumer processes of two workers each, keeping finished jobs (whose
    # owner column then names the consumer that ran them)
    procs = start_consumers(db, tmp_path, 4, "--workers", "2", config="[defaults]\nkeep_done = true\n")
    try:
        # (one registration and one watcher session per process: its idle workers share them)
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 4 and queued_on_watch(db) == 3,
                   60, message="4 idle consumer processes")
        # When 10,000 jobs arrive in one transaction
        with Producer(Q, db.config()) as producer:
            producer.put_many([{"n": i} for i in range(10_000)])
        # Then all of them run exactly once, and every one of the 4 processes took part (a
        # process claims under one consumer id for all its workers)
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 3") == 10_000, 120, 0.1,
                   "10,000 jobs done")
        assert len(runs(tmp_path)) == len(records(tmp_path)) == 10_000
        assert db.scalar("SELECT COUNT(DISTINCT owner) FROM nq_job") == 4
        assert len(set(records(tmp_path).values())) == 4
        # And once the work is gone they all fall back asleep: one watcher, three queued
        wait_until(lambda: watcher_pid(db, procs) is not None and queued_on_watch(db) == 3, 30,
                   message="the fleet asleep again")
    finally:
        codes = stop_consumers(procs)
    assert codes == [0] * 4
