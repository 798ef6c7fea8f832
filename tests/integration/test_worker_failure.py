"""A worker thread that ends on an error of its own (not a handler's: those fail their jobs)
stops the consumer with a non-zero exit status, never 0: under systemd, Restart=on-failure
then starts it again."""

from __future__ import annotations

import threading

import pytest

from notifyq import errors
from notifyq.consume.service import ConsumeOptions, ConsumerService
from notifyq.consume.worker import Worker


class Unwound(BaseException):
    """A BaseException that is no Exception, from somewhere in the worker's own code."""


def _raise(*args, **kwargs):
    raise Unwound("from the worker's own code")


@pytest.mark.parametrize("where", ["_claim_and_run", "run"])
def test_a_worker_thread_ended_by_a_base_exception_stops_the_consumer_non_zero(db, monkeypatch, where):
    """Regression: a BaseException that is no Exception ended the worker's thread unsaid (its
    loop caught Exception only); once every worker's had, the consumer stopped by itself and
    exited 0, which Restart=on-failure never restarts."""
    # Given a consumer whose worker raises a BaseException in its loop (or past it)
    monkeypatch.setattr(Worker, where, _raise)
    service = ConsumerService(db.config(), ConsumeOptions(queues=("q",), function=lambda job: None, workers=2))
    stop = threading.Event()
    # When it runs
    outcome: list[int] = []
    runner = threading.Thread(target=lambda: outcome.append(service.run(stop)), daemon=True)
    runner.start()
    runner.join(30)
    stop.set()
    runner.join(10)
    # Then it stopped by itself with the internal error's status, the workers' error kept
    assert outcome == [errors.EXIT_INTERNAL]
    assert all(isinstance(w.error, Unwound) for w in service.workers)
