"""A job of durable steps, run inside real `notifyq consume` processes (found via PYTHONPATH)
by tests/fault/test_kill_steps.py: three step transactions and a step inside job.transaction(),
each writing one row to step_effect, which has no unique key, so a step's effect committed twice
would show as a second row. Each step lingers NQ_TEST_SLEEP seconds inside its transaction, so
that a SIGKILL lands in the middle of one."""

import os
import time

STEPS = ("reserve", "charge", "ship")


def _effect(cur, job, step):
    cur.execute("INSERT INTO step_effect (job_id, step, attempt, pid) VALUES (%s, %s, %s, %s)",
                (job.id, step, job.attempts, os.getpid()))
    time.sleep(float(os.environ.get("NQ_TEST_SLEEP", "0.05")))  # a window for the kill, not a wait


def steps(job):
    for name in STEPS:
        with job.step(name, transaction=True) as step:
            if not step.done:
                _effect(step.cursor, job, name)
                step.result = {"by": os.getpid()}
    with job.transaction() as cur:
        with job.step("notify") as step:
            if not step.done:
                _effect(cur, job, "notify")
                step.result = [job.steps[name]["by"] for name in STEPS]
