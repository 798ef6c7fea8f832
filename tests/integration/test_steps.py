"""Durable steps (job.step): a step's result is kept once it committed, and a later run of the
job skips the steps that finished; fenced by the claim; against a real server."""

from __future__ import annotations

import math
import threading
import time

import pytest
from conftest import RUNTIME_USER, admin_connect, wait_until

import notifyq
from notifyq import errors
from notifyq.consume import handlers
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer
from notifyq.store import admin_queries
from notifyq.store.db import Session


@pytest.fixture
def charges(db):
    """The application's own table, next to notifyq's, writable by the runtime user."""
    db.query("CREATE TABLE charge (id INT AUTO_INCREMENT PRIMARY KEY, job_id BIGINT NOT NULL, "
             "step VARCHAR(32) NOT NULL, attempt INT NOT NULL)")
    conn = admin_connect(db.admin)
    for host in ("%", "localhost"):
        conn.cursor().execute(f"GRANT SELECT, INSERT ON `{db.admin.database}`.`charge` "
                              f"TO '{RUNTIME_USER}'@'{host}'")
    conn.close()
    return lambda: [tuple(r) for r in db.query("SELECT job_id, step, attempt FROM charge ORDER BY id")]


def put(db, n: int = 1) -> list[int]:
    with Producer("q", db.config()) as p:
        return p.put_many([{"n": i} for i in range(n)])


def drain(db, handler, **config) -> None:
    """Workers (one after another, --exit-when-empty) until no job is pending; retries 10 ms apart."""
    cfg = db.config(defaults={"retry_base_s": 0.01, "retry_max_s": 0.01, **config})
    deadline = time.monotonic() + 60
    while True:
        worker = Worker(cfg, "q", handlers.PythonHandler(handler, False), stop=threading.Event(),
                        budget=Budget(None), batch_size=10, exit_when_empty=True)
        worker.run()
        assert worker.error is None, worker.error
        if not db.scalar("SELECT COUNT(*) FROM nq_job WHERE status IN (0, 1, 2)"):
            return
        assert time.monotonic() < deadline, "jobs still pending after 60 s"
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 0 OR (status = 1 "
                                     "AND run_at <= NOW(6))"), 10, message="a retry due")


def stored_steps(db, job_id: int) -> dict[str, str]:
    return dict(db.query("SELECT name, result FROM nq_step WHERE job_id = %s", (job_id,)))


def test_a_retry_skips_the_steps_that_finished_and_gets_their_results(db):
    # Given a job whose first step succeeds and whose second fails on the first attempt
    [job_id] = put(db)
    ran: list[tuple[str, int]] = []
    seen: dict[str, object] = {}

    def handler(job):
        with job.step("fetch") as step:
            if not step.done:
                ran.append(("fetch", job.attempts))
                step.result = {"page": [1, 2], "attempt": job.attempts}
        fetched = step.result

        @job.step("parse")
        def parse():
            ran.append(("parse", job.attempts))
            if job.attempts == 1:
                raise RuntimeError("parse failed")
            return len(fetched["page"])

        seen["parsed"], seen["fetched"] = parse(), fetched
        seen["steps"] = job.steps

    # When workers run it until it is done
    drain(db, handler)

    # Then the finished step ran once, its result came back from the store, the failed one ran again
    assert ran == [("fetch", 1), ("parse", 1), ("parse", 2)]
    assert seen["fetched"] == {"page": [1, 2], "attempt": 1}
    assert seen["parsed"] == 2
    assert seen["steps"] == {"fetch": {"page": [1, 2], "attempt": 1}, "parse": 2}
    assert stored_steps(db, job_id) == {"fetch": '{"page":[1,2],"attempt":1}', "parse": "2"}
    assert db.query("SELECT name, attempt FROM nq_step WHERE job_id = %s ORDER BY name", (job_id,)) == [
        ("fetch", 1), ("parse", 2)]


def test_a_step_inside_job_transaction_commits_with_the_block_or_not_at_all(db, charges):
    # Given a job whose step writes inside job.transaction(), and whose block fails once after it
    [job_id] = put(db)

    def handler(job):
        with job.transaction() as cur:
            with job.step("pay") as step:
                if not step.done:
                    cur.execute("INSERT INTO charge (job_id, step, attempt) VALUES (%s, 'pay', %s)",
                                (job.id, job.attempts))
                    step.result = job.attempts
            assert job.steps == {"pay": job.attempts}  # seen while its block is open
            if job.attempts == 1:
                raise RuntimeError("the block fails after the step")

    # When workers run it until it is done
    drain(db, handler)

    # Then the first block's step went with its rollback: one charge, by the second attempt, and
    # its record with it
    assert charges() == [(job_id, "pay", 2)]
    assert stored_steps(db, job_id) == {"pay": "2"}


def test_a_step_transaction_commits_its_writes_with_its_record_and_a_retry_skips_it(db, charges):
    # Given a job with two step transactions, the second failing on the first attempt (after writing)
    [job_id] = put(db)

    def handler(job):
        for name in ("debit", "credit"):
            with job.step(name, transaction=True) as step:
                if not step.done:
                    step.cursor.execute("INSERT INTO charge (job_id, step, attempt) VALUES (%s, %s, %s)",
                                        (job.id, name, job.attempts))
                    if name == "credit" and job.attempts == 1:
                        raise RuntimeError("credit fails after its write")
                    step.result = name

        @job.step("audit", transaction=True)
        def audit(cur, what):
            cur.execute("INSERT INTO charge (job_id, step, attempt) VALUES (%s, %s, %s)", (job.id, what, job.attempts))
            return what

        assert audit("audit") == "audit"

    # When workers run it until it is done
    drain(db, handler)

    # Then each step's write landed exactly once: the debit by the first attempt, the failed
    # credit's write rolled back with it and made by the second
    assert charges() == [(job_id, "debit", 1), (job_id, "credit", 2), (job_id, "audit", 2)]
    assert stored_steps(db, job_id) == {"debit": '"debit"', "credit": '"credit"', "audit": '"audit"'}


@pytest.mark.parametrize("transaction", [False, True])
def test_a_stale_run_whose_claim_was_taken_back_stores_no_step_and_learns_it(db, charges, transaction):
    # Given a job whose claim is taken over (its token changed, as a reaper's take-back and a new
    # claim do) while its handler runs
    [job_id] = put(db)
    raised: list[BaseException] = []

    def handler(job):
        db.query("UPDATE nq_job SET claim_token = claim_token + 1 WHERE id = %s", (job.id,))
        try:
            with job.step("pay", transaction=transaction) as step:
                if not step.done:
                    if step.cursor is not None:
                        step.cursor.execute("INSERT INTO charge (job_id, step, attempt) VALUES (%s, 'pay', 1)",
                                            (job.id,))
                    step.result = "paid"
        except notifyq.ClaimLost as e:
            raised.append(e)
            job.fail("claim lost", retry=False)

    # When a worker runs it
    worker = Worker(db.config(), "q", handlers.PythonHandler(handler, False), stop=threading.Event(),
                    budget=Budget(None), batch_size=1, exit_when_empty=True)
    worker.run()

    # Then the step raised ClaimLost and nothing of it is stored
    assert len(raised) == 1 and "step 'pay'" in str(raised[0]), raised
    assert stored_steps(db, job_id) == {}
    assert charges() == []


@pytest.mark.parametrize("name, value, message", [
    ("", 1, "a name is a string of 1 to 191 characters"),
    ("x" * 192, 1, "a name is a string of 1 to 191 characters"),
    (7, 1, "a name is a string of 1 to 191 characters"),
    ("x ", 1, "must not end with a space"),  # one row with "x" to the server
    ("s\ud800", 1, "no lone surrogate"),  # no UTF-8 for it: a UnicodeEncodeError before
    ("a\x00b", 1, "must not contain NUL"),  # stored before
    ("nan", math.nan, "its result is not JSON"),
    ("object", object(), "its result is not JSON"),
    ("surrogate", "\ud800", "its result is not JSON"),
    ("big", "x" * 70_000, "over 65536"),
])
def test_a_bad_name_or_a_result_that_is_not_json_is_refused_with_nothing_stored(db, name, value, message):
    [job_id] = put(db)
    raised: list[BaseException] = []

    def handler(job):
        try:
            with job.step(name) as step:
                step.result = value
        except errors.InputError as e:
            raised.append(e)

    Worker(db.config(), "q", handlers.PythonHandler(handler, False), stop=threading.Event(),
           budget=Budget(None), batch_size=1, exit_when_empty=True).run()

    assert len(raised) == 1 and message in str(raised[0]), raised
    assert "\n" not in str(raised[0])
    assert stored_steps(db, job_id) == {}


def test_a_jobs_steps_go_with_its_attempt_records(db):
    # Given two done jobs with a step each, and a job waiting for its retry with a step
    done = put(db, 2)

    def handler(job):
        with job.step("s") as step:
            step.result = job.id

    drain(db, handler)
    assert db.scalar("SELECT COUNT(*) FROM nq_step") == 2
    [waiting] = put(db)

    def fails_after_its_step(job):
        with job.step("s") as step:
            step.result = job.id
        raise RuntimeError("retried in an hour")

    Worker(db.config(defaults={"retry_base_s": 3600, "retry_max_s": 3600}), "q",
           handlers.PythonHandler(fails_after_its_step, False), stop=threading.Event(), budget=Budget(None),
           batch_size=1, exit_when_empty=True).run()
    assert db.scalar("SELECT status FROM nq_job WHERE id = %s", (waiting,)) == 1

    # When retention purges the done jobs' attempt records
    session = Session(db.config().dsn)
    try:
        assert admin_queries.purge_old_attempts(session, "q", 0.0, 100) == 3
    finally:
        session.close()

    # Then their steps went too; the job still there (waiting for its retry) keeps its step
    assert db.scalar("SELECT COUNT(*) FROM nq_step WHERE job_id IN %s", (tuple(done),)) == 0
    assert stored_steps(db, waiting) == {"s": str(waiting)}


def test_an_async_handler_takes_steps_as_a_plain_one_does(db):
    # Given an async handler (docs/asyncio.md: the same Job) whose second step fails once
    [job_id] = put(db)
    ran: list[tuple[str, int]] = []

    async def handler(job):
        for name in ("a", "b"):
            with job.step(name) as step:
                if not step.done:
                    ran.append((name, job.attempts))
                    if name == "b" and job.attempts == 1:
                        raise RuntimeError("b fails once")
                    step.result = name

    # When workers run it until it is done
    drain(db, handler)

    # Then the retry skipped the step that had finished
    assert ran == [("a", 1), ("b", 1), ("b", 2)]
    assert stored_steps(db, job_id) == {"a": '"a"', "b": '"b"'}


def test_a_step_of_a_block_that_rolled_back_is_not_done_in_the_next_block_of_the_same_run(db, charges):
    # Given a handler whose first block takes a step and then fails, caught, and a second block
    # in the same run (on the same connection) that takes the same step
    [job_id] = put(db)
    done_in_second: list[bool] = []

    def handler(job):
        try:
            with job.transaction() as cur:
                with job.step("pay") as step:
                    cur.execute("INSERT INTO charge (job_id, step, attempt) VALUES (%s, 'pay', 1)", (job.id,))
                    step.result = 1
                raise RuntimeError("the first block fails after its step")
        except RuntimeError:
            pass
        with job.transaction() as cur:
            with job.step("pay") as step:
                done_in_second.append(step.done)
                if not step.done:
                    cur.execute("INSERT INTO charge (job_id, step, attempt) VALUES (%s, 'pay', 2)", (job.id,))
                    step.result = 2

    # When a worker runs it
    drain(db, handler)

    # Then the second block ran the step again (the first one's went with its rollback), once
    assert done_in_second == [False]
    assert charges() == [(job_id, "pay", 2)]
    assert stored_steps(db, job_id) == {"pay": "2"}


def test_steps_taken_inside_a_step_transaction_are_done_once_it_committed(db, charges):
    # Given a step transaction holding a plain step, then a failure that retries the job
    [job_id] = put(db)
    ran: list[tuple[str, int]] = []

    def handler(job):
        with job.step("outer", transaction=True) as outer:
            if not outer.done:
                with job.step("inner") as inner:
                    ran.append(("inner", job.attempts))
                    inner.result = "in"
                outer.result = "out"
        with job.step("inner") as inner:  # done: it committed with its step transaction
            if not inner.done:
                ran.append(("inner again", job.attempts))
                inner.result = "again"
        if job.attempts == 1:
            raise RuntimeError("retry")

    drain(db, handler)

    assert ran == [("inner", 1)]
    assert stored_steps(db, job_id) == {"outer": '"out"', "inner": '"in"'}
