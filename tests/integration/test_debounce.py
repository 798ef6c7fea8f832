"""Debounce, `put(..., dedup_key=K, dedup="replace")`, against a real server: the newest put of a
key replaces its ready or scheduled job (payload, run_at, priority), a claimed one is never
touched, and under many concurrent producers (and a consumer claiming meanwhile) exactly one
unclaimed job of the key remains: the last committed put's."""

from __future__ import annotations

import datetime as dt
import json
import random
import threading

import MySQLdb
import pytest

import notifyq
from notifyq import errors
from notifyq.ops import admin
from notifyq.produce.producer import Producer
from notifyq.store import queries
from notifyq.store.db import Session

OWNER = "o" * 32


def _jobs(db, key: str = "k") -> dict[int, tuple]:
    """The key's job rows: id -> (status, priority, payload, run_at)."""
    rows = db.query("SELECT id, status, priority, payload, run_at FROM nq_job WHERE queue = 'q' AND dedup_key = %s",
                    (key,))
    return {r[0]: (r[1], r[2], json.loads(r[3]), r[4]) for r in rows}


def _holder(db, key: str = "k") -> int:
    return db.scalar("SELECT job_id FROM nq_dedup WHERE queue = 'q' AND dedup_key = %s", (key,))


def _replaced(db) -> set[int]:
    return {r[0] for r in db.query("SELECT job_id FROM nq_attempt WHERE outcome = 'replaced'")}


def test_the_newest_put_replaces_a_scheduled_job_its_payload_priority_and_run_at_moved_forward(db):
    cfg = db.config()
    with Producer("q", cfg) as p:
        first = p.put({"v": 1}, dedup_key="k", dedup="replace", delay=60)
        before = _jobs(db)[first][3]
        second = p.put({"v": 2}, dedup_key="k", dedup="replace", delay=120, priority=5, key="customer-1")
        # The default mode still keeps the pending job (now the newest), whatever it is given
        assert p.put({"v": 3}, dedup_key="k") == second
        assert p.put({"v": 4}, dedup_key="k", dedup="keep") == second
    jobs = _jobs(db)
    assert list(jobs) == [second] and second != first
    status, priority, payload, run_at = jobs[second]
    assert (status, priority, payload) == (1, 5, {"v": 2})
    assert run_at >= before + dt.timedelta(seconds=59)  # the debounce delay moved forward
    assert db.scalar("SELECT job_key FROM nq_job WHERE id = %s", (second,)) == "customer-1"
    assert _holder(db) == second and _replaced(db) == {first}
    # The replaced job's id tells what became of it: `jobs show` and result()
    session = Session(cfg.dsn)
    try:
        shown = admin.show_job(session, first)
    finally:
        session.close()
    assert shown["status"] == "replaced" and f"replaced by job {second}" in shown["note"]
    with Producer("q", cfg) as p, pytest.raises(errors.InputError, match=f"replaced by job {second}"):
        p.result(first)


def test_a_put_with_no_delay_replaces_a_scheduled_job_with_a_ready_one(db):
    with Producer("q", db.config()) as p:
        p.put({"v": 1}, dedup_key="k", dedup="replace", delay=3600)
        now = p.put({"v": 2}, dedup_key="k", dedup="replace")
    assert {i: j[:3] for i, j in _jobs(db).items()} == {now: (0, 0, {"v": 2})}


def test_a_claimed_job_is_never_touched_the_new_one_waits_beside_it(db):
    cfg = db.config()
    session = Session(cfg.dsn)
    try:
        with Producer("q", cfg) as p:
            running = p.put({"v": 1}, dedup_key="k", dedup="replace")
            claim = queries.claim(session, "q", OWNER, 1, 60)
            assert [j.id for j in claim.jobs] == [running]
            waiting = p.put({"v": 2}, dedup_key="k", dedup="replace")
            newest = p.put({"v": 3}, dedup_key="k", dedup="replace")
    finally:
        session.close()
    jobs = _jobs(db)
    assert {i: j[:3] for i, j in jobs.items()} == {running: (2, 0, {"v": 1}), newest: (0, 0, {"v": 3})}
    assert _holder(db) == newest and _replaced(db) == {waiting}


def test_a_replace_in_the_callers_transaction_is_undone_by_its_rollback(db):
    cfg = db.config()
    conn = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
    try:
        with notifyq.Producer("q", cfg) as p:
            kept = p.put({"v": 1}, dedup_key="k", dedup="replace", delay=60)
            p.put({"v": 2}, dedup_key="k", dedup="replace", conn=conn)
            conn.rollback()
            assert list(_jobs(db)) == [kept] and _holder(db) == kept
            newer = p.put({"v": 3}, dedup_key="k", dedup="replace", conn=conn)
            conn.commit()
            conn.autocommit(True)  # outside a transaction: the put runs as one of its own
            newest = p.put({"v": 4}, dedup_key="k", dedup="replace", conn=conn)
    finally:
        conn.close()
    assert {i: j[2] for i, j in _jobs(db).items()} == {newest: {"v": 4}}
    assert _replaced(db) == {kept, newer}


@pytest.mark.parametrize("bad,message", [
    ({"dedup": "newest"}, 'dedup: expected "keep" or "replace", got \'newest\''),
    ({"dedup": None}, 'dedup: expected "keep" or "replace", got None'),
    ({"dedup": "replace"}, 'dedup="replace" replaces the pending job of a dedup key: give dedup_key too'),
])
def test_a_bad_dedup_mode_is_one_input_error_and_nothing_is_written(db, bad, message):
    with notifyq.Producer("q", db.config()) as p:
        with pytest.raises(errors.InputError) as raised:
            p.put({"v": 1}, **bad, **({} if bad["dedup"] == "replace" else {"dedup_key": "k"}))
    assert str(raised.value) == message
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0 and db.scalar("SELECT COUNT(*) FROM nq_dedup") == 0


@pytest.mark.parametrize("claiming", [False, True], ids=["scheduled", "ready-while-a-consumer-claims"])
def test_many_concurrent_producers_leave_exactly_one_unclaimed_job_the_last_committed(db, claiming):
    # Given 8 producers (each its own session; two put on a connection of their own, in its
    # transaction) putting 25 jobs each with one dedup key, at once; and, in one case, a
    # consumer claiming the key's ready jobs all the while
    cfg = db.config()
    producers, puts = 8, 25
    done: list[tuple[int, dict]] = []
    done_lock = threading.Lock()
    failures: list[BaseException] = []
    start = threading.Barrier(producers + claiming)
    stop = threading.Event()
    claimed: list[int] = []

    def produce(t: int) -> None:
        conn = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False) if t < 2 else None
        try:
            with Producer("q", cfg) as p:
                start.wait()
                for i in range(puts):
                    payload = {"t": t, "i": i}
                    delay = 0 if claiming else random.choice((30, 60, 90))
                    job_id = p.put(payload, dedup_key="k", dedup="replace", delay=delay, conn=conn)
                    if conn is not None:
                        conn.commit()
                    with done_lock:
                        done.append((job_id, payload))
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)
        finally:
            if conn is not None:
                conn.close()

    def claim() -> None:
        session = Session(cfg.dsn)
        try:
            start.wait()
            while not stop.is_set():
                claimed.extend(j.id for j in queries.claim(session, "q", OWNER, 1, 600).jobs)
        except BaseException as e:  # noqa: BLE001
            failures.append(e)
        finally:
            session.close()

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(producers)]
    claimer = threading.Thread(target=claim) if claiming else None
    for th in threads + ([claimer] if claimer else []):
        th.start()
    for th in threads:
        th.join(timeout=300)
    stop.set()
    if claimer:
        claimer.join(timeout=60)
    assert not failures, failures
    assert len(done) == producers * puts and len({i for i, _ in done}) == producers * puts
    # Then exactly one unclaimed job of the key is left: the last put's (the puts of a key take
    # turns on its lock, so the last to commit got the highest id), with its payload, unless
    # the consumer claimed that one too
    jobs = _jobs(db)
    unclaimed = {i: j for i, j in jobs.items() if j[0] in (0, 1)}
    last_id, last_payload = max(done)
    assert _holder(db) == last_id
    if last_id in claimed:
        assert unclaimed == {}
    else:
        assert list(unclaimed) == [last_id] and unclaimed[last_id][2] == last_payload
    # and every other put's job was either claimed (and left as it was) or replaced, never both
    others = {i for i, _ in done} - {last_id}
    assert {i for i, j in jobs.items() if j[0] == 2} == set(claimed)
    assert _replaced(db) == others - set(claimed)
    assert (len(claimed) > 0) == claiming


def test_a_task_with_dedup_replace_and_the_cli_debounce(db):
    from conftest import run_cli

    registry = notifyq.TaskRegistry(db.config())

    @registry.task(queue="q", dedup="replace")
    def sync(customer):
        return customer

    try:
        sync.enqueue(1, dedup_key="k", delay=60)
        newest = sync.enqueue(2, dedup_key="k", delay=60)
        plain = sync.enqueue(3)  # no dedup key: a job of its own
    finally:
        registry.close()
    assert {i: j[2]["args"] for i, j in _jobs(db).items()} == {newest: [2]}
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE id = %s", (plain,)) == 1
    with pytest.raises(errors.InputError, match='dedup: expected "keep" or "replace"'):
        registry.task(queue="q", dedup="newest")(lambda: None)
    # The command line: --dedup replace (with --dedup-key only)
    out = run_cli(db.env, "produce", "-q", "q", "--dedup-key", "k", "--dedup", "replace", '{"v": "cli"}')
    assert out.returncode == 0, out.stderr
    assert {i: j[2] for i, j in _jobs(db).items()} == {int(out.stdout): {"v": "cli"}}
    refused = run_cli(db.env, "produce", "-q", "q", "--dedup", "replace", '{"v": 1}')
    assert refused.returncode == 2 and "--dedup replace needs --dedup-key" in refused.stderr


def test_the_asyncio_producer_debounces(db):
    import asyncio

    async def main() -> list[int]:
        async with notifyq.AsyncProducer("q", db.config()) as p:
            return [await p.put({"v": v}, dedup_key="k", dedup="replace", delay=60) for v in range(3)]

    ids = asyncio.run(main())
    assert {i: j[2] for i, j in _jobs(db).items()} == {ids[-1]: {"v": 2}} and _replaced(db) == set(ids[:-1])
