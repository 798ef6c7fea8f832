"""Handlers the benchmark runs, in `notifyq consume` processes and in the raw floor alike.

Both sides call exactly these functions per job, so the handler's own cost cancels out of
the ratios. What ran is kept in memory (a list append per job) and written once, at exit, to
$NQB_OUT/<pid>.json: no per-job I/O inside the measured loop.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import time

_ids: list[int] = []
_stamps: list[float] = []  # e2e only: wall time at handler start, parallel to _ids
_span = {"first": None, "last": None, "cpu_first": None, "cpu_last": None}


def noop(job) -> None:
    """Drain: remember the id; the first and last call bound the steady-state rate."""
    now = time.time()
    cpu = time.process_time()
    if _span["first"] is None:
        _span["first"], _span["cpu_first"] = now, cpu
    _span["last"], _span["cpu_last"] = now, cpu
    _ids.append(job.id)


def noop_batch(jobs) -> None:
    """Drain with --per-batch: the whole claim in one call."""
    for job in jobs:
        noop(job)


async def noop_async(job) -> None:
    """Drain with a coroutine handler (--concurrency)."""
    noop(job)


def returns(job) -> dict:
    """Drain with kept results: a small JSON result per job."""
    noop(job)
    return {"ok": job.id}


def in_transaction(job) -> None:
    """Drain with job.transaction(): an empty block, so what is timed is the block's completion."""
    with job.transaction():
        noop(job)


def stamp(job) -> None:
    """End-to-end: the handler-start time of every job, matched later to its commit time."""
    _stamps.append(time.time())
    _ids.append(job.id)


_sock: socket.socket | None = None


def announce(job) -> None:
    """Pick-up: send (the payload's tag n, CLOCK_MONOTONIC at handler start) to the benchmark
    over the datagram socket $NQB_SOCK; the monotonic clock is one clock for every process."""
    global _sock
    now = time.monotonic()
    if _sock is None:
        _sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    _sock.sendto(f"{job.payload['n']} {now:.9f}".encode(), os.environ["NQB_SOCK"])


def _dump() -> None:
    out = os.environ.get("NQB_OUT")
    if not out or not (_ids or _span["first"]):
        return
    with open(os.path.join(out, f"{os.getpid()}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "ids": _ids, "stamps": _stamps, **_span}, f)


atexit.register(_dump)
