"""A KILL QUERY of a consumer's watcher session (the instant wake sends them, a DBA may too) never
leaves the session waiting for a reply the server will not send.

The server stops a multi-statement query when a KILL QUERY lands between two of its statements:
the first statement's reply says more results follow, and nothing more comes. The watch hand-on,
sent ahead on the watcher session, was two statements: a consumer then waited in its read for
the read timeout (60 s), holding the watch lock, with jobs ready."""

from __future__ import annotations

import random
import threading
import time

import MySQLdb
from conftest import admin_connect, wait_until

from notifyq.produce.producer import Producer
from notifyq.store import advisory
from notifyq.store.db import Session

WATCH = "nq_test_watch"


def test_the_watch_hand_on_is_one_statement_released_after_the_claims_row_lock(db):
    """Regression: the hand-on was `SELECT ... LOCK IN SHARE MODE; DO RELEASE_LOCK(...)`, two
    replies, and a KILL QUERY between them left the second unsent (the consumer stalled)."""
    cfg = db.config()
    with Producer("q", cfg) as p:
        p.put_many([{"n": 1}])  # (the queue's nq_queue row exists from here)
    home = Session(cfg.dsn, autocommit=True, name="home")
    blocker = admin_connect(db.admin, db.admin.database)
    try:
        # Given a watcher session holding the watch lock, and a claim's transaction holding the
        # queue's row (its COMMIT not done yet)
        assert advisory.get_lock(home, WATCH, 0) == 1
        conn_id = home.connection_id
        cur = blocker.cursor()
        cur.execute("BEGIN")
        cur.execute("UPDATE nq_queue SET watched_seq = watched_seq WHERE queue = 'q'")
        # When the watch is handed on
        advisory.hand_watch_on(home, WATCH, "q")
        pending = home.pipeline.pending
        # Then the hand-on waits for that row on the server, the watch lock still held
        wait_until(lambda: db.query("SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = %s "
                                    "AND INFO LIKE %s", (conn_id, "%RELEASE_LOCK%")), 10,
                   message="the hand-on on the server")
        assert db.query("SELECT IS_USED_LOCK(%s)", (WATCH,)) == [(conn_id,)]
        # And once the row's transaction commits, the lock is free, and the hand-on had one reply
        # (one statement: nothing a KILL QUERY could cut off after a first reply)
        cur.execute("COMMIT")
        home.pipeline.read_reply()
        assert pending.settled and not pending.failed and len(pending.rowcounts) == 1
        assert db.query("SELECT IS_USED_LOCK(%s)", (WATCH,)) == [(None,)]
        assert home.generation == 1
    finally:
        blocker.close()
        home.close()


def test_a_watcher_handing_on_under_a_storm_of_kill_query_never_waits_out_its_read_timeout(db):
    """The same, at random moments: every hand-on is answered, on the same connection. (On the
    code before, about one KILL in 2,000 to 5,000 that landed in a hand-on cut it off: a test of
    this length then fails about half the time; the test above fails every time.)"""
    cfg = db.config()
    with Producer("q", cfg) as p:
        p.put_many([{"n": 1}])
    home = Session(cfg.dsn, autocommit=True, name="home", read_timeout_s=3)
    killer = admin_connect(db.admin, db.admin.database)
    stop = threading.Event()
    target = {"id": 0}

    def storm() -> None:
        rng = random.Random(15)
        while not stop.wait(rng.random() / 2000):  # a KILL every 0.25 ms on average
            try:
                killer.query(f"KILL QUERY {int(target['id'])}".encode())
            except MySQLdb.Error:
                pass  # between sessions: nothing to kill

    thread = threading.Thread(target=storm, daemon=True)
    try:
        # Given a watcher session, and a storm of KILL QUERY aimed at it
        advisory.lock_holder(home, WATCH)  # (connected: the session's id is known)
        target["id"] = home.connection_id
        thread.start()
        # When it takes the watch lock and hands it on, again and again, for 3 s
        hand_ons, deadline = 0, time.monotonic() + 3
        while time.monotonic() < deadline:
            while advisory.get_lock(home, WATCH, 0) != 1:  # a KILL may interrupt the GET_LOCK
                pass
            advisory.hand_watch_on(home, WATCH, "q")
            home.pipeline.read_reply()
            hand_ons += 1
        # Then every hand-on was answered on the first connection (a read timeout reconnects)
        assert hand_ons > 100 and home.generation == 1
        assert db.query("SELECT IS_USED_LOCK(%s)", (WATCH,)) == [(None,)]
    finally:
        stop.set()
        thread.join(5)
        killer.close()
        home.close()
