"""Tasks (issue 28, item 6): `@task` gives `fn.enqueue(...)`, `notifyq consume --tasks MODULE` runs
each job by the task it names and fails a job naming another with a clear error."""

from __future__ import annotations

import json

import MySQLdb
import pytest
from conftest import run_cli

import notifyq
from notifyq import errors


def _rows(db, queue):
    return db.query("SELECT id, payload, priority, max_attempts, status FROM nq_job WHERE queue = %s ORDER BY id",
                    (queue,))


def test_enqueue_puts_a_job_naming_the_task_with_its_arguments_and_options(db):
    # Given a registry of this test's own, and a task on it
    registry = notifyq.TaskRegistry(db.config())

    @registry.task(queue="tasks", max_attempts=3, priority=4)
    def add(a, b, *, c=0):
        return a + b + c

    try:
        # When it is called and enqueued
        assert add(1, 2, c=3) == 6  # a call runs it here
        first = add.enqueue(1, 2, c=3)
        later = add.enqueue(5, 5, delay=60)
        keyed = [add.enqueue(0, 0, dedup_key="k"), add.enqueue(9, 9, dedup_key="k")]
        # Then each job names the task, holds its arguments, and the task's options
        rows = _rows(db, "tasks")
        name = f"{__name__}.test_enqueue_puts_a_job_naming_the_task_with_its_arguments_and_options.<locals>.add"
        assert [r[0] for r in rows] == [first, later, keyed[0]] and keyed[1] == keyed[0]
        assert json.loads(rows[0][1]) == {"task": name, "args": [1, 2], "kwargs": {"c": 3}}
        assert rows[0][2:] == (4, 3, 0)
        assert rows[1][4] == 1  # scheduled: the delay
        assert registry.tasks == {name: add}
        # And the default registry knows nothing of it
        from notifyq.tasks import default_registry
        assert name not in default_registry.tasks
    finally:
        registry.close()


def test_enqueue_with_conn_commits_and_rolls_back_with_the_callers_transaction(db):
    registry = notifyq.TaskRegistry(db.config())
    ping = registry.task(lambda: None, queue="tconn", name="ping")
    conn = MySQLdb.connect(**db.dsn.connect_args())
    try:
        ping.enqueue(conn=conn)
        conn.rollback()
        kept = ping.enqueue(conn=conn)
        conn.commit()
        assert [r[0] for r in _rows(db, "tconn")] == [kept]
    finally:
        conn.close()
        registry.close()


def test_consume_tasks_runs_each_job_by_its_task_and_fails_the_unknown_one_clearly(db, tmp_path):
    out = tmp_path / "out.jsonl"
    env = {**db.env, "NQ_TASKS_OUT": str(out)}
    # Given jobs for two tasks of the module, one for a name it does not define, one not a task's
    payloads = [{"task": "nqtasks.add", "args": [1, 2], "kwargs": {"c": 4}}, {"task": "greet", "args": ["ann"]},
                {"task": "os.system", "args": ["true"]}, {"to": "someone"}]
    assert run_cli(env, "produce", "-q", "tq", *map(json.dumps, payloads)).returncode == 0
    # When a consumer runs the queue with --tasks
    done = run_cli(env, "consume", "-q", "tq", "--tasks", "nqtasks", "--exit-when-empty")
    assert done.returncode == 0, done.stderr
    # Then the known tasks ran with their arguments, and nothing else ran
    assert sorted(out.read_text().splitlines()) == sorted(
        [json.dumps({"task": "add", "sum": 7}), json.dumps({"task": "greet", "who": "ann"})])
    # And the others failed saying why, retried by the queue's policy
    failed = [r[0] for r in db.query("SELECT last_error FROM nq_job WHERE queue = 'tq' ORDER BY id")]
    assert failed == ["UnknownTask: unknown task 'os.system'; this consumer runs: greet, nqtasks.add",
                      "UnknownTask: the job names no task (its payload has no \"task\" key); "
                      "this consumer runs: greet, nqtasks.add"]


@pytest.mark.parametrize("argv, code, line", [
    (("--tasks", "nqtasks", "--handler", "nqtasks:add"), 2,
     "notifyq: error: give --tasks or --handler/--command, not both (see 'notifyq consume --help')"),
    (("--tasks", "no_such_module_here"), 8,
     "notifyq: error: --tasks no_such_module_here: cannot import it: No module named 'no_such_module_here'"),
    (("--tasks", "json"), 8, "notifyq: error: --tasks json: it defines no @notifyq.task function"),
])
def test_bad_tasks_flags_are_one_line_and_an_exit_code(db, argv, code, line):
    done = run_cli(db.env, "consume", "-q", "tq", *argv, "--exit-when-empty")
    assert (done.returncode, done.stderr.strip().splitlines()) == (code, [line])


def test_a_consumer_of_a_queue_none_of_the_tasks_is_on_says_so(db):
    done = run_cli(db.env, "consume", "-q", "nobody", "--tasks", "nqtasks", "--exit-when-empty")
    assert done.returncode == 8
    assert done.stderr.strip() == ("notifyq: error: --tasks: no task of these modules is on queue nobody "
                                   "(theirs: atq, elsewhere, tq)")


def test_a_task_on_a_bad_queue_name_is_refused_at_decoration(db):
    registry = notifyq.TaskRegistry(db.config())
    with pytest.raises(errors.InputError, match="invalid queue name"):
        registry.task(lambda: None, queue="no spaces")


def test_a_queue_of_the_config_runs_its_tasks_under_its_profile(db, tmp_path):
    out = tmp_path / "out.jsonl"
    conf = tmp_path / "notifyq.toml"
    conf.write_text('[queue.tq]\ntasks = "nqtasks"\n')
    env = {**db.env, "NQ_TASKS_OUT": str(out), "NOTIFYQ_CONFIG": str(conf)}
    assert run_cli(env, "produce", "-q", "tq", json.dumps({"task": "greet", "args": ["bo"]})).returncode == 0
    done = run_cli(env, "consume", "--profile", "tq", "--exit-when-empty")
    assert done.returncode == 0, done.stderr
    assert out.read_text().splitlines() == [json.dumps({"task": "greet", "who": "bo"})]


def test_a_queue_with_a_handler_and_tasks_is_a_config_error(db, tmp_path):
    conf = tmp_path / "notifyq.toml"
    conf.write_text('[queue.tq]\ntasks = "nqtasks"\nhandler = "nqtasks:add"\n')
    done = run_cli({**db.env, "NOTIFYQ_CONFIG": str(conf)}, "config")
    assert done.returncode == 3
    assert done.stderr.strip() == f"notifyq: error: queue.tq: set tasks or a handler/command, not both (in {conf})"


def test_the_first_example_of_the_docs_enqueues_what_it_says(db, monkeypatch):
    from pathlib import Path

    from notifyq.tasks import default_registry

    # Given the first Python block of docs/tasks.md, the default registry configured from the
    # environment as it says, and `my_connection` a connection of the caller's
    text = (Path(__file__).resolve().parents[2] / "docs" / "tasks.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    for key in ("NOTIFYQ_DSN", "NOTIFYQ_PASSWORD", "NOTIFYQ_CONFIG"):
        monkeypatch.setenv(key, db.env[key])
    conn = MySQLdb.connect(**db.dsn.connect_args())
    ns = {"__name__": "myapp.tasks", "my_connection": conn}
    try:
        exec(compile(code, "docs/tasks.md", "exec"), ns)
        conn.commit()
        # Then its four jobs are stored, one delayed, each naming the task with its arguments
        rows = db.query("SELECT payload, priority, max_attempts, status, dedup_key FROM nq_job "
                        "WHERE queue = 'emails' ORDER BY id")
        def job(to, **kwargs):
            return json.dumps({"task": "myapp.tasks.send_email", "args": [to], "kwargs": kwargs},
                              separators=(",", ":"))
        assert rows == [(job("a@example.com", template="reset"), 5, 10, 0, None),
                        (job("b@example.com"), 5, 10, 1, None),
                        (job("c@example.com"), 5, 10, 0, "welcome-c"),
                        (job("d@example.com"), 5, 10, 0, None)]
    finally:
        conn.close()
        default_registry.tasks.pop("myapp.tasks.send_email", None)
        default_registry.configure(None)


def test_an_async_task_is_awaited_also_several_at_once(db, tmp_path):
    out = tmp_path / "out.jsonl"
    env = {**db.env, "NQ_TASKS_OUT": str(out)}
    jobs = [json.dumps({"task": "nqtasks.slow_echo", "args": [n]}) for n in range(6)]
    assert run_cli(env, "produce", "-q", "atq", *jobs).returncode == 0
    done = run_cli(env, "consume", "-q", "atq", "--tasks", "nqtasks", "--concurrency", "3", "--exit-when-empty")
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(line)["n"] for line in out.read_text().splitlines()) == list(range(6))
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = 'atq'") == 0


def _run_tasks(db, registry, queue: str, handler_of=lambda h: h, **queue_defaults):
    """One worker running the queue's tasks in this process until no job is ready."""
    import threading

    from notifyq.consume.stats import Budget
    from notifyq.consume.tasks import TaskHandler
    from notifyq.consume.worker import Worker

    cfg = db.config(defaults=queue_defaults)
    worker = Worker(cfg, queue, handler_of(TaskHandler(registry.tasks, queue)), stop=threading.Event(),
                    budget=Budget(None), batch_size=10, exit_when_empty=True)
    worker.run()
    assert worker.error is None, worker.error
    return worker


def _ended(db, queue):
    return db.query("SELECT JSON_VALUE(payload, '$.task'), status, last_error FROM nq_job WHERE queue = %s "
                    "ORDER BY id", (queue,))


TIMED_OUT = "timeout: the handler ran longer than timeout_s ({} s); its thread was left running"


def test_a_tasks_timeout_overrides_the_queues(db):
    import threading

    # Given a queue whose timeout_s is 0.2 s, and four tasks on it: two that hang until released
    # (one with the queue's timeout, one with its own of 0.4 s), two that take 0.6 s (one
    # allowed 30 s, one with no bound at all)
    registry, release = notifyq.TaskRegistry(db.config(defaults={"max_attempts": 1})), threading.Event()
    registry.task(lambda: release.wait(30), queue="tto", name="inherits")
    registry.task(lambda: release.wait(30), queue="tto", name="own", timeout_s=0.4)
    # The work itself takes 0.6 s: longer than the queue's timeout, shorter than the task's.
    registry.task(lambda: threading.Event().wait(0.6), queue="tto", name="longer", timeout_s=30)
    registry.task(lambda: threading.Event().wait(0.6), queue="tto", name="unbounded", timeout_s=0)
    try:
        for name in ("inherits", "own", "longer", "unbounded"):
            registry.tasks[name].enqueue()
        # When a worker runs them, each job's only attempt
        worker = _run_tasks(db, registry, "tto", timeout_s=0.2)
        # Then each hanging task failed at its own timeout, and the slow ones finished
        assert _ended(db, "tto") == [("inherits", 4, TIMED_OUT.format(0.2)), ("own", 4, TIMED_OUT.format(0.4))]
        assert (worker.stats.succeeded, worker.stats.dead) == (2, 2)
    finally:
        release.set()
        registry.close()


def test_a_queues_timeout_holds_also_with_an_on_failure_hook(db):
    import threading

    from notifyq.consume.reporting import Reporting

    # Given a task that hangs on a queue with a 0.2 s timeout, run by a handler that reports
    # failures (on_failure wraps the handler)
    registry, release, reported = notifyq.TaskRegistry(db.config(defaults={"max_attempts": 1})), threading.Event(), []
    registry.task(lambda: release.wait(30), queue="tto", name="hangs")
    try:
        registry.tasks["hangs"].enqueue()
        # When a worker runs it
        _run_tasks(db, registry, "tto", lambda h: Reporting(h, lambda job, exc: reported.append(str(exc))),
                   timeout_s=0.2)
        # Then it timed out, and the hook heard of it
        assert _ended(db, "tto") == [("hangs", 4, TIMED_OUT.format(0.2))]
        assert reported == [TIMED_OUT.format(0.2)]
    finally:
        release.set()
        registry.close()


def test_a_job_naming_a_task_with_malformed_arguments_fails_with_one_clear_error(db):
    # Given a task, and a job of its queue that names it with arguments of the wrong shape
    registry = notifyq.TaskRegistry(db.config())

    @registry.task(queue="badargs", name="add")
    def add(a: int, b: int) -> int:
        return a + b

    try:
        with notifyq.Producer("badargs", db.config()) as producer:
            producer.put({"task": "add", "args": {"a": 1}, "kwargs": {}}, max_attempts=1)
        # When a consumer runs it
        _run_tasks(db, registry, "badargs")
    finally:
        registry.close()
    # Then the job is dead with a line that names the task and says what is wrong
    assert _ended(db, "badargs") == [("add", notifyq.Status.DEAD, "UnknownTask: task add: the job's args must be a list and its kwargs an object")]
