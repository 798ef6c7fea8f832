"""The statements between a wake-up and the handler's start: an interrupted wait goes to its
claim without reading the count again, and a watcher's claim hands the watch on only once its
COMMIT is done, without waiting for that COMMIT itself."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from conftest import admin_connect, wait_until

from notifyq.produce.producer import Producer
from notifyq.store import bells, queries
from notifyq.store.db import Session
from notifyq.store.locks import QueueLocks
from notifyq.wakeup import Waiter

OWNER = "a" * 32
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
    session.run(lambda cur: queries.ensure_queue(cur, "q"), what="t")  # (else the first read makes it)
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
        # in its turn's second watch statement: the first waits at most FIRST_WAIT_S (50 ms), and a
        # look that saw that one counted the long one's start as "another watch statement"
        wait_until(lambda: len(started) >= 2 and _in_statement(db, session.connection_id, "SLEEP"), HOLD_S,
                   message="the watcher asleep in its long wait")
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


@pytest.fixture
def backup_stage(db):
    if "mariadb" not in db.query("SELECT VERSION()")[0][0].lower():
        pytest.skip("needs MariaDB's BACKUP STAGE to hold a COMMIT back")


def test_a_watchers_claim_hands_the_watch_on_once_its_commit_is_done(db, backup_stage):
    # Given one ready job, the watcher, and a server that holds every COMMIT back
    cfg = db.config()
    with Producer("q", cfg) as p:
        [job_id] = p.put_many([{"n": 1}])
    waiter, session = _watcher(cfg)
    work = Session(cfg.dsn, name="work")
    blocker = admin_connect(db.admin)
    try:
        blocker.cursor().execute("BACKUP STAGE START")
        blocker.cursor().execute("BACKUP STAGE BLOCK_COMMIT")
        # When the watcher claims the job (it returns with its COMMIT in flight) and hands on
        claim = queries.claim(work, "q", OWNER, 10, 60, as_watcher=True)
        assert [j.id for j in claim.jobs] == [job_id] and claim.drained
        assert claim.commit is not None and not claim.commit.settled
        waiter.release_watch(wait=False, claimed=job_id)
        # Then the watch lock stays held while the COMMIT waits: the next watcher would read
        # a watched count without this job, and wake for work already taken
        wait_until(lambda: _in_statement(db, session.connection_id, "RELEASE_LOCK"), HOLD_S,
                   message="the hand-on waiting")
        assert db.query("SELECT IS_USED_LOCK(%s)", (waiter.locks.watch,)) == [(session.connection_id,)]
        # And once the COMMIT is done the lock is free and the count recorded as watched
        blocker.cursor().execute("BACKUP STAGE END")
        wait_until(lambda: db.query("SELECT IS_USED_LOCK(%s)", (waiter.locks.watch,)) == [(None,)], HOLD_S,
                   message="the watch lock handed on")
        work.pipeline.read_reply()
        assert claim.commit.settled and not claim.commit.failed
        assert db.query("SELECT q.watched_seq = (SELECT SUM(seq) FROM nq_signal s WHERE s.queue = 'q') "
                        "FROM nq_queue q WHERE q.queue = 'q'") == [(1,)]
    finally:
        blocker.close()
        work.close()
        session.close()
