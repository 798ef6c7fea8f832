"""notifyq.testing (issue "Shape, round two"): an app's tests run a queue's jobs in their own
process with the consumer's real claim and ack path (`drain`), look at what is pending without
running it (`jobs`, `assert_enqueued`), start each test on empty queues (`clear`), and get all of
it bound to their test database from a pytest fixture (`notifyq.testing.pytest`)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap
import threading
import uuid

import MySQLdb
import pytest
from conftest import REPO, _url, admin_connect

import notifyq
from notifyq import errors, testing
from notifyq.config import DSN
from notifyq.store import testing as store_testing


def _registry(db, **config):
    return notifyq.TaskRegistry(db.config(**config))


def _status(db, job_id):
    return db.scalar("SELECT status FROM nq_job WHERE id = %s", (job_id,))


# ---------------------------------------------------------------- drain

def test_drain_runs_every_job_on_this_thread_including_jobs_that_jobs_put_on_another_queue(db):
    # Given a task that fans out into jobs of a second queue, and two roots enqueued
    registry = _registry(db)
    seen, threads = [], set()

    @registry.task(queue="fan")
    def fan_out(n):
        threads.add(threading.get_ident())
        for i in range(n):
            leaf.enqueue(i)

    @registry.task(queue="leaves")
    def leaf(i):
        threads.add(threading.get_ident())
        seen.append(i)

    try:
        fan_out.enqueue(3)
        fan_out.enqueue(2)
        # When both queues are drained (leaves first: its jobs only appear while fan runs)
        result = testing.drain(db.config(), ["leaves", "fan"], registry)
        # Then every job ran, here, once, and nothing is left
        assert sorted(seen) == [0, 0, 1, 1, 2]
        assert threads == {threading.get_ident()}
        assert (result.done, result.failed, result.dead, result.ran, result.stopped_by) == (7, 0, 0, 7, "")
        assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
        # And the consumer's real path ran them: registered, claimed under a token, acked
        assert db.scalar("SELECT COUNT(*) FROM nq_attempt WHERE outcome = 'done'") == 7
        assert db.scalar("SELECT COUNT(*) FROM nq_consumer") == 0  # unregistered at the end
    finally:
        registry.close()


def test_drain_reraises_the_first_handler_exception_with_its_job_after_recording_the_failure(db):
    # Given three jobs, the second of which makes the handler raise
    producer = notifyq.Producer("fails", db.config())
    ran = []

    def handler(job):
        ran.append(job.payload["n"])
        if job.payload["n"] == 2:
            raise ValueError("no such customer")

    try:
        ids = [producer.put({"n": n}, max_attempts=3) for n in (1, 2, 3)]
        # When drained with raise_on_failure (the default)
        with pytest.raises(ValueError, match="no such customer") as raised:
            testing.drain(db.config(), "fails", handler)
        # Then the exception is the handler's, noted with the job, and the drain stopped there
        note = "\n".join(raised.value.__notes__)
        assert f"job {ids[1]} of queue fails" in note and "attempt 1/3" in note and "now: retry" in note
        assert ran == [1, 2]
        # And the failure was recorded as a consumer records it: retried later by the policy
        assert _status(db, ids[1]) == 1  # scheduled: its retry waits for its backoff
        assert "no such customer" in db.scalar("SELECT last_error FROM nq_job WHERE id = %s", (ids[1],))
        assert _status(db, ids[0]) is None and _status(db, ids[2]) == 0  # done; never started
    finally:
        producer.close()


def test_drain_without_raising_returns_each_failure_with_its_exception_and_outcome(db):
    # Given a job that fails with attempts left, one that fails on its last, one that succeeds
    producer = notifyq.Producer("report", db.config())

    class Declined(Exception):
        pass

    def handler(job):
        if job.payload != "ok":
            raise Declined(job.payload)

    try:
        retrying = producer.put("again", max_attempts=5)
        dead = producer.put("last", max_attempts=1)
        producer.put("ok")
        # When drained without raising
        result = testing.drain(db.config(), "report", handler, raise_on_failure=False)
        # Then the result counts them and holds each failure with what the handler raised
        assert (result.done, result.failed, result.retried, result.dead, result.cancelled) == (1, 2, 1, 1, 0)
        by_id = {f.job.id: f for f in result.failures}
        assert set(by_id) == {retrying, dead}
        assert isinstance(by_id[retrying].exception, Declined) and by_id[retrying].outcome == "retry"
        assert str(by_id[dead].exception) == "last" and by_id[dead].outcome == "dead"
        assert _status(db, dead) == 4
    finally:
        producer.close()


def test_drain_leaves_delayed_jobs_unless_run_delayed_makes_them_and_every_retry_due(db):
    # Given a delayed job and a job that always fails, with 3 attempts
    producer = notifyq.Producer("later", db.config())
    runs = []

    def handler(job):
        runs.append(job.payload)
        if job.payload == "flaky":
            raise RuntimeError("still down")

    try:
        delayed = producer.put("delayed", delay=3600)
        flaky = producer.put("flaky", max_attempts=3)
        # When drained plainly: the delayed job waits, the failure waits for its backoff
        first = testing.drain(db.config(), "later", handler, raise_on_failure=False)
        assert runs == ["flaky"] and (first.failed, first.retried) == (1, 1)
        assert _status(db, delayed) == 1 and _status(db, flaky) == 1
        # When drained with run_delayed
        second = testing.drain(db.config(), "later", handler, raise_on_failure=False, run_delayed=True)
        # Then the delayed job ran now, and the failing one until it was dead
        assert sorted(runs) == ["delayed", "flaky", "flaky", "flaky"]
        assert (second.done, second.failed, second.retried, second.dead) == (1, 2, 1, 1)
        assert [f.outcome for f in second.failures] == ["retry", "dead"]
        assert _status(db, delayed) is None and _status(db, flaky) == 4
    finally:
        producer.close()


def test_drain_stops_at_max_jobs_and_raises_drain_timeout_past_its_deadline(db):
    # Given five jobs
    producer = notifyq.Producer("bounded", db.config())
    try:
        producer.put_many([{"n": n} for n in range(5)])
        # When drained with max_jobs=2
        result = testing.drain(db.config(), "bounded", lambda job: None, max_jobs=2)
        # Then two ran, and the rest is pending
        assert (result.done, result.stopped_by) == (2, "max_jobs")
        assert len(testing.jobs(db.config(), "bounded")) == 3

        # Given a handler that puts another job every time (the queue never empties)
        def forever(job):
            producer.put({"n": job.payload["n"] + 1})

        # When drained with a deadline
        with pytest.raises(testing.DrainTimeout, match="bounded not drained within timeout_s=0.5") as raised:
            testing.drain(db.config(), "bounded", forever, timeout_s=0.5)
        # Then the error says so and carries what was done
        assert raised.value.result.done >= 3
    finally:
        producer.close()


def test_drain_with_no_handler_runs_the_tasks_the_queues_config_names(db, tmp_path, monkeypatch):
    # Given a queue whose config names a tasks module (as `[queue.tq] tasks = ...` would)
    monkeypatch.syspath_prepend(str(REPO / "tests" / "helpers"))
    monkeypatch.setenv("NQ_TASKS_OUT", str(tmp_path / "out"))
    config = db.config(queue={"tq": {"tasks": "nqtasks"}})
    producer = notifyq.Producer("tq", config)
    try:
        producer.put({"task": "greet", "args": ["ada"], "kwargs": {}})
        # When drained with no handler given
        result = testing.drain(config, "tq")
        # Then the config's task ran the job
        assert result.done == 1
        assert (tmp_path / "out").read_text() == '{"task": "greet", "who": "ada"}\n'
    finally:
        producer.close()


def test_drain_refuses_bad_input_with_one_clear_error(db):
    config = db.config()
    with pytest.raises(errors.InputError, match="invalid queue name 'no spaces'"):
        testing.drain(config, "no spaces", lambda job: None)
    with pytest.raises(errors.InputError, match="no handler for queue nothing_here: pass handler="):
        testing.drain(config, "nothing_here")
    with pytest.raises(errors.InputError, match="handler must be a function, a task"):
        testing.drain(config, "q", handler=42)
    with pytest.raises(errors.InputError, match="max_jobs"):
        testing.drain(config, "q", lambda job: None, max_jobs=0)
    registry = notifyq.TaskRegistry(config)
    registry.task(lambda: None, queue="elsewhere", name="t")
    with pytest.raises(errors.InputError, match="no task for queue q: the registry has on queue"):
        testing.drain(config, "q", registry)
    with pytest.raises(errors.InputError, match="expected a Config, a DSN URL or None"):
        testing.drain(3.5, "q", lambda job: None)


# ---------------------------------------------------------------- looking without running

def test_assert_enqueued_matches_a_tasks_arguments_and_says_what_the_queue_holds_when_not(db):
    # Given a task's two jobs
    registry = _registry(db)

    @registry.task(queue="mail", name="send")
    def send(to, *, template="welcome"):
        pass

    try:
        first = send.enqueue("a@example.com")
        send.enqueue("b@example.com", template="reset", delay=60)
        # Then both are pending (one scheduled), nothing ran, and they match by task and arguments
        held = testing.jobs(db.config(), "mail")
        assert [(j.id, j.status, j.task, j.args, j.kwargs) for j in held][0] == (
            first, "ready", "send", ["a@example.com"], {})
        assert held[1].status == "scheduled" and held[1].kwargs == {"template": "reset"}
        match = testing.assert_enqueued(db.config(), "mail", task=send, args=["b@example.com"],
                                        kwargs={"template": "reset"})
        assert [j.id for j in match] == [held[1].id]
        testing.assert_enqueued(db.config(), "mail", task="send", count=2)
        testing.assert_enqueued(db.config(), "mail", args=["c@example.com"], count=0)
        # When nothing matches, the assertion lists what the queue holds
        with pytest.raises(AssertionError, match=r"1 matched") as raised:
            testing.assert_enqueued(db.config(), "mail", task=send, count=2, args=["a@example.com"])
        assert f"#{first} ready" in str(raised.value) and "a@example.com" in str(raised.value)
        # And it lists every job of the queue, also when the task named has none
        with pytest.raises(AssertionError, match=r"0 matched") as raised:
            testing.assert_enqueued(db.config(), "mail", task="no.such.task")
        assert f"#{first} ready" in str(raised.value)
        with pytest.raises(errors.InputError, match="invalid status 'sleeping'"):
            testing.jobs(db.config(), "mail", status="sleeping")
    finally:
        registry.close()


def test_jobs_on_the_callers_connection_see_its_uncommitted_puts_and_a_session_of_its_own_does_not(db):
    # Given a job put in a transaction left open on the caller's connection (a Django TestCase's)
    producer = notifyq.Producer("tx", db.config())
    conn = MySQLdb.connect(**db.dsn.connect_args())
    try:
        job_id = producer.put({"order": 7}, conn=conn)
        # Then the caller's connection sees it; notifyq's own session (and so drain) does not
        testing.assert_enqueued(db.config(), "tx", payload={"order": 7}, conn=conn)
        assert testing.jobs(db.config(), "tx") == []
        assert testing.drain(db.config(), "tx", lambda job: None).ran == 0
        # And once committed, it runs
        conn.commit()
        assert testing.drain(db.config(), "tx", lambda job: None).done == 1
        assert _status(db, job_id) is None
    finally:
        conn.close()
        producer.close()


def test_clear_deletes_one_queues_jobs_records_and_dedup_keys_or_every_queues_and_resumes_it(db):
    # Given jobs on two queues, one with a dedup key, a done job's record, and a paused queue
    producer, other = notifyq.Producer("c1", db.config()), notifyq.Producer("c2", db.config())
    try:
        producer.put("x")
        testing.drain(db.config(), "c1", lambda job: None)
        producer.put("y", dedup_key="k")
        other.put("z")
        db.query("INSERT INTO nq_queue (queue, paused) VALUES ('c1', 1) ON DUPLICATE KEY UPDATE paused = 1")
        # When c1 is cleared
        assert testing.clear(db.config(), "c1") == 1
        # Then c1 has no job, record, key or pause left, and c2 is untouched
        assert db.query("SELECT queue FROM nq_job") == [("c2",)]
        assert db.scalar("SELECT COUNT(*) FROM nq_attempt WHERE queue = 'c1'") == 0
        assert db.scalar("SELECT COUNT(*) FROM nq_dedup WHERE queue = 'c1'") == 0
        assert db.scalar("SELECT paused FROM nq_queue WHERE queue = 'c1'") == 0
        assert producer.put("y", dedup_key="k") > 0  # the key is free again
        # When every queue is cleared
        assert testing.clear(db.config()) == 2
        assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    finally:
        producer.close()
        other.close()


def test_the_testing_statements_are_each_used_and_bind_every_value():
    source = (REPO / "notifyq" / "store" / "testing.py").read_text()
    assert set(store_testing.STATEMENTS) == set(re.findall(r'"(testing_[a-z_]+)"', source))
    for name, text in store_testing.STATEMENTS.items():
        assert "{" not in text and "'%s'" not in text, name


# ---------------------------------------------------------------- the pytest plugin

APP_CONFTEST = 'pytest_plugins = ["notifyq.testing.pytest"]\n'
APP_TESTS = '''
import pytest
import notifyq
from notifyq import testing

@notifyq.task(queue="inner")
def greet(name):
    SEEN.append(name)
    if name == "nobody":
        raise LookupError("nobody to greet")

SEEN = []

def test_a_put_then_drained(notifyq_queue, notifyq_drain):
    greet.enqueue("ada")
    notifyq_queue.assert_enqueued("inner", task=greet, args=["ada"])
    assert notifyq_drain("inner").done == 1 and SEEN == ["ada"]
    greet.enqueue("left pending")

def test_b_starts_on_an_empty_queue(notifyq_queue):
    assert notifyq_queue.jobs("inner") == []

def test_c_a_failure_is_raised_with_its_job(notifyq_drain):
    job_id = greet.enqueue("nobody")
    with pytest.raises(LookupError) as raised:
        notifyq_drain("inner")
    assert f"job {job_id} of queue inner" in raised.value.__notes__[0]
'''


def _run_app_tests(tmp_path, database: str, server_dsn: str) -> subprocess.CompletedProcess:
    root = DSN.parse(server_dsn)
    (tmp_path / "conftest.py").write_text(APP_CONFTEST)
    (tmp_path / "test_app.py").write_text(textwrap.dedent(APP_TESTS))
    env = {**os.environ, "NOTIFYQ_DSN": _url(dataclasses.replace(root, database=database)),
           "NOTIFYQ_CONFIG": "/dev/null", "NOTIFYQ_PASSWORD": root.password or ""}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_the_pytest_plugin_gives_an_apps_tests_the_drain_on_a_fresh_test_database_emptied_between_tests(
        tmp_path, server_dsn):
    # Given an app's tests using the fixtures, and $NOTIFYQ_DSN naming a database not created yet
    database = f"nq_test_{uuid.uuid4().hex[:12]}"
    try:
        # When pytest runs them
        run = _run_app_tests(tmp_path, database, server_dsn)
        # Then the schema was made, each test passed, and the second started on an empty queue
        assert run.returncode == 0, run.stdout + run.stderr
        assert "3 passed" in run.stdout
    finally:
        conn = admin_connect(DSN.parse(server_dsn))
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{database}`")
        conn.close()


def test_the_pytest_plugin_refuses_a_database_whose_name_is_not_a_tests(tmp_path, server_dsn):
    run = _run_app_tests(tmp_path, "nq_orders", server_dsn)
    assert run.returncode != 0
    assert "database 'nq_orders' has no 'test' in its name" in run.stdout


def test_importing_notifyq_testing_imports_no_pytest():
    code = "import sys, notifyq.testing; assert 'pytest' not in sys.modules, 'pytest imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_under_django_drain_runs_a_transaction_testcases_jobs_and_a_testcase_sees_its_own_on_its_connection(
        server_dsn):
    pytest.importorskip("django", reason="Django not installed: pip install 'notifyq[django]'")
    from test_django import Project  # the project of tests/apps/test_django.py, on its own database

    project = Project(DSN.parse(server_dsn))
    try:
        done = project.manage("test", "shop.drain_checks", "--noinput", "-v", "2")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Ran 3 tests" in done.stderr and "OK" in done.stderr
    finally:
        project.close()


def test_drain_counts_a_job_cancelled_while_it_ran_as_cancelled_and_gives_a_batch_handler_its_batches(db):
    # Given a job whose cancel is requested while its handler runs, and the handler stopping it
    from notifyq.ops import admin
    from notifyq.store.db import Session

    producer = notifyq.Producer("stoppable", db.config())
    session = Session(db.dsn, name="canceller")

    def handler(job):
        assert admin.cancel(session, job.id, by="the test")
        assert job.cancel_requested()
        job.fail("cancelled", retry=False)

    try:
        job_id = producer.put("long work", max_attempts=5)
        # When drained
        result = testing.drain(db.config(), "stoppable", handler, raise_on_failure=False)
        # Then it counts as cancelled, not failed or dead, as the server recorded it
        assert (result.failed, result.cancelled, result.dead, result.retried) == (0, 1, 0, 0)
        assert [f.outcome for f in result.failures] == ["cancelled"] and _status(db, job_id) == 5

        # Given a per-batch queue and five jobs, When drained three per claim
        config = db.config(queue={"batched": {"per_batch": True}})
        batches = []
        batched = notifyq.Producer("batched", config)
        try:
            batched.put_many(list(range(5)))
            done = testing.drain(config, "batched", lambda jobs: batches.append([j.payload for j in jobs]),
                                 batch_size=3)
        finally:
            batched.close()
        # Then the handler got the jobs in claims of up to three
        assert batches == [[0, 1, 2], [3, 4]] and done.done == 5
    finally:
        session.close()
        producer.close()


def test_a_job_whose_handler_saw_its_cancel_and_returned_ends_cancelled_sync_async_and_per_batch(db):
    """Issue #16: a handler that sees job.cancel_requested() (or notifyq.cancelled()) and returns
    stopped as asked: its job ends cancelled, counted in `cancelled` only, never done. Before,
    each ended done (Drained(done=1, cancelled=0)). A job that never saw its cancel stays done."""
    import asyncio

    from notifyq.ops import admin
    from notifyq.store.db import Session

    session = Session(db.dsn, name="canceller")

    def sync_handler(job):
        assert admin.cancel(session, job.id, by="the test") and job.cancel_requested()

    async def async_handler(job):
        await asyncio.sleep(0)
        assert admin.cancel(session, job.id, by="the test") and job.cancel_requested()

    def batch_handler(jobs):
        assert admin.cancel(session, jobs[0].id, by="the test")
        assert notifyq.cancelled(jobs) == [jobs[0]]  # jobs[1] was not cancelled: it is done

    config = db.config(queue={"batched": {"per_batch": True, "keep_done": True},
                              "one": {"keep_done": True}, "aone": {"keep_done": True}})
    try:
        for queue, handler, payloads in (("one", sync_handler, [1]), ("aone", async_handler, [1]),
                                         ("batched", batch_handler, [1, 2])):
            with notifyq.Producer(queue, config) as producer:
                ids = producer.put_many(payloads)
            # When drained (raise_on_failure left True: a cancel is no failure)
            result = testing.drain(config, queue, handler, batch_size=2)
            # Then the cancelled job counts as cancelled only, and its row says cancelled
            assert (result.cancelled, result.done, result.failed, result.dead) == (1, len(ids) - 1, 0, 0), queue
            assert result.failures == [] and _status(db, ids[0]) == 5, queue
            assert db.scalar("SELECT cancelled_at IS NOT NULL FROM nq_job WHERE id = %s", (ids[0],)) == 1
            assert [_status(db, i) for i in ids[1:]] == [3] * (len(ids) - 1), queue
    finally:
        session.close()
