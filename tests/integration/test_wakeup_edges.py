"""A reload that raises the idle wait past the lock session's read timeout (fixed when it
connected) must not turn every wait into a lost connection and a reconnect."""

from __future__ import annotations

import dataclasses
import threading
import time

from notifyq.store import advisory
from notifyq.store.db import Session
from notifyq.store.locks import QueueLocks
from notifyq.wakeup import Waiter

READ_TIMEOUT_S = 3


def _waiter(cfg) -> tuple[Waiter, Session]:
    session = Session(cfg.dsn, autocommit=True, read_timeout_s=READ_TIMEOUT_S, name="lock")
    waiter = Waiter(session, "q", QueueLocks(cfg.dsn.database, "q"), cfg.wakeup, threading.Event(),
                    on_turn=lambda: None, on_reap=lambda: None)
    session.conn  # connected with the read timeout of the config it started with
    # What a SIGHUP does (service._reload): the new waits are far longer than the read timeout
    waiter.cfg = dataclasses.replace(cfg.wakeup, idle_wait_s=30.0, poll_max_s=30.0)
    return waiter, session


def test_a_consumer_queued_for_the_watch_lock_times_out_instead_of_reconnecting(db):
    # Given a consumer queued behind a watcher, after a reload raised idle_wait_s to 30 s
    cfg = db.config()
    watcher = Session(cfg.dsn, autocommit=True)
    waiter, session = _waiter(cfg)
    assert advisory.get_lock(watcher, waiter.locks.watch, 0) == 1
    generation = session.generation
    try:
        # When it waits for its turn
        started = time.monotonic()
        got = waiter.acquire_watch()
        took = time.monotonic() - started
        # Then the wait ends by its own timeout, inside the read timeout, on the same connection
        assert got is False and waiter.watch_timed_out
        assert took < READ_TIMEOUT_S, took
        assert session.generation == generation
    finally:
        watcher.close()
        session.close()


def test_the_watcher_keeps_its_connection_while_it_waits_for_work(db):
    # Given the watcher, after a reload raised poll_max_s to 30 s
    cfg = db.config()
    waiter, session = _waiter(cfg)
    assert waiter.acquire_watch() is True
    generation = session.generation
    try:
        # When it waits for work for longer than the read timeout
        woke = waiter.wait_for_work(safety_s=READ_TIMEOUT_S * 3)
        # Then it comes back by its safety timeout on the same connection, still the watcher
        assert woke is True and waiter.wakeups["timeout"] == 1
        assert session.generation == generation
        assert advisory.lock_holder(session, waiter.locks.watch) == session.connection_id
    finally:
        session.close()
