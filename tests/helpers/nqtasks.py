"""Tasks for tests/apps/test_tasks.py, on a registry of their own (none leaks into another test).
Each task appends a JSON line to $NQ_TASKS_OUT."""
import json
import os

import notifyq

registry = notifyq.TaskRegistry()


def _out(record: dict) -> None:
    with open(os.environ["NQ_TASKS_OUT"], "a") as f:
        f.write(json.dumps(record) + "\n")


@registry.task(queue="tq", max_attempts=2)
def add(a, b, *, c=0):
    _out({"task": "add", "sum": a + b + c})


@registry.task(queue="tq", name="greet")
def greet(who):
    _out({"task": "greet", "who": who})


@registry.task(queue="elsewhere")
def elsewhere():
    _out({"task": "elsewhere"})


def report_failure(job, exc):
    """consumer.on_failure for the CLI test."""
    _out({"failed": job.id, "type": type(exc).__name__, "error": str(exc)})


@registry.task(queue="atq")
async def slow_echo(n):
    import asyncio

    await asyncio.sleep(0.02)
    _out({"task": "slow_echo", "n": n})
