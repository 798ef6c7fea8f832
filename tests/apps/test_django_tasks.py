"""notifyq as the backend of Django's task framework (issue 40, item 9), on the real project of
tests/django_project, twice: Django 5 with the django-tasks backport (this interpreter), and
Django 6's own django.tasks (Python 3.12+: the interpreter of .venv-django6, which
scripts/bootstrap.sh makes where a Python 3.12 or 3.13 is found). Each skips, one line, where
its Django is missing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("django", reason="Django not installed: pip install 'notifyq[django]'")

from conftest import REPO, wait_until  # noqa: E402
from test_django import Project  # noqa: E402  the project of tests/apps/test_django.py

from notifyq.config import DSN  # noqa: E402

DJANGO6 = REPO / ".venv-django6" / "bin" / "python"


def _framework(python: str) -> str | None:
    """Which task framework `python` has, with which Django; None: none."""
    probe = ("import importlib.util as u, django; "
             "print(('django.tasks' if u.find_spec('django.tasks') else 'django_tasks' if u.find_spec('django_tasks') "
             "else '') + ' ' + django.get_version())")
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 and not done.stdout.startswith(" ") else None


@pytest.fixture(params=["django5-backport", "django6"], scope="module")
def python(request):
    if request.param == "django6":
        if not DJANGO6.exists():
            pytest.skip("no .venv-django6 (Django 6 needs Python 3.12+: scripts/bootstrap.sh makes it where one is)")
        found = _framework(str(DJANGO6))
        if not found or not found.startswith("django.tasks 6"):
            pytest.skip(f".venv-django6 has no Django 6 ({found})")
        return str(DJANGO6)
    found = _framework(sys.executable)
    if not found or not found.startswith("django_tasks "):
        pytest.skip(f"this interpreter has no Django 5 with the django-tasks backport ({found})")
    return sys.executable


def _project(server_dsn: str, python: str) -> Project:
    # Retries come fast, so that a failing task's two runs end within the test
    project = Project(DSN.parse(server_dsn), {"queue": {"default": {"max_attempts": 2, "retry_base_s": 0.05,
                                                                    "retry_max_s": 0.05}}}, python=python)
    done = project.manage("migrate", "--noinput")
    assert done.returncode == 0, done.stderr
    return project


def _shell(project: Project, code: str):
    done = project.manage("shell", "-c", code)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_inside_django_enqueue_follows_the_transaction_and_the_job_holds_the_tasks_options(server_dsn, python):
    project = _project(server_dsn, python)
    try:
        done = project.manage("test", "shop.task_framework_checks", "--noinput", "-v", "2")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Ran 7 tests" in done.stderr and "OK" in done.stderr
    finally:
        project.close()


def test_manage_py_notifyq_consume_runs_the_tasks_and_get_result_reads_their_outcomes(server_dsn, python):
    project = _project(server_dsn, python)
    try:
        # Given tasks enqueued through Django's API: one returns a value, a coroutine, one always
        # fails (two runs: max_attempts 2), one fails its first run and reads its context
        ids = _shell(project, "import json; from shop.dtasks import greet, agreet, refuse, which_attempt; "
                              "print(json.dumps([greet.enqueue('ada').id, agreet.enqueue('bo').id, "
                              "refuse.enqueue('no').id, which_attempt.enqueue(True).id]))")
        # When `manage.py notifyq consume -q default` runs (no handler named: the backend's queue
        # has the task runner as its default) until every job has ended
        consumer = project.start("notifyq", "consume", "-q", "default")
        wait_until(lambda: project.query("SELECT COUNT(*) FROM nq_job WHERE status IN (3, 4)")[0][0] == 4
                   or consumer.poll() is not None, timeout=60, message="four jobs ended")
        assert consumer.poll() is None, consumer.communicate()[1][-3000:]
        # Then get_result() gives each one's status, return value and errors
        got = _shell(project, "import json; from shop.dtasks import greet, agreet, refuse, which_attempt; "
                              f"ids = {json.dumps(ids)}; "
                              "rs = [t.get_result(i) for t, i in zip((greet, agreet, refuse, which_attempt), ids)]; "
                              "print(json.dumps([[str(r.status), r.return_value if r.status == 'SUCCESSFUL' else None, "
                              "[e.exception_class_path for e in r.errors], r.attempts, r.is_finished, "
                              "r.finished_at is not None and r.started_at is not None, "
                              "[e.exception_class.__name__ for e in r.errors]] for r in rs]))")
        assert got[0] == ["SUCCESSFUL", {"greeting": "hello ada!"}, [], 1, True, True, []]
        assert got[1] == ["SUCCESSFUL", "hello bo (async)", [], 1, True, True, []]
        assert got[2] == ["FAILED", None, ["shop.dtasks.Refused"] * 2, 2, True, True, ["Refused"] * 2]
        assert got[3] == ["SUCCESSFUL", {"attempt": 2, "id": ids[3]}, ["builtins.ValueError"], 2, True, True,
                          ["ValueError"]]
    finally:
        project.close()


def test_a_higher_django_priority_runs_first(server_dsn, python):
    project = _project(server_dsn, python)
    try:
        # Given jobs of one queue put with Django's priorities, lowest first
        _shell(project, "import json; from shop.dtasks import note; "
                        "print(json.dumps([note.using(priority=p).enqueue(f'p{p}').id for p in (-100, 0, 5, 100)]))")
        # When one worker runs the queue until it is empty
        done = project.manage("notifyq", "consume", "-q", "mail", "--workers", "1", "--exit-when-empty")
        assert done.returncode == 0, done.stderr[-3000:]
        # Then they ran highest first
        assert [r[0] for r in project.query("SELECT name FROM shop_order ORDER BY id")] == ["p100", "p5", "p0", "p-100"]
    finally:
        project.close()


def test_a_task_enqueued_in_a_traced_request_keeps_its_trace_and_get_result_reads_it(server_dsn, python):
    # (a traced job's payload is stored in an envelope: get_result read it as "not a Django task's")
    probe = subprocess.run([python, "-c", "import opentelemetry.sdk"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("this interpreter has no opentelemetry-sdk (the test extra)")
    project = _project(server_dsn, python)
    try:
        got = _shell(project, """
import json
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from notifyq.contrib import otel
from shop.dtasks import greet

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
otel.instrument(provider)
with provider.get_tracer("app").start_as_current_span("request") as request:
    result = greet.enqueue("ada")
(send,) = [s for s in exporter.get_finished_spans() if s.name == "send default"]
again = greet.get_result(result.id)
print(json.dumps([send.context.trace_id == request.get_span_context().trace_id, str(again.status), again.args]))
""")
        assert got == [True, "READY", ["ada"]]
    finally:
        project.close()
