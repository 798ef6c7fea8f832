"""A job's flow-control key (`put(..., key=)`, nq_job.job_key) against a real server: every
enqueue path stores it, a bad one is one InputError with nothing written, and the claim hands
it to the handler as `job.key`."""

from __future__ import annotations

import datetime as dt
import json

import MySQLdb
import pytest

import notifyq
from notifyq import errors
from notifyq.produce.producer import Producer
from notifyq.store import queries
from notifyq.store.db import Session

OWNER = "o" * 32


def _keys(db) -> dict[int, str | None]:
    return {r[0]: r[1] for r in db.query("SELECT id, job_key FROM nq_job WHERE queue = 'q'")}


def _claim_all(cfg) -> list:
    session = Session(cfg.dsn)
    try:
        jobs = []
        while True:
            claim = queries.claim(session, "q", OWNER, 10, 60)
            if not claim.jobs:
                return jobs
            jobs += claim.jobs
    finally:
        session.close()


def test_put_and_put_many_store_the_key_and_leave_it_null_without_one(db):
    # Given puts with and without a key, alternating (put() keeps the text of an unkeyed put's
    # statement from one call to the next: a keyed put must not take it, nor leave its key in it)
    cfg = db.config(producer={"chunk_size": 100})
    with Producer("q", cfg) as p:
        plain = p.put({"n": 1})
        keyed = p.put({"n": 2}, key="customer-42")
        plain_again = p.put({"n": 3})
        keyed_later = p.put({"n": 4}, key="customer-7", delay=3600, priority=3)
        at = p.put({"n": 5}, key="customer-7", run_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1))
        both = p.put({"n": 6}, key="customer-42", dedup_key="sync-42")
        many = p.put_many([{"n": i} for i in range(250)], key="tenant-a")  # three chunks
        many_plain = p.put_many([{"n": i} for i in range(3)])
    # Then each row holds its own key, and the unkeyed ones none
    keys = _keys(db)
    assert keys[plain] is None and keys[plain_again] is None
    assert keys[keyed] == "customer-42" and keys[both] == "customer-42"
    assert keys[keyed_later] == keys[at] == "customer-7"
    assert {keys[i] for i in many} == {"tenant-a"} and len(many) == 250
    assert {keys[i] for i in many_plain} == {None}
    assert db.scalar("SELECT dedup_key FROM nq_job WHERE id = %s", (both,)) == "sync-42"


def test_the_claim_hands_the_key_to_the_handler_as_job_key(db):
    cfg = db.config()
    with Producer("q", cfg) as p:
        keyed = p.put({"n": 1}, key="customer-42", dedup_key="d-1")
        plain = p.put({"n": 2})
        many = p.put_many([{"n": 3}, {"n": 4}], key="tenant-b")
    jobs = {job.id: job for job in _claim_all(cfg)}
    assert jobs[keyed].key == "customer-42" and jobs[keyed].dedup_key == "d-1"
    assert jobs[plain].key is None and jobs[plain].dedup_key is None
    assert [jobs[i].key for i in many] == ["tenant-b", "tenant-b"]


def test_a_key_of_191_four_byte_characters_is_stored_and_claimed_whole(db):
    key = "\N{GRINNING FACE}" * 190 + "k"
    cfg = db.config()
    with Producer("q", cfg) as p:
        job_id = p.put({"n": 1}, key=key)
    assert _keys(db)[job_id] == key
    assert [job.key for job in _claim_all(cfg)] == [key]


BAD_KEYS = [
    (42, "key: expected a string, got 42"),
    (b"bytes", "key: expected a string"),
    ("", "key must be 1 to 191 characters, got 0"),
    ("k" * 192, "key must be 1 to 191 characters, got 192"),
    ("a\udc80b", "key is not valid UTF-8"),
]


@pytest.mark.parametrize("bad,message", BAD_KEYS)
def test_a_bad_key_is_one_input_error_and_nothing_is_written(db, bad, message):
    cfg = db.config()
    conn = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
    try:
        with notifyq.Producer("q", cfg) as p:
            for call in (lambda: p.put({"n": 1}, key=bad),
                         lambda: p.put({"n": 1}, key=bad, dedup_key="d"),
                         lambda: p.put_many([{"n": 1}, {"n": 2}], key=bad),
                         lambda: p.put({"n": 1}, key=bad, conn=conn),
                         lambda: p.put_many([{"n": 1}], key=bad, conn=conn)):
                with pytest.raises(errors.InputError) as raised:
                    call()
                assert message in str(raised.value) and "\n" not in str(raised.value)
        conn.commit()
    finally:
        conn.close()
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    assert db.scalar("SELECT COUNT(*) FROM nq_dedup") == 0


def test_keys_on_the_callers_connection_and_in_its_transaction(db):
    cfg = db.config()
    conn = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
    try:
        with notifyq.Producer("q", cfg) as p:
            one = p.put({"n": 1}, key="c-1", conn=conn)
            two = p.put_many([{"n": 2}, {"n": 3}], key="c-2", conn=conn)
            conn.commit()
            with p.transaction(conn) as tx:
                three = tx.put({"n": 4}, key="c-3")
                four = tx.put_many([{"n": 5}], key="c-4")
    finally:
        conn.close()
    keys = _keys(db)
    assert keys[one] == "c-1" and [keys[i] for i in two] == ["c-2", "c-2"]
    assert keys[three] == "c-3" and [keys[i] for i in four] == ["c-4"]


# ------------------------------------------------------------------ the other enqueue paths


def test_the_asyncio_producer_puts_keys(db):
    import asyncio

    async def main() -> tuple[int, list[int]]:
        async with notifyq.AsyncProducer("q", db.config(), sessions=2) as p:
            return await p.put({"n": 1}, key="a-1"), await p.put_many([{"n": 2}, {"n": 3}], key="a-2")

    one, many = asyncio.run(main())
    keys = _keys(db)
    assert keys[one] == "a-1" and [keys[i] for i in many] == ["a-2", "a-2"]


def test_a_tasks_key_is_fixed_or_a_function_of_its_arguments(db):
    registry = notifyq.TaskRegistry(db.config())

    @registry.task(queue="q", key=lambda customer, **_: f"customer-{customer}")
    def sync(customer, full=False):
        return customer

    @registry.task(queue="q", key="reports")
    def report(day):
        return day

    @registry.task(queue="q", key=lambda *args, **kwargs: None)
    def unkeyed():
        return None

    @registry.task(queue="q", key=lambda customer: customer)
    def bad_key(customer):
        return customer

    try:
        by_arg, by_kwarg = sync.enqueue(42), sync.enqueue(customer=7, full=True)
        fixed, none = report.enqueue("2026-11-29"), unkeyed.enqueue()
        # A key function that returns what is no key: one InputError naming the task, nothing put
        with pytest.raises(errors.InputError, match=r"task .*bad_key: its key function's result: expected a string"):
            bad_key.enqueue(5)
    finally:
        registry.close()
    keys = _keys(db)
    assert (keys[by_arg], keys[by_kwarg], keys[fixed], keys[none]) == ("customer-42", "customer-7", "reports", None)
    assert len(keys) == 4
    # A fixed key is checked when the task is made
    with pytest.raises(errors.InputError, match="key must be 1 to 191 characters"):
        registry.task(queue="q", key="")(lambda: None)


def test_notifyq_testing_shows_a_queued_jobs_key(db):
    from notifyq import testing

    with Producer("q", db.config()) as p:
        p.put({"n": 1}, key="t-1")
        p.put({"n": 2})
    assert [job.key for job in testing.jobs(db.config(), "q")] == ["t-1", None]


def test_cli_produce_key_for_arguments_and_streams_and_jobs_list_and_show_it(db):
    from conftest import run_cli

    args = run_cli(db.env, "produce", "-q", "q", "--key", "cli-1", '{"n": 1}', '{"n": 2}')
    assert args.returncode == 0, args.stderr
    stream = run_cli(db.env, "produce", "-q", "q", "--key", "cli-2", "--print-ids",
                     input='{"n": 3}\n{"n": 4}\n')
    assert stream.returncode == 0, stream.stderr
    plain = run_cli(db.env, "produce", "-q", "q", '{"n": 5}')
    assert plain.returncode == 0, plain.stderr
    ids = [int(i) for i in args.stdout.split() + stream.stdout.split() + plain.stdout.split()]
    keys = _keys(db)
    assert [keys[i] for i in ids] == ["cli-1", "cli-1", "cli-2", "cli-2", None]
    # `jobs list` shows a key column once a job has a key, and its JSON a "key" field
    table = run_cli(db.env, "jobs", "list", "-q", "q")
    assert table.returncode == 0, table.stderr
    head, *lines = table.stdout.splitlines()
    assert head.split()[:4] == ["id", "queue", "key", "status"]
    assert [line.split()[2] for line in lines] == ["cli-1", "cli-1", "cli-2", "cli-2", "-"]
    listed = run_cli(db.env, "jobs", "list", "-q", "q", "--json")
    assert [r["key"] for r in json.loads(listed.stdout)] == ["cli-1", "cli-1", "cli-2", "cli-2", None]
    only = run_cli(db.env, "jobs", "list", "-q", "q", "--key", "cli-2", "--json")
    assert [r["id"] for r in json.loads(only.stdout)] == ids[2:4]
    shown = run_cli(db.env, "jobs", "show", str(ids[2]), "--json")
    assert json.loads(shown.stdout)["key"] == "cli-2"
    text = run_cli(db.env, "jobs", "show", str(ids[2]))
    assert any(line.split() == ["key", "cli-2"] for line in text.stdout.splitlines())


def test_cli_produce_refuses_a_bad_key_in_one_line_before_reading_a_line(db):
    from conftest import run_cli

    for argv, stdin in ((["k" * 192, '{"n": 1}'], None), (["k" * 192], '{"n": 1}\n')):
        out = run_cli(db.env, "produce", "-q", "q", "--key", *argv, input=stdin)
        assert out.returncode == 4, (out.returncode, out.stderr)
        assert out.stderr.strip().endswith("--key must be 1 to 191 characters, got 192")
        assert len(out.stderr.strip().splitlines()) == 1
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
