"""A handler's return value is kept with its job's completion when the queue keeps results,
and read by Producer.result(job_id, wait=...) and `notifyq jobs show`."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import run_cli
from test_effects import charges, drain, put  # noqa: F401 - charges is a fixture

from notifyq import errors
from notifyq.consume import handlers, periodic
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer
from notifyq.store import results as results_store


def test_a_kept_result_is_read_by_the_producer_and_shown_by_jobs_show(db):
    # Given a queue that keeps results for an hour (jobs deleted when done), and three jobs
    ids = put(db, 3)

    def handler(job):
        if job.payload["n"] == 1:
            return {"charged": 1250, "currency": "EUR"}
        if job.payload["n"] == 2:
            return object()  # not JSON: not kept, the job is done all the same
        return None

    drain(db, handler, result_ttl_s=3600)
    # When a producer asks for them
    with Producer("q", db.config()) as p:
        # Then the JSON result comes back, and None for the rest
        assert p.result(ids[1]) == {"charged": 1250, "currency": "EUR"}
        assert p.result(ids[0]) is None and p.result(ids[2]) is None
    # And `jobs show` of the (deleted) job says it was done, with its result
    shown = run_cli(db.env, "jobs", "show", str(ids[1]))
    assert shown.returncode == 0 and "it was done at" in shown.stdout and '"charged": 1250' in shown.stdout


def test_a_queue_that_keeps_no_results_stores_none(db):
    [job_id] = put(db)
    drain(db, lambda job: {"x": 1})
    with Producer("q", db.config()) as p:
        assert p.result(job_id) is None
    assert db.scalar("SELECT COUNT(*) FROM nq_attempt WHERE result IS NOT NULL") == 0


def test_result_waits_for_the_job_and_says_when_it_is_not_done_or_dead(db):
    # Given a job not run yet, one that ends dead, and a kept-done queue
    [waiting] = put(db)
    with Producer("q", db.config()) as p:
        # Then asking at once says it is pending
        with pytest.raises(errors.ResultPending):
            p.result(waiting, wait=0.05)
        # When a worker runs it while the producer waits
        cfg = db.config(defaults={"keep_done": True, "max_attempts": 1})
        worker = Worker(cfg, "q", handlers.PythonHandler(lambda job: job.payload["n"] + 41, False),
                        stop=threading.Event(), budget=Budget(None), batch_size=10, exit_when_empty=True)
        t = threading.Thread(target=worker.run)
        t.start()
        try:
            assert p.result(waiting, wait=30) == 41
        finally:
            t.join(30)
        # And a dead job's result raises with its error; an unknown id says it never existed
        [dead] = put(db, max_attempts=1)
        drain(db, lambda job: 1 / 0)
        with pytest.raises(errors.JobFailed, match="ZeroDivisionError"):
            p.result(dead)
        with pytest.raises(errors.InputError, match="never existed"):
            p.result(dead + 1000)


def test_a_result_given_to_the_transaction_is_kept_with_the_completion(db, charges):  # noqa: F811
    [job_id] = put(db)

    def handler(job):
        with job.transaction(result={"receipt": "r-1"}) as cur:
            cur.execute("INSERT INTO charge (job_id, attempt) VALUES (%s, %s)", (job.id, job.attempts))

    drain(db, handler, keep_done=True)
    with Producer("q", db.config()) as p:
        assert p.result(job_id) == {"receipt": "r-1"}


def test_a_result_over_the_size_bound_is_not_kept(db, monkeypatch):
    monkeypatch.setattr(results_store, "RESULT_MAX_BYTES", 100)
    [job_id] = put(db)
    drain(db, lambda job: "x" * 200, keep_done=True)
    with Producer("q", db.config()) as p:
        assert p.result(job_id) is None


def test_a_per_batch_handler_gives_each_job_its_result_by_a_dict(db):
    # Given four jobs run by one per-batch call that fails the one marked 3, gives the one
    # marked 2 nothing, and the others a result keyed by the job or by its id
    ids = put(db, 4, max_attempts=1)
    batches = []

    def handler(jobs):
        batches.append(len(jobs))
        jobs[3].fail("no card", retry=False)
        return {jobs[0]: {"receipt": "r-0"}, jobs[1].id: "r-1", jobs[3].id: "not kept: it failed"}

    drain(db, handler, per_batch=True, keep_done=True)
    # When a producer asks for their results
    with Producer("q", db.config()) as p:
        # Then each done job has its own, the one given none has None, the failed one is dead
        assert batches == [4]
        assert [p.result(i) for i in ids[:3]] == [{"receipt": "r-0"}, "r-1", None]
        with pytest.raises(errors.JobFailed, match="no card"):
            p.result(ids[3])


def test_a_per_batch_handler_returning_other_than_a_dict_keeps_no_result_and_says_so(db, caplog):
    ids = put(db, 2)
    drain(db, lambda jobs: ["r-0", "r-1"], per_batch=True, keep_done=True)
    with Producer("q", db.config()) as p:
        assert [p.result(i) for i in ids] == [None, None]
    said = [r.getMessage() for r in caplog.records if "per-batch handler's return value" in r.getMessage()]
    assert said == ["a per-batch handler's return value: only a dict {job or job.id: result} for the jobs "
                    "of its batch is kept; not kept: list"]


def test_a_result_outlives_its_jobs_purge_within_its_ttl(db):
    # Given a kept-done queue whose done jobs are purged after 2 s but whose results live an
    # hour, and a job done with a result
    [job_id] = put(db)
    drain(db, lambda job: {"receipt": "r-7"}, keep_done=True, retention_s=2, result_ttl_s=3600)
    cfg = db.config(defaults={"keep_done": True, "retention_s": 2, "result_ttl_s": 3600})
    # When a retention pass purges the job (its finished_at moved back past the 2 s)
    db.query("UPDATE nq_job SET finished_at = finished_at - INTERVAL 1 MINUTE WHERE id = %s", (job_id,))
    scheduler = periodic.Scheduler(cfg, ("q",), retention_first_s=0)
    try:
        scheduler.tick()
    finally:
        scheduler.close()
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    # Then its result is still read, as the ttl promises
    with Producer("q", cfg) as p:
        assert p.result(job_id) == {"receipt": "r-7"}


def run_batch_of(db, n: int, handler, **defaults) -> Worker:
    """One worker, batches of `n`, until the queue is empty."""
    worker = Worker(db.config(defaults=defaults), "q", handlers.PythonHandler(handler, False),
                    stop=threading.Event(), budget=Budget(None), batch_size=n, exit_when_empty=True)
    worker.run()
    return worker


def test_a_batchs_results_bigger_than_the_servers_packet_are_all_kept_and_nothing_runs_twice(db, small_packet):
    # Given 40 jobs whose 60 KB results make a batch of 20's ack 1.2 MB, over the server's
    # max_allowed_packet of 1 MB
    ids = put(db, 40)
    runs = []

    def handler(job):
        runs.append(job.id)
        return f"{job.id:06d}" + "r" * 60_000

    # When a worker runs them, in batches of 20
    worker = run_batch_of(db, 20, handler, keep_done=True)
    # Then the worker ends well, each job ran once and is done with its result
    assert worker.error is None, worker.error
    assert sorted(runs) == ids
    assert worker.stats.succeeded == 40 and worker.stats.lost_acks == 0
    with Producer("q", db.config()) as p:
        assert all(p.result(i) == f"{i:06d}" + "r" * 60_000 for i in ids)


def test_a_result_that_can_never_fit_the_servers_packet_is_not_kept_for_that_job_alone(db, small_packet, monkeypatch,
                                                                                       caplog):
    # Given a result bound above the server's max_allowed_packet of 1 MB, and three jobs
    # of which the second returns 1.5 MB
    monkeypatch.setattr(results_store, "RESULT_MAX_BYTES", 4 * small_packet)
    ids = put(db, 3)
    runs = []

    def handler(job):
        runs.append(job.id)
        return "x" * 1_500_000 if job.id == ids[1] else {"ok": job.id}

    # When a worker runs them in one batch
    worker = run_batch_of(db, 3, handler, keep_done=True)
    # Then every job is done once; the big result alone is not kept, and the log says which
    assert worker.error is None, worker.error
    assert sorted(runs) == ids and worker.stats.succeeded == 3
    with Producer("q", db.config()) as p:
        assert [p.result(i) for i in ids] == [{"ok": ids[0]}, None, {"ok": ids[2]}]
    said = [r.getMessage() for r in caplog.records if "max_allowed_packet" in r.getMessage()]
    assert len(said) == 1 and f"job={ids[1]}" in said[0], said


def test_thirty_threads_waiting_for_results_share_one_session(db):
    # Given a kept-done queue with 30 jobs no consumer runs yet, and one producer
    ids = put(db, 30)
    got: dict[int, object] = {}
    with Producer("q", db.config()) as p:
        def sessions() -> int:
            return db.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = %s AND DB = %s",
                             (db.dsn.user, db.admin.database))

        # When 30 threads wait for their results at once
        threads = [threading.Thread(target=lambda i=i: got.update({i: p.result(i, wait=60)})) for i in ids]
        for t in threads:
            t.start()
        # Then, while they wait (their first looks take milliseconds), one session looks for
        # all of them, not one each
        most, deadline = 0, time.monotonic() + 1.5
        while time.monotonic() < deadline and most <= 1:
            most = max(most, sessions())
        # And once a consumer runs the jobs, each thread gets its own job's result
        drain(db, lambda job: {"n": job.payload["n"]}, keep_done=True)
        for t in threads:
            t.join(30)
    assert most <= 1, f"{most} sessions for 30 waits"
    assert got == {i: {"n": n} for n, i in enumerate(ids)}


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


class _ItemsRaise(dict):
    def items(self):
        raise RuntimeError("items boom")


def test_a_result_whose_encoding_raises_anything_is_not_kept_and_its_job_is_done_once(db, charges, caplog):  # noqa: F811
    # Given four jobs in one batch of a queue that keeps results: one returns a list nested
    # deeper than the JSON encoder's recursion, one a dict whose items() raises, one passes the
    # deep list to its job.transaction(), one returns a plain value
    ids = put(db, 4)
    runs = []

    def handler(job):
        runs.append(job.id)
        n = job.payload["n"]
        if n == 0:
            return _nested(100_000)
        if n == 1:
            return _ItemsRaise(a=1)
        if n == 2:
            with job.transaction(result=_nested(100_000)) as cur:
                cur.execute("INSERT INTO charge (job_id, attempt) VALUES (%s, %s)", (job.id, job.attempts))
            return None
        return {"ok": job.id}

    # When one worker runs them
    worker = run_batch_of(db, 4, handler, keep_done=True, max_attempts=1)
    # Then the worker ends well, each job ran once and is done, its effect stored once
    assert worker.error is None, worker.error
    assert sorted(runs) == ids and worker.stats.succeeded == 4 and worker.stats.failed == 0
    assert db.query("SELECT id, status FROM nq_job ORDER BY id") == [(i, 3) for i in ids]
    assert charges() == [(ids[2], 1)]
    # And only the plain value is kept; a warning names each job whose value was not
    with Producer("q", db.config()) as p:
        assert [p.result(i) for i in ids] == [None, None, None, {"ok": ids[3]}]
    said = [r.getMessage() for r in caplog.records if "cannot be encoded as JSON" in r.getMessage()]
    assert sorted(m.split("job=")[1].split()[0] for m in said) == sorted(str(i) for i in ids[:3]), said
    assert any("RecursionError" in m for m in said) and any("items boom" in m for m in said), said


def test_a_per_batch_handlers_return_value_that_raises_when_read_keeps_no_result_and_fails_nothing(db, caplog):
    # Given two jobs of a per-batch handler that returns a dict whose items() raises
    ids = put(db, 2)
    worker = Worker(db.config(defaults={"keep_done": True, "max_attempts": 1}), "q",
                    handlers.PythonHandler(lambda jobs: _ItemsRaise({jobs[0].id: 1}), True),
                    stop=threading.Event(), budget=Budget(None), batch_size=10, exit_when_empty=True)
    # When a worker runs them
    worker.run()
    # Then the worker ends well, both jobs are done without a result, and the log says why
    assert worker.error is None, worker.error
    assert db.query("SELECT id, status FROM nq_job ORDER BY id") == [(i, 3) for i in ids]
    with Producer("q", db.config()) as p:
        assert [p.result(i) for i in ids] == [None, None]
    said = [r.getMessage() for r in caplog.records if "could not be read" in r.getMessage()]
    assert len(said) == 1 and f"jobs={ids[0]},{ids[1]}" in said[0] and "items boom" in said[0], said


def _strict_json(text: str):
    """What any JSON parser reads (jq, JSON_VALID): no NaN, no Infinity."""
    import json

    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_a_result_that_is_not_strictly_json_is_not_kept_and_jobs_show_prints_valid_json(db, caplog):
    """Regression: NaN and Infinity were kept as `NaN` (JSON_VALID 0, and `jobs show --json`
    printed what no JSON parser reads), and a lone surrogate was kept altered, as "?abc"; no
    warning either way."""
    # Given four jobs of a queue that keeps results: three return what is not JSON (NaN,
    # Infinity, a lone surrogate), one a plain value
    ids = put(db, 4)
    values = [{"x": float("nan")}, [float("inf")], "\ud800abc", {"ok": True}]
    drain(db, lambda job: values[job.payload["n"]], keep_done=True)
    # Then only the plain value is kept, a warning names each of the others' jobs
    with Producer("q", db.config()) as p:
        assert [p.result(i) for i in ids] == [None, None, None, {"ok": True}]
    assert db.scalar("SELECT COUNT(*) FROM nq_attempt WHERE result IS NOT NULL AND NOT JSON_VALID(result)") == 0
    said = [r.getMessage() for r in caplog.records if "cannot be encoded as JSON" in r.getMessage()]
    assert sorted(m.split("job=")[1].split()[0] for m in said) == sorted(str(i) for i in ids[:3]), said
    # And `jobs show --json` of each prints valid JSON, also of a result kept before NaN was
    # refused (shown as the text stored)
    db.query("UPDATE nq_attempt SET result = '{\"x\":NaN}' WHERE job_id = %s", (ids[3],))
    for job_id in ids:
        shown = run_cli(db.env, "jobs", "show", str(job_id), "--json")
        assert shown.returncode == 0, shown.stderr
        _strict_json(shown.stdout)
