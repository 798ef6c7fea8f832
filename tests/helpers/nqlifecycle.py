"""Handlers for the job-lifecycle tests, run inside real `notifyq consume` processes.

Each handler start and end is one line "job_id attempt pid start|end" appended to
$NQ_TEST_OUT/<pid>.log (O_APPEND writes of one short line never interleave). A job whose
payload has "poison": true kills its process with os._exit, as a segfault or an OOM kill would;
"exit": N raises SystemExit(N) from the handler; "sleep" overrides $NQ_TEST_SLEEP.
"""

import os
import time

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
    time.sleep(_sleep_s(job))
    _record(job, "end")


def run_batch(jobs):
    """Per batch: record every start, linger once for the whole batch, record every end."""
    for job in jobs:
        _record(job, "start")
    time.sleep(max(_sleep_s(job) for job in jobs))
    for job in jobs:
        _record(job, "end")
