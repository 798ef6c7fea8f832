"""The statements between a wake-up and the handler's start: an interrupted wait goes to its
claim without reading the count again."""

from __future__ import annotations

import dataclasses
import threading

from conftest import wait_until

from notifyq.produce.producer import Producer
from notifyq.store import bells
from notifyq.store.db import Session
from notifyq.store.locks import QueueLocks
from notifyq.wakeup import Waiter

HOLD_S = 20


def _watcher(cfg) -> tuple[Waiter, Session]:
    session = Session(cfg.dsn, autocommit=True, read_timeout_s=30, name="watcher")
    waiter = Waiter(session, "q", QueueLocks(cfg.dsn.database, "q"), cfg.wakeup, threading.Event(),
                    on_turn=lambda: None, on_reap=lambda: None)
    session.conn  # connected first: a wait that connects gives its turn back, as after a reconnect
    assert waiter.acquire_watch() is True
    return waiter, session


def _in_statement(db, conn_id: int, what: str) -> bool:
    rows = db.query("SELECT INFO FROM information_schema.PROCESSLIST WHERE ID = %s", (conn_id,))
    return bool(rows) and rows[0][0] is not None and what in rows[0][0]


def test_an_instant_wake_sends_the_watcher_to_its_claim_without_another_watch_statement(db, monkeypatch):
    # Given the watcher asleep in one long SLEEP (no ringer holds a bell), counting its statements
    cfg = db.config()
    waiter, session = _watcher(cfg)
    waiter.cfg = dataclasses.replace(cfg.wakeup, poll_initial_s=20.0, poll_max_s=20.0)
    started: list[int] = []
    watch = bells.watch

    def counted(*a, **kw):
        started.append(1)
        return watch(*a, **kw)

    monkeypatch.setattr(bells, "watch", counted)
    woke: list = []
    thread = threading.Thread(target=lambda: woke.append(waiter.wait_for_work()), daemon=True)
    try:
        thread.start()
        wait_until(lambda: _in_statement(db, session.connection_id, "SLEEP"), HOLD_S, message="the watcher asleep")
        before = len(started)
        # When a producer without the bell puts a job (its instant wake KILLs the SLEEP)
        with Producer("q", cfg) as p:
            p.put({"n": 1})
        thread.join(HOLD_S)
        # Then the watcher returns to claim on the interrupted statement alone: the claim reads
        # the count itself, and another watch statement first was a round trip more to the handler
        assert woke == [True]
        assert len(started) == before
    finally:
        waiter.stop.set()
        thread.join(HOLD_S)
        session.close()
