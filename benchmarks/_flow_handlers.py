"""The flow benchmark's handler (benchmarks/flow.py): each job's id and its start and end on
CLOCK_MONOTONIC (one clock for every process of the machine), kept in memory and written once
at exit to $NQB_OUT/<pid>.json. With NQB_PROBE set, it installs the probe (_flow_probe.py) first;
with NQB_WORK_MS, each job sleeps that long (a handler waiting on I/O, flow.py --work-ms)."""

from __future__ import annotations

import atexit
import json
import os
import time

import _flow_probe  # noqa: F401  (installs itself only when NQB_PROBE is set)

_rows: list[tuple[int, float, float]] = []
_WORK_S = float(os.environ.get("NQB_WORK_MS") or 0) / 1000


def record(job) -> None:
    start = time.monotonic()
    if _WORK_S:
        time.sleep(_WORK_S)
    _rows.append((job.id, start, time.monotonic()))


def _dump() -> None:
    out = os.environ.get("NQB_OUT")
    if out and _rows:
        with open(os.path.join(out, f"{os.getpid()}.json"), "w") as f:
            json.dump(_rows, f)


atexit.register(_dump)
