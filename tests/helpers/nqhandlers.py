"""Handlers the tests run inside real `notifyq consume` processes (found via PYTHONPATH).

They record what ran by appending "job_id attempt pid" lines to $NQ_TEST_OUT/<pid>.log:
O_APPEND writes of one short line are atomic, so files never interleave mid-line."""

import os
import time

_files = {}


def _record(job, tag=""):
    out = os.environ["NQ_TEST_OUT"]
    f = _files.get(os.getpid())
    if f is None:
        f = _files[os.getpid()] = open(os.path.join(out, f"{os.getpid()}.log"), "a", buffering=1)
    f.write(f"{job.id} {job.attempts} {os.getpid()}{tag}\n")


def record(job):
    _record(job)


def record_slow(job):
    """Start, linger, finish: leaves jobs in flight for kill tests."""
    _record(job, " start")
    time.sleep(float(os.environ.get("NQ_TEST_SLEEP", "0.05")))
    _record(job)


def fail_always(job):
    raise RuntimeError(f"boom on attempt {job.attempts}")


def record_batch(jobs):
    for job in jobs:
        if job.payload.get("fail"):
            job.fail("asked to fail", retry=False)
        else:
            _record(job)
