"""The rate benchmark's handler (benchmarks/flow_rate.py), in `notifyq consume` processes: it
appends "job_id start_wall_time claim_token" to $NQB_OUT/<pid>.log as each job starts (one short
O_APPEND write per job: lines never interleave). The token tells the jobs of one claim apart: a
rate counts a start when its claim commits, and the claim's first job begins right after."""

from __future__ import annotations

import os
import time

from notifyq.jobs import run_of

_files: dict[int, object] = {}


def timed(job) -> None:
    started = time.time()
    f = _files.get(os.getpid())
    if f is None:
        f = _files[os.getpid()] = open(os.path.join(os.environ["NQB_OUT"], f"{os.getpid()}.log"), "a", buffering=1)
    f.write(f"{job.id} {started:.6f} {run_of(job).completion.token}\n")
