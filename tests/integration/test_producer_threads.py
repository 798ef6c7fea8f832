"""One Producer shared by threads (issue 26, item 1): a put() that returns has stored its job, one
that raises has stored nothing (or raises OutcomeUnknown), and no raw driver error reaches the
caller. On the code before, 8 threads x 200 puts lost most of the ids they were given."""

from __future__ import annotations

import json
import threading
import time

import MySQLdb
import pytest
from conftest import create_test_db, drop_test_db, wait_until

from notifyq import config as config_mod
from notifyq import errors
from notifyq import Producer

THREADS = 8
PUTS = 200  # the issue-28 proof: 8 threads x 200 puts on one producer, every returned id stored
JOIN_S = 60.0


def _hammer(producer: Producer, conn_for=None) -> dict:
    """THREADS threads, PUTS calls each on `producer`: plain puts, a put_many of two now and then,
    and puts with a dedup key of their own. Every payload is unique: (thread, call, part)."""
    returned: dict[str, int] = {}  # payload -> id
    raised: dict[str, BaseException] = {}  # payload -> what its call raised
    guard = threading.Lock()
    start = threading.Barrier(THREADS)

    def work(t: int) -> None:
        conn = conn_for() if conn_for is not None else None
        start.wait()
        for i in range(PUTS):
            texts = [f"{t}-{i}-{part}" for part in range(2 if i % 10 == 3 else 1)]
            try:
                if len(texts) == 2:
                    ids = producer.put_many([{"p": s} for s in texts], conn=conn)
                elif i % 10 == 7:
                    ids = [producer.put({"p": texts[0]}, dedup_key=f"k-{texts[0]}", conn=conn)]
                else:
                    ids = [producer.put({"p": texts[0]}, conn=conn)]
                if conn is not None:
                    conn.commit()
            except BaseException as e:  # noqa: BLE001 - every kind is judged below
                with guard:
                    raised.update((s, e) for s in texts)
                continue
            with guard:
                returned.update(zip(texts, ids))
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + JOIN_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [thread.name for thread in threads if thread.is_alive()]
    assert not hung, f"{len(hung)} threads still in put() after {JOIN_S:g} s"
    return {"returned": returned, "raised": raised}


def _stored(testdbs) -> dict[str, int]:
    stored: dict[str, int] = {}
    for testdb in testdbs:
        for job_id, payload in testdb.query("SELECT id, payload FROM nq_job"):
            stored[json.loads(payload)["p"]] = int(job_id)
    return stored


def _judge(outcome: dict, stored: dict[str, int]) -> None:
    returned, raised = outcome["returned"], outcome["raised"]
    raw = [e for e in raised.values() if isinstance(e, MySQLdb.Error)]
    assert not raw, f"{len(raw)} raw driver errors reached the caller, the first: {raw[0]!r}"
    unknown = {s for s, e in raised.items() if isinstance(e, errors.OutcomeUnknown)}
    missing = {s: i for s, i in returned.items() if stored.get(s) != i}
    assert not missing, f"{len(missing)} of {len(returned)} returned ids not stored as returned"
    ghosts = set(raised) & set(stored) - unknown
    assert not ghosts, f"{len(ghosts)} jobs stored although their put raised: {sorted(ghosts)[:5]}"
    assert len(stored) == len(returned) + len(set(stored) & unknown)
    # No fault is injected: every call should simply have worked.
    assert not raised, f"{len(raised)} calls raised, the first: {next(iter(raised.values()))!r}"
    assert len(returned) == THREADS * (PUTS + PUTS // 10)


@pytest.mark.parametrize("ring", [False, True])
def test_threads_sharing_one_producer_get_an_id_for_every_job_stored_and_only_for_those(db, ring):
    # Given one long-lived Producer, as a web worker keeps it (ringing or not), on a fresh queue
    cfg = db.config()
    with Producer("q", cfg, ring=ring) as producer:
        # When 8 threads put through it at once
        outcome = _hammer(producer)
    # Then every id returned is a stored job, no put raised, no driver error leaked
    _judge(outcome, _stored([db]))


def test_threads_sharing_one_producer_of_a_spread_queue_deal_every_job_once(db, server_dsn, tmp_path):
    # Given a queue spread over two shards (two databases of one server), one Producer for it
    other = create_test_db(server_dsn)
    try:
        urls = {n: f"mysql://{d.dsn.user}@{d.dsn.host}:{d.dsn.port}/{d.dsn.database}"
                + (f"?unix_socket={d.dsn.unix_socket}" if d.dsn.unix_socket else "")
                for n, d in (("a", db), ("b", other))}
        path = tmp_path / "notifyq.toml"
        path.write_text("[shards]\n" + "".join(f'{n} = "{u}"\n' for n, u in urls.items())
                        + "[queue.s]\nspread = true\n")
        env = {k: v for k, v in db.env.items() if k != "NOTIFYQ_DSN"}
        cfg = config_mod.load(env={**env, "NOTIFYQ_CONFIG": str(path)})
        with Producer("s", cfg) as producer:
            # When 8 threads put through it at once (dealing jobs over the shards)
            outcome = _hammer(producer)
        # Then every job is on one shard or the other, once, under the id its put returned
        stored_a, stored_b = _stored([db]), _stored([other])
        assert not set(stored_a) & set(stored_b)
        assert stored_a and stored_b, "both shards take jobs"
        _judge(outcome, {**stored_a, **stored_b})
    finally:
        drop_test_db(other)


def test_threads_putting_on_their_own_connections_share_one_producer_without_waiting_on_it(db):
    # Given one Producer, and threads that each put inside their own transactions (conn=)
    cfg = db.config()
    with Producer("q", cfg, ring=True) as producer:
        producer.put({"p": "warm"})  # the producer's own sessions and bell exist
        # When 8 threads put through it at once, each in its own transaction
        outcome = _hammer(producer, conn_for=lambda: MySQLdb.connect(**db.dsn.connect_args(), autocommit=False))
    stored = _stored([db])
    stored.pop("warm")
    # Then the same rule holds on the callers' connections
    _judge(outcome, stored)


def test_close_while_other_threads_put_never_loses_a_returned_id(db):
    # Given threads putting through one Producer
    cfg = db.config()
    producer = Producer("q", cfg, ring=True)
    returned: dict[str, int] = {}
    raised: dict[str, BaseException] = {}
    stop = threading.Event()

    def work(t: int) -> None:
        i = 0
        while not stop.is_set():
            text = f"{t}-{i}"
            i += 1
            try:
                returned[text] = producer.put({"p": text})
            except BaseException as e:  # noqa: BLE001
                raised[text] = e

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(4)]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(returned) >= 50, 30, message="puts under way")
    # When the producer is closed while they put (a later put opens new sessions)
    producer.close()
    wait_until(lambda: len(returned) >= 100, 30, message="puts after close")
    stop.set()
    deadline = time.monotonic() + JOIN_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    producer.close()
    assert not any(thread.is_alive() for thread in threads)
    # Then every returned id is stored, and nothing raised
    _judge_loose(returned, raised, _stored([db]))


def _judge_loose(returned: dict, raised: dict, stored: dict[str, int]) -> None:
    raw = [e for e in raised.values() if isinstance(e, MySQLdb.Error)]
    assert not raw, f"{len(raw)} raw driver errors, the first: {raw[0]!r}"
    missing = {s for s, i in returned.items() if stored.get(s) != i}
    assert not missing, f"{len(missing)} of {len(returned)} returned ids not stored"
    assert not raised, f"{len(raised)} puts raised, the first: {next(iter(raised.values()))!r}"
    assert len(stored) == len(returned)
