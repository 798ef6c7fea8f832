"""Handlers for the job-lifecycle tests, run inside real `notifyq consume` processes.

Each handler start and end is one line "job_id attempt pid start|end" appended to
$NQ_TEST_OUT/<pid>.log (O_APPEND writes of one short line never interleave). A job whose
payload has "poison": true kills its process with os._exit, as a segfault or an OOM kill would;
"exit": N raises SystemExit(N) from the handler; "raise": NAME raises the BaseException of
BASE_EXCEPTIONS (no Exception), from a coroutine when "async" is true; "sleep" overrides $NQ_TEST_SLEEP.
"""

import asyncio
import os
import time


class Unwound(BaseException):
    """A handler's own BaseException subclass (no Exception)."""


BASE_EXCEPTIONS = {"cancelled": asyncio.CancelledError, "generator_exit": GeneratorExit, "unwound": Unwound}

_files = {}


def _record(job, tag):
    f = _files.get(os.getpid())
    if f is None:
        path = os.path.join(os.environ["NQ_TEST_OUT"], f"{os.getpid()}.log")
        f = _files[os.getpid()] = open(path, "a", buffering=1)
    f.write(f"{job.id} {job.attempts} {os.getpid()} {tag}\n")


def _sleep_s(job):
    return float(job.payload.get("sleep", os.environ.get("NQ_TEST_SLEEP", "0")))


def run(job):
    """Per job: record the start, crash/exit if asked, linger, record the end."""
    _record(job, "start")
    if job.payload.get("poison"):
        os._exit(70)
    if "exit" in job.payload:
        raise SystemExit(job.payload["exit"])
    if "raise" in job.payload:
        raised = BASE_EXCEPTIONS[job.payload["raise"]]("from the handler")
        if job.payload.get("async"):
            return _raise(raised)  # a coroutine: the worker runs it on its loop
        raise raised
    time.sleep(_sleep_s(job))
    _record(job, "end")


async def _raise(e):
    raise e


def run_batch(jobs):
    """Per batch: record every start, linger once for the whole batch, record every end."""
    for job in jobs:
        _record(job, "start")
    time.sleep(max(_sleep_s(job) for job in jobs))
    for job in jobs:
        _record(job, "end")
