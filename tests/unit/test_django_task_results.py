"""contrib.django's TaskResult from a job's row and attempt records (task_results.py): the
status each notifyq state stands for, the errors of the failed runs, the exception's class
from the recorded traceback. No database: rows as job_get / job_attempts return them."""

from __future__ import annotations

import datetime as dt

import pytest

pytest.importorskip("django", reason="Django not installed: pip install 'notifyq[django]'")
try:
    from notifyq.contrib.django import task_results
    from notifyq.contrib.django.task_api import TaskResultStatus
except ImportError as e:  # Django 5 without the backport
    pytest.skip(str(e), allow_module_level=True)

T0 = dt.datetime(2026, 1, 2, 3, 4, 5)


def row(status: int, **extra) -> dict:
    return {"status": status, "owner": None, "claimed_at": None, "created_at": T0, "finished_at": None,
            **extra}


def record(attempt: int, outcome: str, error=None, traceback=None, result=None) -> dict:
    return {"attempt": attempt, "outcome": outcome, "consumer": f"c{attempt}", "host": "h",
            "started_at": T0 + dt.timedelta(seconds=attempt), "ended_at": T0 + dt.timedelta(seconds=attempt, milliseconds=5),
            "error": error, "traceback": traceback, "result": result}


def result_of(job: dict, records: list[dict]):
    return task_results.task_result(object(), 7, job, records, "default", [1], {"a": 2})


TRACEBACK = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\nshop.dtasks.Refused: no\n'


@pytest.mark.parametrize(("status", "expected"), [(0, "READY"), (1, "READY"), (2, "RUNNING"), (3, "SUCCESSFUL"),
                                                  (4, "FAILED"), (5, "FAILED")])
def test_each_notifyq_state_is_one_django_status(status, expected):
    assert result_of(row(status), []).status == TaskResultStatus[expected]


def test_a_done_job_gives_its_kept_result_and_its_runs():
    job = row(3, finished_at=T0 + dt.timedelta(seconds=9))
    got = result_of(job, [record(1, "failed", "ValueError: x", "Traceback...\nValueError: x\n"),
                          record(2, "done", result='{"n": [1, 2]}')])
    assert got.return_value == {"n": [1, 2]}
    assert got.worker_ids == ["c1", "c2"] and got.attempts == 2
    assert [e.exception_class_path for e in got.errors] == ["builtins.ValueError"]
    assert got.enqueued_at == T0.replace(tzinfo=dt.timezone.utc)
    assert got.started_at == (T0 + dt.timedelta(seconds=1)).replace(tzinfo=dt.timezone.utc)
    assert got.last_attempted_at == (T0 + dt.timedelta(seconds=2)).replace(tzinfo=dt.timezone.utc)
    assert got.finished_at == (T0 + dt.timedelta(seconds=9)).replace(tzinfo=dt.timezone.utc)


def test_a_running_job_counts_its_current_run_and_has_no_end():
    job = row(2, owner="w9", claimed_at=T0 + dt.timedelta(seconds=5), finished_at=None)
    got = result_of(job, [record(1, "failed", "KeyError: 'k'", None)])
    assert got.worker_ids == ["c1", "w9"] and got.finished_at is None
    assert got.last_attempted_at == (T0 + dt.timedelta(seconds=5)).replace(tzinfo=dt.timezone.utc)
    with pytest.raises(ValueError):
        got.return_value  # noqa: B018 - Django: not finished


def test_a_dead_job_lists_every_failed_run_and_has_no_return_value():
    got = result_of(row(4, finished_at=T0), [record(1, "failed", "Refused: no", TRACEBACK),
                                            record(2, "dead", "Refused: no", TRACEBACK)])
    assert [e.exception_class_path for e in got.errors] == ["shop.dtasks.Refused"] * 2
    assert got.errors[0].traceback == TRACEBACK
    with pytest.raises(ValueError):
        got.return_value  # noqa: B018 - Django: the task failed


@pytest.mark.parametrize(("traceback", "error", "path"), [
    (TRACEBACK, "Refused: no", "shop.dtasks.Refused"),
    (None, "TimeoutError: took too long", "builtins.TimeoutError"),  # no traceback: the error's name
    ("Traceback (most recent call last):\n  File \"x.py\"", "OSError: cut", "builtins.OSError"),  # cut short
    ("Traceback...\nKeyboardInterrupt\n", None, "builtins.KeyboardInterrupt"),  # no message
    (None, "the consumer failed while the job ran: x", "builtins.Exception"),  # notifyq's own words
    (None, "command exited with status 3", "builtins.Exception"),
])
def test_the_exception_class_comes_from_the_tracebacks_last_line(traceback, error, path):
    assert task_results.exception_class_path(traceback, error) == path


def test_a_run_taken_back_or_snoozed_counts_as_a_run_and_is_no_error():
    got = result_of(row(0), [record(1, "taken back", "its consumer died"), record(2, "snoozed")])
    assert got.worker_ids == ["c1", "c2"] and got.errors == [] and got.status == TaskResultStatus.READY
