"""A handler for the head-of-line tests, in real `notifyq consume` processes (found via
PYTHONPATH): it appends "job_id attempt pid" to $NQ_TEST_OUT/<pid>.log as each job starts, and a
job whose payload says "hold" then waits until the file $NQ_TEST_OUT/release exists (60 s at most)."""

import os
import time


def hold_or_record(job):
    out = os.environ["NQ_TEST_OUT"]
    with open(os.path.join(out, f"{os.getpid()}.log"), "a") as f:
        f.write(f"{job.id} {job.attempts} {os.getpid()}\n")
    if job.payload.get("hold"):
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(out, "release")) and time.monotonic() < deadline:
            time.sleep(0.01)  # a file the test creates: the only signal across processes here
