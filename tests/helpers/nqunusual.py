"""Handlers of unusual kinds, run inside real `notifyq consume` processes by
tests/system/test_handlers.py: coroutines, a huge non-ASCII error, a handler that forks.

Each records "job_id attempt pid tag" lines in $NQ_TEST_OUT/<pid>.log (O_APPEND writes of one
short line never interleave).
"""

import asyncio
import os
import signal
import sys
import time


def _record(job, tag):
    path = os.path.join(os.environ["NQ_TEST_OUT"], f"{os.getpid()}.log")
    with open(path, "a") as f:
        f.write(f"{job.id} {job.attempts} {os.getpid()} {tag}\n")


async def run_async(job):
    """Records its start, awaits, raises if asked, records its end: an end line proves it ran."""
    _record(job, "start")
    await asyncio.sleep(0.05)
    if job.payload.get("raise"):
        raise RuntimeError("raised after an await")
    _record(job, "end")


async def run_async_batch(jobs):
    await asyncio.gather(*(asyncio.sleep(0.01) for _ in jobs))
    for job in jobs:
        if job.payload.get("raise"):
            job.fail("failed after an await", retry=False)
        else:
            _record(job, "end")


def raise_huge(job):
    """payload "error": "han" raises 30,000 x U+6F22 (90 KB in UTF-8); "surrogate" adds lone
    surrogates, which no UTF-8 encoder takes; any other "error" is raised as it is; without one
    the job succeeds."""
    kind = job.payload.get("error")
    if kind == "han":
        raise RuntimeError("\u6f22" * 30000)
    if kind == "surrogate":
        raise RuntimeError("\ud800 lone \udfff" + "\u6f22" * 30000)
    if kind:
        raise RuntimeError(kind)
    _record(job, "end")


def fork(job):
    """Forks a child that, by payload "child": calls sys.exit(7), raises, or returns from the
    handler. The parent waits up to 5 s for it and records "child=<exit code>" (or
    "child=alive", then kills it): a child that goes on into the consumer's code never exits."""
    how = job.payload["child"]
    pid = os.fork()
    if pid == 0:
        if how == "exit":
            sys.exit(7)
        if how == "raise":
            raise ValueError("raised in the child")
        return
    deadline = time.monotonic() + 5
    status = "alive"
    while time.monotonic() < deadline:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = str(os.waitstatus_to_exitcode(raw))
            break
        time.sleep(0.02)
    if status == "alive":
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    _record(job, f"child={status}")
