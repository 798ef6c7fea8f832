"""An attempt's record (nq_attempt) starts when its handler was called and ends when it returned,
also when the server runs the record's statement late (a server frozen, or away, as the outcome
is sent: it runs the statement once it wakes).

Regression: the record carried each job's times as ages measured when its statement was built,
placed on the server's clock when it ran (NOW(6) - age): a statement held on its way by 2 s
recorded the attempt as ending (and starting) 2 s late.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from conftest import Relay

from notifyq.consume import handlers
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer

HOLD_S = 2.0  # how long the record's statement is held on its way to the server
CLOSE_S = 0.3  # how close to the handler's own times the record must be


class HoldingRelay(Relay):
    """A TCP relay to the server that, once armed, holds the first client query that writes an
    attempt record (INSERT INTO nq_attempt) for HOLD_S before passing it on: a server that
    receives, and so runs, the statement late. Everything else passes at once."""

    def __init__(self, host: str, port: int):
        self.armed = threading.Event()
        self.held = threading.Event()
        super().__init__(host, port)

    def forward(self, data: bytes, dst, pair, from_client: bool) -> bool:
        if (from_client and self.armed.is_set() and not self.held.is_set()
                and b"INSERT INTO nq_attempt" in data):
            self.held.set()
            threading.Event().wait(HOLD_S)  # (the server's late answer: a span to measure, no hand-off)
        dst.sendall(data)
        return True


def _epoch(at: dt.datetime) -> float:
    return at.replace(tzinfo=dt.timezone.utc).timestamp()  # (the server's DATETIMEs are UTC)


@pytest.mark.parametrize("fails", [False, True], ids=["done", "failed"])
def test_an_attempt_record_run_late_by_the_server_keeps_the_handlers_own_times(db, fails):
    if db.dsn.unix_socket:
        pytest.skip("the relay speaks TCP")
    (host, port), = db.dsn.servers
    relay = HoldingRelay(host, port)
    cfg = db.config(dsn=f"mysql://{db.dsn.user}@127.0.0.1:{relay.port}/{db.dsn.database}",
                    defaults={"lease_s": 60.0, "max_attempts": 1})
    try:
        with Producer("q", cfg) as p:
            [job] = p.put_many([{"n": 1}])
        marks: dict[str, float] = {}

        # Given a handler that notes its start and end (the epoch), after which the statement
        # that records its attempt reaches the server HOLD_S late
        def handler(job) -> None:
            marks["start"] = time.time()
            threading.Event().wait(0.2)  # (a run of some length: its start and end apart)
            relay.armed.set()
            marks["end"] = time.time()
            if fails:
                raise RuntimeError("boom")

        worker = Worker(cfg, "q", handlers.PythonHandler(handler, False), stop=threading.Event(),
                        budget=Budget(None), batch_size=1, exit_when_empty=True)

        # When the worker runs it to its end
        runner = threading.Thread(target=worker.run, name="worker-thread", daemon=True)
        runner.start()
        runner.join(60)
        assert not runner.is_alive() and worker.error is None
        assert relay.held.is_set(), "the record's statement was held"
    finally:
        relay.close()

    # Then its record starts and ends when the handler did, not HOLD_S later
    [(outcome, started_at, ended_at)] = db.query(
        "SELECT outcome, started_at, ended_at FROM nq_attempt WHERE job_id = %s", (job,))
    assert outcome == ("dead" if fails else "done")
    assert abs(_epoch(ended_at) - marks["end"]) < CLOSE_S, (_epoch(ended_at) - marks["end"])
    assert abs(_epoch(started_at) - marks["start"]) < CLOSE_S, (_epoch(started_at) - marks["start"])
