"""A connection id of ours from before a server restart names nothing of ours after it: the
server counts ids from 1 again, and an application's session may hold it. No KILL of ours may
reach it (outside attack 35: a claim's rerun killed an application's session so)."""

from __future__ import annotations

import time

import MySQLdb
from conftest import wait_until

from notifyq.produce.producer import Producer
from notifyq.store import queries
from notifyq.store.db import Session


def _connect(dsn):
    return MySQLdb.connect(**dsn.connect_args(0), autocommit=True, connect_timeout=5)


def _uptime_s(dsn) -> int:
    conn = _connect(dsn)
    try:
        conn.query("SHOW GLOBAL STATUS LIKE 'Uptime'")
        return int(conn.store_result().fetch_row()[0][1])
    finally:
        conn.close()


def _take_id(dsn, wanted: int, tries: int = 200):
    """An application's session on id `wanted` of a server just started (ids are handed out in
    order: open and close sessions until one gets it)."""
    for _ in range(tries):
        conn = _connect(dsn)
        got = conn.thread_id()
        if got == wanted:
            return conn
        conn.close()
        if got > wanted:
            break
    raise AssertionError(f"no session got id {wanted} after the restart")


def test_a_claim_first_sent_after_a_restart_on_a_connection_from_before_it_kills_no_application_session(
        server, fdb):
    # Given a session of ours, idle on a connection the server gave an id past its first ones
    for _ in range(30):
        _connect(fdb.dsn).close()
    # (of a server up a few seconds: Uptime counts whole seconds, so the readings of two runs
    # of the server tell them apart only when they start more than a second apart)
    wait_until(lambda: _uptime_s(fdb.dsn) >= 3, 30, message="the server up 3 s")
    session = Session(fdb.dsn, name="work", retry_s=30)
    try:
        session.run(lambda cur: cur.execute("SELECT 1"), what="t")
        old_id = session.connection_id
        # When the server crashes and is back at once (the connection answered moments before),
        # and an application's session (of the same user) gets that id
        server.kill()
        server.start()
        app = _take_id(fdb.dsn, old_id)
        # and our next claim, once the new server has been up a while (the session idled through
        # the restart: a busy consumer's claim comes at once, an idle one's any time later),
        wait_until(lambda: _uptime_s(fdb.dsn) >= 2, 30, message="the server up 2 s")
        # is sent on the connection from before, fails, and reruns on a new one
        queries.claim(session, "q", "owner-1", 1, 60)
        assert session.connection_id != old_id
        # Then the application's session lives on: our id from before the restart was not ours to KILL
        app.query("SELECT 1")
        app.store_result()
        app.close()
    finally:
        session.close()


def test_a_claim_retaken_after_a_restart_kills_no_application_session_on_its_connections_old_id(server, fdb):
    # Given a claim of ours, committed, made on a connection the server gave an id past its
    # first ones, of a server up a few seconds (its run tells apart from the next one's)
    for _ in range(30):
        _connect(fdb.dsn).close()
    wait_until(lambda: _uptime_s(fdb.dsn) >= 3, 30, message="the server up 3 s")
    cfg = fdb.config()
    with Producer("q", cfg) as p:
        p.put({"n": 1})
    session = Session(fdb.dsn, name="work", retry_s=30)
    try:
        claim = queries.claim(session, "q", "owner-1", 1, 60)
        session.run(lambda cur: cur.execute("SELECT 1"), what="t")  # its COMMIT read: it is ours
        old_id, old_run = session.connection_id, session.server_run
        # When the server crashes and is back at once, right after the claim was sent (its
        # COMMIT's reply lost: the worker's retake follows), an application's session gets the
        # claim connection's id, and the session has reconnected to the new server
        sent_at = time.monotonic()
        server.kill()
        server.start()
        app = _take_id(fdb.dsn, old_id)
        session.run(lambda cur: cur.execute("SELECT 1"), what="t")
        assert session.connection_id != old_id
        held = queries.retake(session, claim.jobs, claim.token, "owner-1", 60, old_id, sent_at, old_run)
        # Then the claim holds its job, and the application's session lives on: the server's
        # run the claim's connection was of tells the restart, and its id was not ours to KILL
        assert held == [claim.jobs[0].id]
        app.query("SELECT 1")
        app.store_result()
        app.close()
    finally:
        session.close()
