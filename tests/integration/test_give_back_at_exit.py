"""A consumer stopped while its worker's give-back fails (here it lost its lock conflicts, and the
stop ends the worker rather than let it claim on) settles the batch at its exit: the shutdown's
own session gives the jobs back, as it does a stuck handler's batch.

Regression: the worker marked the batch settled whatever its give-back did, and the shutdown
looked only at workers whose thread was still alive; the consumer exited 0 with the unstarted
job still claimed until its lease ended.
"""

from __future__ import annotations

import threading
import time

from conftest import wait_until

from notifyq import errors
from notifyq.consume.service import ConsumeOptions, ConsumerService
from notifyq.produce.producer import Producer
from notifyq.store import queries

LEASE_S = 120.0  # no lease ends within the test: what comes back came back at the exit


def test_a_batch_whose_give_back_failed_as_its_worker_stopped_is_given_back_at_the_exit(db, monkeypatch):
    # Given a consumer (one worker, batches of 2) running the first job of its batch until the
    # test releases it, and whose give-backs fail on lock conflicts until its exit's settle: the
    # stop's own give-back (BatchRun.give_back_waiting) leaves the job to its worker, whose
    # give-back fails too
    cfg = db.config(defaults={"lease_s": LEASE_S}, consumer={"shutdown_grace_s": 30.0})
    with Producer("q", cfg) as p:
        first, second = p.put_many([{"n": 1}, {"n": 2}])
    entered, release = threading.Event(), threading.Event()

    def handler(job) -> None:
        entered.set()
        assert release.wait(30)

    real_give_back = queries.give_back
    give_backs: list[tuple[str, list[int]]] = []

    def give_back(session, queue, ids, token):
        give_backs.append((threading.current_thread().name, list(ids)))
        if threading.current_thread().name != "notifyq-settle":
            raise errors.TransientDBError("give back failed after retrying: MySQL error 1205: Lock wait timeout")
        return real_give_back(session, queue, ids, token)

    monkeypatch.setattr(queries, "give_back", give_back)
    service = ConsumerService(cfg, ConsumeOptions(queues=("q",), function=handler, workers=1, batch_size=2))
    stop = threading.Event()
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.setdefault("rc", service.run(stop)), daemon=True)
    runner.start()
    try:
        assert entered.wait(30), "the first job started"
        # When it is stopped while the job runs, and the job ends inside the grace
        stop.set()
        wait_until(lambda: service.stop.is_set(), 10, message="the consumer draining")
        release.set()
        stopped_at = time.monotonic()
        runner.join(30)
    finally:
        release.set()
        stop.set()
    # Then its worker's own give-back failed, its thread ended well inside the grace ...
    assert not runner.is_alive() and outcome.get("rc") == 0, outcome
    assert time.monotonic() - stopped_at < 10
    assert ("notifyq-w1", [second]) in give_backs and not service.workers[0].error
    assert give_backs[-1] == ("notifyq-settle", [second])
    # And by the exit the shutdown gave the job back, its attempt undone; the finished one acked
    assert db.query("SELECT status, attempts, owner FROM nq_job WHERE id = %s", (second,)) == [(0, 0, None)]
    assert db.query("SELECT status FROM nq_job WHERE id = %s AND status <> 3", (first,)) == []
