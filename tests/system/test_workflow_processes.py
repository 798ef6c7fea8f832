"""Workflows with real `notifyq consume` processes: children put after parents that are running
already, with no fault of any kind, each start once (docs/workflows.md)."""

import collections
import random
import signal
import subprocess
import time
from pathlib import Path

import MySQLdb
from conftest import notifyq_cmd, wait_until

from notifyq.produce.producer import Producer


def starts(out: Path) -> collections.Counter:
    """Starts per job, from nqhandlers.record_then_sleep's lines."""
    counts: collections.Counter = collections.Counter()
    for path in out.glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                counts[int(parts[0])] += 1
    return counts


def test_children_put_after_running_parents_each_start_once(db, tmp_path):
    # Given three consumer processes of one queue, two workers each
    env = {**db.env, "NQ_TEST_OUT": str(tmp_path)}
    logs = [open(tmp_path / f"consumer{i}.err", "w") for i in range(3)]
    consumers = [subprocess.Popen(notifyq_cmd("consume", "-q", "wf", "--workers", "2",
                                              "--handler", "nqhandlers:record_then_sleep"),
                                  env=env, stdout=subprocess.DEVNULL, stderr=log)
                 for log in logs]
    rng = random.Random(11)
    put: list[int] = []
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 3, 60, message="3 consumers")
        with Producer("wf", db.config()) as producer:
            # When a producer keeps putting parents that run 20-120 ms, and children after
            # them once they run (claimed: their release races the consumers' claims)
            deadline = time.monotonic() + 12
            while time.monotonic() < deadline:
                parents = producer.put_many([{"ms": rng.randint(20, 120)} for _ in range(6)])
                put += parents
                # (one read: a second one could find every 20 ms parent ended already)
                running = wait_until(lambda: [r[0] for r in db.query(
                    "SELECT id FROM nq_job WHERE status = 2 AND id IN %s", (parents,))], 30, 0.005, "a parent running")
                # Put after them for as long as they run, and a little beyond: a put right after
                # its parent's end settles that parent itself (the same release as the ack's)
                for _ in range(12):
                    after = rng.sample(running, min(len(running), rng.randint(1, 2)))
                    put += producer.put_many([{"ms": 0}] * rng.randint(1, 4), after=after)
        # Then every job ran (and was acked) ...
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0, 120, 0.05, "every job acked")
    finally:
        for proc in consumers:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(60) for proc in consumers]
        for log in logs:
            log.close()
    counts = starts(tmp_path)
    assert set(counts) == set(put)
    # ... and none started twice: no fault was injected (a deadlock that rolled back a claim
    # whose jobs had started let a peer claim them again: up to 3 starts of a job)
    twice = {job_id: n for job_id, n in counts.items() if n > 1}
    assert not twice, f"{len(twice)} of {len(put)} jobs started more than once: {sorted(twice.items())[:10]}"
    assert codes == [0] * 3


def test_an_application_transaction_left_open_over_a_put_after_a_running_parent_stalls_nothing(db, tmp_path):
    # Given a consumer process of two queues, and a parent running on one of them
    env = {**db.env, "NQ_TEST_OUT": str(tmp_path)}
    log = open(tmp_path / "consumer.err", "w")
    consumer = subprocess.Popen(notifyq_cmd("consume", "-q", "wf", "-q", "wfother", "--workers", "2",
                                            "--handler", "nqhandlers:record_then_sleep"),
                                env=env, stdout=subprocess.DEVNULL, stderr=log)
    app = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 1, 60, message="the consumer")
        with Producer("wf", db.config()) as producer:
            [parent] = producer.put_many([{"ms": 300}])
            wait_until(lambda: db.scalar("SELECT status FROM nq_job WHERE id = %s", (parent,)) == 2, 30, 0.005,
                       "the parent running")
            # When an application's transaction puts a child after it and stays open (longer
            # than any lock wait: a session's innodb_lock_wait_timeout is 10 s)
            child = producer.put({"ms": 0}, after=[parent], conn=app)
            # Then the parent's ack lands while that transaction is open: it waits for nothing
            wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE id = %s", (parent,)) == 0, 8, 0.05,
                       "the parent acked while the application's transaction is open")
            # And the other queue's jobs run meanwhile
            [other] = Producer("wfother", db.config()).put_many([{"ms": 0}])
            wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE id = %s", (other,)) == 0, 30, 0.05,
                       "a job of the other queue run")
            app.commit()
        # And once the application commits, the child runs (the sweep releases it), once
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE id = %s", (child,)) == 0, 30, 0.05,
                   "the child run")
        assert consumer.poll() is None, "the consumer exited"
    finally:
        app.close()
        consumer.send_signal(signal.SIGTERM)
        code = consumer.wait(60)
        log.close()
    assert code == 0
    assert starts(tmp_path)[child] == 1
