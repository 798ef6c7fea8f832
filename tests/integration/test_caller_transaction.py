"""producer.transaction(conn): the caller's own transaction with its jobs in it, committed or
rolled back whole, and the queue's idle consumer woken at the commit, not at its next poll."""

from __future__ import annotations

import threading
import time

import MySQLdb
import pytest
from conftest import wait_until

from notifyq.consume.service import ConsumeOptions, ConsumerService
from notifyq.produce.producer import Producer


def _connect(db):
    """The application's own connection (its user may write its own tables)."""
    return MySQLdb.connect(**db.admin.connect_args(), autocommit=False)


def test_a_transaction_commits_the_callers_writes_and_its_jobs_together_or_neither(db):
    db.query("CREATE TABLE orders (id INT PRIMARY KEY, state VARCHAR(10))")
    conn = _connect(db)
    try:
        with Producer("q", db.config()) as producer:
            # When the block ends, the order and its job commit together
            with producer.transaction(conn) as tx:
                conn.cursor().execute("INSERT INTO orders VALUES (1, 'paid')")
                job_id = tx.put({"order": 1})
            assert db.query("SELECT state FROM orders") == [("paid",)]
            assert db.query("SELECT id FROM nq_job") == [(job_id,)]
            # And when it raises, neither is stored
            with pytest.raises(RuntimeError), producer.transaction(conn) as tx:
                conn.cursor().execute("INSERT INTO orders VALUES (2, 'paid')")
                tx.put_many([{"order": 2}, {"order": 3}])
                raise RuntimeError("the payment failed")
            assert db.query("SELECT COUNT(*) FROM orders") == [(1,)]
            assert db.query("SELECT COUNT(*) FROM nq_job") == [(1,)]
    finally:
        conn.close()


def test_the_jobs_of_a_committed_transaction_start_at_once_not_at_the_next_poll(db):
    # Given an idle consumer whose poll would come only every 30 s, and a producer without a bell
    cfg = db.config(wakeup={"poll_initial_s": 30.0, "poll_max_s": 30.0, "idle_wait_s": 30.0})
    started: list[float] = []
    stop = threading.Event()
    service = ConsumerService(cfg, ConsumeOptions(queues=("q",), function=lambda job: started.append(time.monotonic()),
                                                  workers=1))
    runner = threading.Thread(target=service.run, args=(stop,), daemon=True)
    conn = _connect(db)
    try:
        runner.start()
        wait_until(lambda: service.workers and all(w.waiter.watching for w in service.workers), 30,
                   message="the consumer watching the queue")
        with Producer("q", cfg) as producer:
            # When a transaction with a job commits
            with producer.transaction(conn) as tx:
                tx.put({"n": 1})
            committed = time.monotonic()
            # Then the consumer starts it well before its poll would have
            wait_until(lambda: started, 10, message="the job started")
        assert started[0] - committed < 5, started[0] - committed
    finally:
        stop.set()
        runner.join(30)
        conn.close()
