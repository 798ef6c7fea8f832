"""Producers and consumers as real `notifyq` processes, all at once."""

import collections
import signal
import subprocess
import time
from pathlib import Path

from conftest import notifyq_cmd, wait_until


def read_records(out: Path) -> list[tuple[int, int, int]]:
    rows = []
    for path in out.glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                rows.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return rows


def test_20000_jobs_2_producers_8_consumers_each_job_handled_exactly_once(db, tmp_path):
    # Given 8 consumer processes waiting on an empty queue
    env = {**db.env, "NQ_TEST_OUT": str(tmp_path)}
    consumers = [subprocess.Popen(notifyq_cmd("consume", "-q", "load", "--handler", "nqhandlers:record"),
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for _ in range(8)]
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 8, 60, message="8 consumers")
        # When 2 producers stream 10,000 jobs each at the same time
        started = time.monotonic()
        producers = []
        for p in range(2):
            lines = "".join(f'{{"p": {p}, "n": {i}}}\n' for i in range(10_000))
            proc = subprocess.Popen(notifyq_cmd("produce", "-q", "load"), env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            producers.append((proc, lines))
        for proc, lines in producers:
            out, err = proc.communicate(lines, timeout=120)
            assert proc.returncode == 0, err
            assert "enqueued 10000" in out
        # Then every job is handled, and exactly once
        wait_until(lambda: len(read_records(tmp_path)) >= 20_000, 180, 0.1, "20,000 handled jobs")
        elapsed = time.monotonic() - started
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0, 30, message="all acked")
    finally:
        for proc in consumers:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(60) for proc in consumers]
    records = read_records(tmp_path)
    counts = collections.Counter(job_id for job_id, _, _ in records)
    assert len(counts) == 20_000
    assert max(counts.values()) == 1, "a job ran twice"
    assert codes == [0] * 8
    assert len({pid for _, _, pid in records}) >= 2, "the work was not shared"
    print(f"\n20,000 jobs, 2 producers, 8 consumers: {elapsed:.2f}s ({20_000 / elapsed:.0f} jobs/s)")
