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


def record_start(job):
    """A "job_id key time" line as the job starts (wall clock: lines of several processes compare)."""
    out = os.environ["NQ_TEST_OUT"]
    f = _files.get(os.getpid())
    if f is None:
        f = _files[os.getpid()] = open(os.path.join(out, f"{os.getpid()}.log"), "a", buffering=1)
    f.write(f"{job.id} {job.key} {time.time():.6f}\n")


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


def workflow_step(job):
    """The workflow fault test's handler (tests/fault/test_workflow_faults.py): a start line,
    then one row in wf_effect committed with the job's completion (job.transaction()), then an
    end line carrying the last moment before that COMMIT (a child its completion releases starts
    after it). Lines: "S job pid t_mono_ns" and "E job pid t_mono_ns", one os.write each."""
    fd = os.open(os.path.join(os.environ["NQ_TEST_OUT"], f"{os.getpid()}.wf"),
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"S {job.id} {os.getpid()} {time.monotonic_ns()}\n".encode())
        time.sleep(float(os.environ.get("NQ_TEST_SLEEP", "0.02")))
        with job.transaction() as cur:
            cur.execute("INSERT INTO wf_effect (job_id, pid) VALUES (%s, %s)", (job.id, os.getpid()))
            before_commit = time.monotonic_ns()
        os.write(fd, f"E {job.id} {os.getpid()} {before_commit}\n".encode())
    finally:
        os.close(fd)


def record_then_sleep(job):
    """One line per start ("job_id attempt pid"), then the run's length the payload asks for
    (`ms`, none by default): parents that stay running while children are put after them."""
    _record(job)
    time.sleep(job.payload.get("ms", 0) / 1000)


def hold_until_released(job):
    """A start line, then (payload `hold`) run until $NQ_TEST_OUT/release exists (120 s at
    most), then the end line: a job the test lets finish when it chooses. Payload `at_least_s`:
    it runs that long at least, released or not."""
    _record(job, " start")
    if job.payload.get("hold"):
        release = os.path.join(os.environ["NQ_TEST_OUT"], "release")
        started = time.monotonic()
        deadline, shortest = started + 120, started + float(job.payload.get("at_least_s", 0))
        while (not os.path.exists(release) or time.monotonic() < shortest) and time.monotonic() < deadline:
            time.sleep(0.01)  # the handler's own poll for the file, not a test's synchronisation
    _record(job)
