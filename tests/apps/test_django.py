"""notifyq.contrib.django (issue 28, item 3) on a real Django project (tests/django_project):
`manage.py migrate` gives the tables, `manage.py test` runs with them in its test database
(commit, rollback, savepoint, on_commit: shop/tests.py), `manage.py notifyq consume` runs the
project's handlers and tasks, wakes on commit, and survives a server that drops idle connections."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytest.importorskip("django", reason="Django not installed: pip install 'notifyq[django]'")

from conftest import REPO, admin_connect, wait_until  # noqa: E402

from notifyq.config import DSN  # noqa: E402
from notifyq.run.localserver import LocalServer  # noqa: E402
from notifyq.store import schema  # noqa: E402

PROJECT = REPO / "tests" / "django_project"


class Project:
    """The test project on one database of `root`'s server."""

    def __init__(self, root: DSN, notifyq_config: dict | None = None, python: str = sys.executable):
        self.root = root
        self.python = python  # another interpreter (another Django) runs notifyq from this checkout
        self.name = f"nq_dj_{uuid.uuid4().hex[:10]}"
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("NOTIFYQ_")},
                    "NQ_DJANGO_HOST": root.host, "NQ_DJANGO_PORT": str(root.port), "NQ_DJANGO_USER": root.user,
                    "NQ_DJANGO_PASSWORD": root.password or "", "NQ_DJANGO_NAME": self.name,
                    "NQ_DJANGO_TEST_NAME": f"test_{self.name}",
                    "NQ_DJANGO_NOTIFYQ_CONFIG": json.dumps(notifyq_config or {}),
                    "PYTHONPATH": os.pathsep.join([str(PROJECT), str(REPO)])}
        conn = admin_connect(root)
        conn.cursor().execute(f"CREATE DATABASE `{self.name}` CHARACTER SET utf8mb4")
        conn.close()
        self.procs: list[subprocess.Popen] = []

    def manage(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run([self.python, "manage.py", *args], cwd=PROJECT, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def start(self, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen([self.python, "manage.py", *args], cwd=PROJECT, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def query(self, sql: str, params=None) -> list[tuple]:
        conn = admin_connect(self.root, self.name)
        try:
            cur = conn.cursor()
            cur.execute(sql, params)
            return list(cur.fetchall())
        finally:
            conn.close()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
        conn = admin_connect(self.root)
        for name in (self.name, f"test_{self.name}"):
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()


@pytest.fixture
def project(server_dsn):
    p = Project(DSN.parse(server_dsn))
    yield p
    p.close()


def _migrated(project: Project) -> None:
    done = project.manage("migrate", "--noinput")
    assert done.returncode == 0, done.stderr


def test_manage_py_migrate_creates_notifyqs_schema_and_a_second_run_changes_nothing(project):
    # Given an empty database, When `manage.py migrate` runs
    _migrated(project)
    # Then it holds notifyq's current schema, applied by notifyq's own migration
    assert int(project.query("SELECT value FROM nq_meta WHERE name = 'schema_version'")[0][0]) == schema.code_version()
    assert ("notifyq", "0001_initial") in project.query("SELECT app, name FROM django_migrations")
    # And a second run has nothing to do; `manage.py notifyq status` reads the same database
    again = project.manage("migrate", "--noinput")
    assert again.returncode == 0 and "No migrations to apply" in again.stdout
    status = project.manage("notifyq", "status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["queues"] == [] or "queues" in json.loads(status.stdout)


def test_the_django_migrations_reach_the_schema_version_of_this_notifyq():
    # A notifyq migration without its Django migration would leave Django projects behind.
    from notifyq.contrib.django.migrations import __path__ as migrations_path

    texts = [p.read_text() for p in Path(migrations_path[0]).glob("0*.py")]
    versions = [int(line.split("=")[1]) for t in texts for line in t.splitlines()
                if line.startswith("SCHEMA_VERSION =")]
    assert max(versions) == schema.code_version()


def test_manage_py_test_runs_with_notifyqs_tables_in_the_test_database(project):
    # shop/tests.py: the test database's schema, enqueue_on_commit under commit, rollback and
    # savepoint, the on_commit ring registered only for a commit, a task on Django's connection, a key
    done = project.manage("test", "shop", "--noinput", "-v", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Ran 7 tests" in done.stderr and "OK" in done.stderr


def test_manage_py_notifyq_refuses_a_dsn_in_one_line(project):
    done = project.manage("notifyq", "status", "--dsn", "mysql://x@y/z")
    assert done.returncode == 3
    assert done.stderr.strip().splitlines() == [
        "notifyq: error: --dsn: manage.py notifyq uses the database of settings.NOTIFYQ['DATABASE']"]


def test_a_job_enqueued_on_commit_is_picked_up_at_once_not_at_the_next_poll(server_dsn):
    # Given a consumer whose poll comes only every 5 s (so only a ring can start a job sooner)
    project = Project(DSN.parse(server_dsn), {"wakeup": {"poll_initial_s": 5.0, "poll_max_s": 5.0}})
    try:
        _migrated(project)
        consumer = project.start("notifyq", "consume", "-q", "pickup", "--handler", "shop.handlers:record")
        wait_until(lambda: project.query("SELECT COUNT(*) FROM nq_consumer")[0][0] == 1 or consumer.poll() is not None,
                   message="the consumer registered")
        assert consumer.poll() is None, consumer.communicate()[1]
        # When jobs are enqueued in atomic() blocks, one after another
        done = project.manage("enqueue_and_wait", "--queue", "pickup", "--jobs", "5")
        assert done.returncode == 0, done.stderr
        pickups = json.loads(done.stdout)
        # Then each starts well before the 5 s poll (the on_commit ring woke the consumer)
        assert None not in pickups, pickups
        assert max(pickups) < 1500, pickups
    finally:
        project.close()


def test_consume_tasks_runs_a_projects_task_and_fails_an_unknown_one_clearly(project):
    _migrated(project)
    # Given a task job and a job naming no task of the module
    put = project.manage("shell", "-c", "from shop.tasks import make_order; "
                         "print(make_order.enqueue('via-task', copies=2))")
    assert put.returncode == 0, put.stderr
    bad = project.manage("notifyq", "produce", "-q", "orders", '{"task": "shop.tasks.rm_rf", "args": []}')
    assert bad.returncode == 0, bad.stderr
    # When a consumer runs the queue with --tasks until it is empty
    run = project.manage("notifyq", "consume", "-q", "orders", "--tasks", "shop.tasks", "--exit-when-empty")
    assert run.returncode == 0, run.stderr
    # Then the task ran with its arguments, and the other job failed naming what it asked for
    assert project.query("SELECT name FROM shop_order ORDER BY id") == [("via-task",), ("via-task",)]
    errors = [r[0] for r in project.query("SELECT last_error FROM nq_job WHERE queue = 'orders'")]
    assert errors == ["UnknownTask: unknown task 'shop.tasks.rm_rf'; this consumer runs: shop.tasks.make_order"]


@pytest.fixture(scope="module")
def forgetful_server(tmp_path_factory):
    """A private server that drops a connection idle for 2 s (SET GLOBAL wait_timeout)."""
    server = LocalServer(tmp_path_factory.mktemp("forgetful"))
    server.start()
    try:
        conn = admin_connect(DSN.parse(server.dsn))
        conn.cursor().execute("SET GLOBAL wait_timeout = 2")
        conn.close()
        yield server.dsn
    finally:
        server.cleanup()


@pytest.mark.parametrize("conn_max_age", ["0", "none"])
def test_an_orm_handler_keeps_working_after_the_server_dropped_its_idle_connection(forgetful_server, conn_max_age):
    # CONN_MAX_AGE = None (persistent connections) kept the dropped connection: the job after
    # the idle gap failed with 2006 "server has gone away" (fails on the code before so)
    project = Project(DSN.parse(forgetful_server))
    project.env["NQ_DJANGO_CONN_MAX_AGE"] = conn_max_age
    try:
        _migrated(project)
        consumer = project.start("notifyq", "consume", "-q", "stale", "--handler", "shop.handlers:record")
        # Given a handler that ran once on the ORM's connection
        assert project.manage("notifyq", "produce", "-q", "stale", '{"n": 0}').returncode == 0
        first = wait_until(lambda: project.query("SELECT connection_id FROM shop_handled"), timeout=60,
                           message="the first job handled")[0][0]
        # And the server dropped that connection once it sat idle past wait_timeout
        wait_until(lambda: not project.query("SELECT 1 FROM information_schema.processlist WHERE id = %s",
                                             (first,)), timeout=30, message="the idle connection dropped")
        # When more jobs come
        assert project.manage("notifyq", "produce", "-q", "stale", *[json.dumps({"n": i}) for i in range(1, 6)]).returncode == 0
        # Then every one is handled, none failed (2006 "server has gone away" before)
        wait_until(lambda: project.query("SELECT COUNT(*) FROM shop_handled")[0][0] == 6 or consumer.poll() is not None,
                   timeout=60, message="six jobs handled")
        assert project.query("SELECT COUNT(*) FROM shop_handled")[0][0] == 6, consumer.communicate()[1][-2000:]
        assert project.query("SELECT COUNT(*) FROM nq_job WHERE last_error IS NOT NULL") == [(0,)]
        assert project.query("SELECT outcome, error FROM nq_attempt WHERE outcome <> 'done'") == []
        later = [r[0] for r in project.query("SELECT connection_id FROM shop_handled ORDER BY id")][1:]
        assert first not in later  # the dropped connection was replaced, not used
    finally:
        project.close()


def test_complete_in_commits_an_orm_write_with_the_completion_and_a_stale_claim_rolls_it_back(project, tmp_path):
    _migrated(project)
    out = tmp_path / "out.jsonl"
    project.env["NQ_DJANGO_OUT"] = str(out)
    # Given two jobs whose handler writes an order through the ORM in transaction.atomic() and
    # completes its job there with job.complete_in(connection); the second has its claim taken
    # back before its first run completes it; so have the third, whose handler catches ClaimLost
    # inside its atomic() block and returns, and the fourth, which catches it in an inner block
    put = project.manage("notifyq", "produce", "-q", "charges", '{"n": 1}', '{"n": 2, "lose_claim": true}',
                         '{"n": 3, "swallow": true}', '{"n": 4, "nested": true}')
    assert put.returncode == 0, put.stderr
    first, second, third, fourth = [r[0] for r in project.query("SELECT id FROM nq_job WHERE queue = 'charges' "
                                                                "ORDER BY id")]
    # When a consumer runs the queue until it is empty
    run = project.manage("notifyq", "consume", "-q", "charges", "--handler", "shop.handlers:charge_once",
                         "--exit-when-empty")
    assert run.returncode == 0, run.stderr
    # Then the first job's order and its completion committed together: one order, the job done
    # (and never acked a second time)
    orders = [r[0] for r in project.query("SELECT name FROM shop_order ORDER BY id")]
    assert orders == [f"charge-{first}-1", f"charge-{second}-2", f"charge-{third}-2", f"charge-{fourth}-2"]
    attempts = project.query("SELECT job_id, attempt, outcome FROM nq_attempt ORDER BY job_id, attempt")
    assert (first, 1, "done") in attempts and (second, 2, "done") in attempts
    assert project.query("SELECT COUNT(*) FROM nq_job WHERE queue = 'charges' AND status IN (0, 1, 2)") == [(0,)]
    # And the stale runs raised ClaimLost, and their orders were rolled back, also the one whose
    # handler did not let ClaimLost leave the block: only the runs that took over stored one
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"job": job, "attempt": 1, "raised": "ClaimLost"} for job in (second, third, fourth)]
    assert "done=4 failed=0 dead=0 given_back=0 lost_acks=3" in run.stderr  # the stale runs' outcomes fenced out


_TRACED_REQUEST = """
import json
from django.db import transaction
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from notifyq.contrib import otel
from notifyq.contrib.django import enqueue_on_commit

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
otel.instrument(provider)
with provider.get_tracer("app").start_as_current_span("request") as request:
    with transaction.atomic():
        job_id = enqueue_on_commit("traced", {"n": 1})
(send,) = [s for s in exporter.get_finished_spans() if s.name == "send traced"]
print(json.dumps({"job": job_id, "trace": f"{request.get_span_context().trace_id:032x}",
                  "request": f"{request.get_span_context().span_id:016x}",
                  "send": f"{send.context.span_id:016x}", "send_parent": f"{send.parent.span_id:016x}"}))
"""


def test_a_job_enqueued_on_commit_in_a_traced_request_keeps_the_requests_trace(project):
    pytest.importorskip("opentelemetry.sdk", reason="the tracing tests need opentelemetry-sdk (the test extra)")
    from notifyq.jobs import envelope

    # Given a migrated project, When a traced request enqueues on commit
    _migrated(project)
    done = project.manage("shell", "-c", _TRACED_REQUEST)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # Then the enqueue is a send span of the request, and the job keeps its context
    assert seen["send_parent"] == seen["request"]
    text = project.query("SELECT payload FROM nq_job WHERE id = %s", (seen["job"],))[0][0]
    payload, context = envelope.opened(text.decode() if isinstance(text, bytes) else text)
    assert payload == {"n": 1}
    assert context["traceparent"].startswith(f"00-{seen['trace']}-{seen['send']}-")
