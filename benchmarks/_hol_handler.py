"""The head-of-line benchmark's handler (benchmarks/head_of_line.py), in `notifyq consume`
processes: it appends "job_id start_wall_time" to $NQB_OUT/<pid>.log as each job starts (one
short O_APPEND write per job: lines never interleave), then sleeps the payload's `sleep_s`."""

from __future__ import annotations

import os
import time

_files: dict[int, object] = {}


def timed(job) -> None:
    started = time.time()
    f = _files.get(os.getpid())
    if f is None:
        f = _files[os.getpid()] = open(os.path.join(os.environ["NQB_OUT"], f"{os.getpid()}.log"), "a", buffering=1)
    f.write(f"{job.id} {started:.6f}\n")
    time.sleep(float(job.payload.get("sleep_s", 0)))  # the job's own work
