"""A job's run state (notifyq/jobs/run.py) has one writer: its own module. The handler's Job
reads it and changes it through the Run's methods only."""

import ast
import datetime as dt
from pathlib import Path

import pytest

import notifyq
from notifyq.jobs import Job, run_of
from notifyq.jobs.run import Run

PACKAGE = Path(notifyq.__file__).parent
OWNER = PACKAGE / "jobs" / "run.py"


def job() -> Job:
    now = dt.datetime(2026, 1, 1)
    return Job(id=1, queue="q", payload={}, priority=0, attempts=1, max_attempts=3, run_at=now, created_at=now)


def test_no_module_but_its_own_touches_the_run_states_fields():
    """Others read its properties and call its methods; none reaches a field (an object's own
    `self._x` of the same name is another class's), nor a Job's run but through run_of()."""
    fields = set(Run.__slots__)
    touched = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == OWNER:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Attribute):
                continue
            own = isinstance(node.value, ast.Name) and node.value.id == "self"
            if (node.attr in fields and not own) or (node.attr == "_run_state" and path.parent.name != "jobs"):
                touched.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} .{node.attr}")
    assert touched == []


@pytest.mark.parametrize("name", [n.lstrip("_") for n in Run.__slots__ if isinstance(getattr(Run, n.lstrip("_"), None),
                                                                                       property)])
def test_what_others_read_of_the_run_state_they_cannot_write(name):
    with pytest.raises(AttributeError):
        setattr(run_of(job()), name, None)


def test_the_handlers_view_of_an_outcome_is_its_runs():
    j = job()
    j.fail("", retry=False)
    assert (j.error, j.retry, run_of(j).error) == ("failed", False, "failed")
    with pytest.raises(AttributeError):
        j.error = None  # read-only for the handler: job.fail() says it
    j.snooze(2)
    assert run_of(j).snooze_s == 2.0
