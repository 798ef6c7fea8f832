"""notifyq.AsyncProducer (issue 28, item 2): awaited puts that store what they return, and an
event loop that keeps turning while a hundred coroutines put."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

import notifyq
from notifyq import errors

from conftest import admin_connect

COROUTINES = 100
PUTS = 5


def test_every_id_an_awaited_put_returns_is_stored_with_its_payload(db):
    # Given an AsyncProducer with two sessions
    async def main() -> dict[int, str]:
        async with notifyq.AsyncProducer("aq", db.config(), sessions=2) as producer:
            # When 100 coroutines put 5 jobs each, and one put_many of three
            async def worker(c: int) -> list[tuple[int, str]]:
                out = []
                for i in range(PUTS):
                    out.append((await producer.put({"p": f"{c}-{i}"}), f"{c}-{i}"))
                return out
            results = await asyncio.gather(*(worker(c) for c in range(COROUTINES)))
            many = await producer.put_many(({"p": f"m-{i}"} for i in range(3)))
        return {**{i: p for r in results for i, p in r}, **{i: f"m-{n}" for n, i in enumerate(many)}}

    returned = asyncio.run(main())
    # Then every returned id is stored, with the payload of the put that returned it
    stored = {i: json.loads(p)["p"] for i, p in db.query("SELECT id, payload FROM nq_job WHERE queue = 'aq'")}
    assert len(returned) == COROUTINES * PUTS + 3
    assert stored == returned


def test_the_event_loop_keeps_turning_while_coroutines_put(db):
    # A put that ran on the loop's thread would hold the loop for as long as the database took.
    # So the puts are made to wait on a locked table, and the loop must go on meanwhile: a
    # condition to wait for, not a lag to time (a noisy machine stalls any loop for a while).
    lock = admin_connect(db.admin, db.admin.database)

    def waiting_puts() -> int:
        return db.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                         " WHERE STATE LIKE 'Waiting for table%lock' AND INFO LIKE 'INSERT%'")

    async def main() -> tuple[int, bool, int]:
        async with notifyq.AsyncProducer("lag", db.config()) as producer:
            await producer.put({"warm": 1})  # connects: not what is measured
            # Given the jobs table locked by another session
            lock.cursor().execute("LOCK TABLES nq_job WRITE")
            # A safety net: if the loop were held, only this thread could free the puts
            unlock = threading.Timer(60, lambda: admin_connect(db.admin).cursor().execute(
                f"KILL {lock.thread_id()}"))
            unlock.start()
            try:
                # When 100 coroutines put 5 jobs each
                puts = asyncio.gather(*(producer.put({"c": c, "i": i})
                                        for c in range(COROUTINES) for i in range(PUTS)))
                # Then the loop turns while the puts wait: it sees a put waiting on the lock
                # and ticks a hundred times, with every put still pending
                deadline = time.monotonic() + 30
                while not (seen := waiting_puts()) and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert seen, "no put came to wait on the locked table"
                ticks = 0
                for _ in range(100):
                    await asyncio.sleep(0)
                    ticks += 1
                pending = not puts.done()
            finally:
                lock.cursor().execute("UNLOCK TABLES")
                unlock.cancel()
            await puts
        return ticks, pending, db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = 'lag'")

    try:
        ticks, pending, count = asyncio.run(main())
    finally:
        lock.close()
    assert ticks == 100 and pending, "the loop did not turn while the puts waited"
    # And once the table is free, every job is stored
    assert count == COROUTINES * PUTS + 1


def test_bad_arguments_raise_input_errors_and_a_closed_producer_refuses(db):
    async def main() -> None:
        producer = notifyq.AsyncProducer("bad", db.config())
        with pytest.raises(errors.InputError, match="payload is not JSON"):
            await producer.put({"x": object()})
        with pytest.raises(errors.InputError, match="expected a list"):
            await producer.put_many("abc")
        await producer.close()
        with pytest.raises(errors.InputError, match="closed"):
            await producer.put({"x": 1})

    asyncio.run(main())
    with pytest.raises(errors.InputError, match="invalid queue name"):
        notifyq.AsyncProducer("no spaces", db.config())


def test_an_async_handler_runs_up_to_concurrency_jobs_at_once_each_with_its_own_outcome(db):
    # Given 10 jobs, one of which fails, and one worker running an async def handler with
    # concurrency 5 (claims of 10: the first job alone, while the claim's COMMIT may be on the
    # wire, then groups of 5 and 4)
    with notifyq.Producer("conc", db.config()) as producer:
        ids = producer.put_many([{"n": i} for i in range(10)])
    running, most, loops = 0, 0, set()

    async def handler(job):
        nonlocal running, most
        loops.add(id(asyncio.get_running_loop()))
        running += 1
        most = max(most, running)
        try:
            await asyncio.sleep(0.05)
            if job.payload["n"] == 7:
                raise ValueError("seven")
        finally:
            running -= 1

    import threading
    options = notifyq.ConsumeOptions(queues=("conc",), function=handler, exit_when_empty=True, concurrency=5,
                                     batch_size=10)
    service = notifyq.ConsumerService(db.config(defaults={"retry_base_s": 60.0}), options)
    assert service.run(threading.Event()) == 0
    # Then five ran at once on one loop, the worker's, and only the failing job is left, failed
    assert most == 5 and len(loops) == 1
    assert db.query("SELECT id, last_error FROM nq_job WHERE queue = 'conc'") == [(ids[7], "ValueError: seven")]


def test_concurrency_is_refused_out_of_range_in_one_line(db):
    from conftest import run_cli

    done = run_cli(db.env, "consume", "-q", "conc", "--handler", "nqtasks:add", "--concurrency", "0")
    assert done.returncode == 2
    assert done.stderr.strip() == ("notifyq: error: argument --concurrency: 0 is not in the range 1<=x<=10000 "
                                   "(see 'notifyq consume --help')")


def test_the_one_server_async_producer_refuses_a_config_with_shards_in_one_line():
    """notifyq.AsyncProducer places jobs over [shards] (tests/integration/test_shards.py); the
    one-server class below the sharding layer says in one line that it does not."""
    from notifyq import config as config_mod
    from notifyq.produce import aio

    cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"},
                          overrides={"shards": {"a": "mysql://u@h1/db", "b": "mysql://u@h2/db"}})
    with pytest.raises(errors.ConfigError) as e:
        aio.AsyncProducer("q", cfg)
    assert "[shards]" in str(e.value) and "notifyq.Producer" in str(e.value) and "\n" not in str(e.value)


def test_the_fastapi_example_of_the_docs_enqueues_from_its_endpoint(db, monkeypatch):
    pytest.importorskip("fastapi", reason="FastAPI not installed: the docs example is not run")
    pytest.importorskip("httpx", reason="httpx not installed (FastAPI's TestClient): the docs example is not run")
    from pathlib import Path

    from fastapi.testclient import TestClient

    # Given the first Python block of docs/asyncio.md, configured from the environment as it says
    text = (Path(__file__).resolve().parents[2] / "docs" / "asyncio.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    for key in ("NOTIFYQ_DSN", "NOTIFYQ_PASSWORD", "NOTIFYQ_CONFIG"):
        monkeypatch.setenv(key, db.env[key])
    namespace: dict = {"__name__": "docs_asyncio"}
    exec(compile(code, "docs/asyncio.md", "exec"), namespace)
    # When a client signs up through the app (its lifespan closes the producer at the end)
    with TestClient(namespace["app"]) as client:
        answer = client.post("/signup", params={"address": "a@example.com"})
    # Then the job it answered with is stored, with its payload and priority
    assert answer.status_code == 200, answer.text
    job_id = answer.json()["job"]
    assert db.query("SELECT id, payload, priority FROM nq_job WHERE queue = 'emails'") == [
        (job_id, '{"to":"a@example.com"}', 5)]
    assert namespace["emails"]._closed


def _worker(db, queue: str, handler, **queue_defaults):
    """A worker thread running `queue`'s jobs until it is stopped."""
    import threading

    from notifyq.consume import handlers
    from notifyq.consume.stats import Budget
    from notifyq.consume.worker import Worker

    stop = threading.Event()
    worker = Worker(db.config(defaults=queue_defaults), queue, handlers.PythonHandler(handler, False), stop=stop,
                    budget=Budget(None), batch_size=10)
    thread = threading.Thread(target=worker.run, name="result-worker")
    return worker, thread, stop


def test_an_awaited_result_waits_for_the_job_while_the_loop_turns(db):
    import threading

    # Given a queue that keeps results, and a job whose handler returns once released
    started, release = threading.Event(), threading.Event()

    def handler(job):
        started.set()
        release.wait(30)
        return {"sum": job.payload["a"] + job.payload["b"]}

    worker, thread, stop = _worker(db, "ares", handler, keep_done=True)

    async def main():
        async with notifyq.AsyncProducer("ares", db.config()) as producer:
            job_id = await producer.put({"a": 2, "b": 3})
            # When the result is asked for before the job finished, without a wait
            with pytest.raises(errors.ResultPending, match=f"job {job_id} has not finished"):
                await producer.result(job_id)
            # And awaited with a wait while the job runs, beside a coroutine that lets the job
            # finish only once it turned ten times during the wait
            ticks = 0

            async def ticker():
                nonlocal ticks
                while not release.is_set():
                    await asyncio.sleep(0.01)
                    ticks += started.is_set()
                    if ticks >= 10:
                        release.set()

            tick = asyncio.ensure_future(ticker())
            got = await producer.result(job_id, wait=30)
            await tick
            # And a dead job's result raises with its error
            dead = await producer.put({"a": "x", "b": 1}, max_attempts=1)
            with pytest.raises(errors.JobFailed, match="TypeError"):
                await producer.result(dead, wait=30)
            return got, ticks

    thread.start()
    try:
        got, ticks = asyncio.run(main())
    finally:
        release.set()
        stop.set()
        thread.join(30)
    # Then the result came back once the job was done, and the loop turned meanwhile
    assert got == {"sum": 5}
    assert ticks >= 10
    assert worker.error is None, worker.error


def test_a_cancelled_result_wait_holds_no_thread(db):
    from concurrent.futures import ThreadPoolExecutor

    # Given a job no consumer runs, and a loop whose default executor has one thread
    async def main():
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        async with notifyq.AsyncProducer("acancel", db.config()) as producer:
            job_id = await producer.put({})
            # When a long wait for its result is cancelled
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(producer.result(job_id, wait=60), 0.3)
            # Then the executor's thread is free at once for other work
            return await asyncio.wait_for(loop.run_in_executor(None, lambda: "free"), 10)

    assert asyncio.run(main()) == "free"


def _sessions(db) -> int:
    """The runtime user's sessions in the test's database, now."""
    return db.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = %s AND DB = %s",
                     (db.dsn.user, db.admin.database))


def test_a_hundred_awaited_result_waits_share_one_session(db):
    import threading

    # Given a queue that keeps results, and 100 jobs no consumer runs yet
    worker, thread, stop = _worker(db, "amany", lambda job: {"n": job.payload["n"]}, keep_done=True)

    async def main():
        loop = asyncio.get_running_loop()
        async with notifyq.AsyncProducer("amany", db.config()) as producer:
            ids = await producer.put_many([{"n": n} for n in range(100)])
            puts = await loop.run_in_executor(None, _sessions, db)  # the put's, and its bell's
            # When 100 coroutines wait for their results at once
            waits = [asyncio.ensure_future(producer.result(i, wait=60)) for i in ids]
            # Then, while they wait (their first looks take milliseconds), the producer holds
            # one more session, its waits', not one per wait
            most, deadline = 0, loop.time() + 1.5
            while loop.time() < deadline and most <= 1:
                most = max(most, await loop.run_in_executor(None, _sessions, db) - puts)
            # And once a consumer runs the jobs, every wait gets its own job's result
            thread.start()
            got = await asyncio.gather(*waits)
            return ids, got, most

    try:
        ids, got, most = asyncio.run(main())
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(30)
    assert most <= 1, f"{most} sessions for 100 waits"
    assert got == [{"n": n} for n in range(100)]
    assert worker.error is None, worker.error
    assert threading.active_count() < 20  # and no thread per wait either
