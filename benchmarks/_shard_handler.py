"""The sharding benchmark's handler (benchmarks/shards.py): remember each job's payload number
and the time of the first and last call; written once, at exit, to $NQB_OUT/<pid>.json."""

from __future__ import annotations

import atexit
import json
import os
import time

_seen: list[int] = []
_span: dict[str, float] = {}


def record(job) -> None:
    now = time.time()
    _span.setdefault("first", now)
    _span["last"] = now
    _seen.append(job.payload["n"])


@atexit.register
def _write() -> None:
    out = os.environ.get("NQB_OUT")
    if out and _seen:
        with open(os.path.join(out, f"{os.getpid()}.json"), "w") as f:
            json.dump({"seen": _seen, **_span}, f)
