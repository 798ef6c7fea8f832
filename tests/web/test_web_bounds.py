"""The status pages' bounds: silent connections are closed and never hold more than the
handlers, a page stuck in the database leaves the others a session, a request finds the pages
busy rather than waiting for ever, and the overview's statements do not grow with the queues."""

from __future__ import annotations

import re
import socket
import threading
import time
import urllib.parse

from conftest import admin_connect, wait_until
from number_rows import numbers
from web.conftest import Client

from notifyq.web import bounds, data


def _com_select(db) -> int:
    return int(db.query("SHOW GLOBAL STATUS LIKE 'Com_select'")[0][1])


def _statements_of_one_overview(db, c: Client) -> int:
    before = _com_select(db)
    code, body = c.get("/")
    assert code == 200, body
    return _com_select(db) - before


def test_the_overviews_statements_do_not_grow_with_the_queues_and_a_page_lists_a_bounded_number(db, web):
    # Given 3 queues with a job each
    db.query(f"INSERT INTO nq_queue (queue) SELECT CONCAT('q', LPAD(seq, 4, '0')) FROM {numbers(3)}")
    db.query("INSERT INTO nq_job (queue, status, run_at, max_attempts, payload) "
             f"SELECT CONCAT('q', LPAD(seq, 4, '0')), 0, UTC_TIMESTAMP(6), 5, '{{}}' FROM {numbers(3)}")
    c = Client(web().url)
    c.get("/")  # the session connects
    few = _statements_of_one_overview(db, c)
    # When there are 250 queues
    db.query(f"INSERT INTO nq_queue (queue) SELECT CONCAT('q', LPAD(seq, 4, '0')) FROM {numbers(250, 4)}")
    many = _statements_of_one_overview(db, c)
    # Then the overview costs the server as many statements as with 3 (3 more per queue before)
    assert many == few, (few, many)
    # And a page lists the first 100 queues, linking to the next ones, which list the rest in turn
    seen, path = [], "/"
    while path:
        body = c.get(path)[1]
        names = re.findall(r'<tr data-queue="(q\d{4})">', body)
        assert 0 < len(names) <= data.PAGE_QUEUES
        seen += names
        after = re.search(r'href="/\?after=(q\d{4})" rel="next"', body)
        path = f"/?after={urllib.parse.quote(after.group(1))}" if after else None
    assert seen == [f"q{i:04d}" for i in range(1, 251)]
    # And a malformed page name is one clear error
    assert c.get("/?after=no%20such%20name")[0] == 400


def test_silent_connections_hold_no_thread_and_are_closed_at_their_deadline(db, web):
    # Given the pages, whose connections must send their request within 3 s
    w = web()
    w.httpd.request_s = 3.0
    host, port = w.httpd.server_address[:2]
    threads = threading.active_count()
    # When 3 times as many connections as handlers open and send nothing
    silent = [socket.create_connection((host, port), timeout=30) for _ in range(3 * bounds.HANDLERS)]
    opened = time.monotonic()
    try:
        # Then a page is answered meanwhile, before their deadline, and they hold no thread
        assert Client(w.url).get("/consumers")[0] == 200
        assert time.monotonic() - opened < w.httpd.request_s
        assert threading.active_count() - threads <= 1, threading.active_count() - threads
        # And the server closes every one of them at its deadline (each held a thread for ever before)
        wait_until(lambda: all(_closed_by_server(s) for s in silent), timeout=30, interval=0.05,
                   message="the silent connections closed by the server")
        assert time.monotonic() - opened >= w.httpd.request_s - 0.5
    finally:
        for s in silent:
            s.close()
    # And a connection that trickles its request, a header line every 0.2 s, is closed at its deadline too
    trickle = socket.create_connection((host, port), timeout=30)
    try:
        trickle.sendall(b"GET / HTTP/1.0\r\n")
        opened = time.monotonic()
        wait_until(lambda: _trickled_until_closed(trickle), timeout=30, interval=0.2,
                   message="the trickling connection closed by the server")
        assert time.monotonic() - opened >= w.httpd.request_s - 0.5
    finally:
        trickle.close()


def test_connections_trickling_their_headers_hold_no_handler(db, web):
    # Given the pages, whose connections may take 60 s to send their request here
    w = web()
    w.httpd.request_s = 60.0
    host, port = w.httpd.server_address[:2]
    stop = threading.Event()
    slow = [socket.create_connection((host, port), timeout=30) for _ in range(bounds.HANDLERS)]

    def trickle(s: socket.socket) -> None:
        try:
            s.sendall(b"GET / HTTP/1.0\r\n")
            while not stop.wait(0.3):  # the client's pace, not a wait on the server
                s.sendall(b"X-Slow: 1\r\n")
        except OSError:
            pass

    threads = [threading.Thread(target=trickle, args=(s,), daemon=True) for s in slow]
    for t in threads:
        t.start()
    try:
        # When as many connections as handlers trickle a header line at a time, past the time a
        # request may wait for a handler
        started = time.monotonic()
        answers = []
        while time.monotonic() - started < bounds.QUEUE_S + 1:
            answers.append(Client(w.url).get("/consumers")[0])
        # Then every page asked meanwhile is answered (each was 503: the trickling held the handlers)
        assert answers and set(answers) == {200}, answers
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        for s in slow:
            s.close()


def test_past_the_connections_sending_a_request_the_oldest_is_answered_503_not_the_new_one(db, web):
    # Given the pages, with as many idle connections open as may be sending a request
    w = web()
    w.httpd.request_s = 120.0
    host, port = w.httpd.server_address[:2]
    idle = [socket.create_connection((host, port), timeout=30) for _ in range(bounds.WAITING_MAX)]
    try:
        # When 24 clients ask for a page, one after another, then 8 at once (accepted after the
        # idle ones: the server accepts in order)
        answers = [Client(w.url).get("/consumers")[0] for _ in range(24)]
        together: list[int] = []
        clients = [threading.Thread(target=lambda: together.append(Client(w.url).get("/consumers")[0]))
                   for _ in range(8)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(timeout=60)
        answers += together
        # Then each is answered (each was closed with no answer), and the oldest idle connection
        # (the first client took its place; each next one, its predecessor's) is answered 503,
        # saying why, and closed; the others are left to their deadline
        assert answers == [200] * 32, answers
        got = _all_of(idle[0])
        assert got.startswith(b"HTTP/1.0 503 ") and b"Retry-After: " in got, got
        assert f"more than {bounds.WAITING_MAX} connections".encode() in got, got
        assert not any(_closed_by_server(s) for s in idle[9:])  # 8 at once: 8 more out at most
    finally:
        for s in idle:
            s.close()


def test_a_request_head_past_its_bound_is_answered_431_without_a_handler(db, web):
    # Given the pages
    w = web()
    host, port = w.httpd.server_address[:2]
    # When a request's headers run past 64 KiB without their end
    s = socket.create_connection((host, port), timeout=30)
    try:
        s.sendall(b"GET / HTTP/1.0\r\nX-Long: " + b"a" * (bounds.HEAD_MAX + 1024))
        # Then it is answered 431 and closed
        got = _all_of(s)
        assert got.startswith(b"HTTP/1.0 431 "), got[:200]
    finally:
        s.close()


def _all_of(s: socket.socket) -> bytes:
    s.settimeout(30)
    got = b""
    while chunk := s.recv(65536):
        got += chunk
    return got


def _trickled_until_closed(s: socket.socket) -> bool:
    """One more header line; True once the server has closed the connection."""
    try:
        s.sendall(b"X-Slow: 1\r\n")
    except OSError:
        return True  # reset by the server
    return _closed_by_server(s)


def _closed_by_server(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_a_page_stuck_in_the_database_leaves_the_other_pages_a_session(db, web, monkeypatch):
    c = Client(web().url)
    assert c.get("/")[0] == 200
    # Given the queue table locked by another session, so that an overview read waits on it
    lock = admin_connect(db.admin, db.admin.database)
    lock.cursor().execute("LOCK TABLES nq_queue WRITE")
    stuck: list[int] = []
    waiting = [threading.Thread(target=lambda: stuck.append(Client(c.base).get("/")[0]))
               for _ in range(data.SESSIONS - 1)]
    try:
        for t in waiting:
            t.start()
        wait_until(lambda: _waiting_on_the_lock(db) == data.SESSIONS - 1, timeout=30,
                   message="the overviews waiting on the locked table")
        # When the consumers page is read meanwhile
        started = time.monotonic()
        code, body = c.get("/consumers")
        # Then it answers at once from a session of its own (it waited behind the overviews before)
        assert code == 200, body
        assert time.monotonic() - started < data.SESSION_WAIT_S
        # And once every session is taken, a page says the pages are busy instead of waiting
        monkeypatch.setattr(data, "SESSION_WAIT_S", 0.5)
        last = threading.Thread(target=lambda: stuck.append(Client(c.base).get("/")[0]))
        last.start()
        waiting.append(last)
        wait_until(lambda: _waiting_on_the_lock(db) == data.SESSIONS, timeout=30,
                   message="every session waiting on the locked table")
        code, body = c.get("/consumers")
        assert code == 503 and "busy" in body, (code, body)
    finally:
        lock.cursor().execute("UNLOCK TABLES")
        lock.close()
        for t in waiting:
            t.join(timeout=30)
    # And the stuck overviews are answered once the table is free
    assert stuck == [200] * data.SESSIONS


def _waiting_on_the_lock(db) -> int:
    return int(db.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                         "WHERE STATE LIKE 'Waiting for table%%' AND INFO LIKE '%%nq_queue%%'"))


def test_with_shards_a_page_of_queues_holds_each_name_on_every_shard_and_the_next_page_the_rest(db, server_dsn):
    from conftest import RUNTIME_PASSWORD, _url, create_test_db, drop_test_db

    from notifyq import config as config_mod
    from notifyq.web import server

    # Given two shards: odd-numbered queues on a, even ones on b, and queue q0100 on both
    other = create_test_db(server_dsn)
    try:
        db.query(f"INSERT INTO nq_queue (queue) SELECT CONCAT('q', LPAD(seq * 2 - 1, 4, '0')) FROM {numbers(80)}")
        other.query(f"INSERT INTO nq_queue (queue) SELECT CONCAT('q', LPAD(seq * 2, 4, '0')) FROM {numbers(80)}")
        db.query("INSERT INTO nq_queue (queue) VALUES ('q0100')")
        cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null", "NOTIFYQ_PASSWORD": RUNTIME_PASSWORD},
                              overrides={"shards": {"a": _url(db.dsn), "b": _url(other.dsn)}})
        w = server.serve(cfg, 0, "127.0.0.1", None)
        try:
            c = Client(w.url)
            # When the overview is read page by page
            pages, path = [], "/"
            while path:
                body = c.get(path)[1]
                pages.append(re.findall(r'<tr data-queue="(q\d{4})">\s*<td>.*?</td><td>(\w+)</td>', body))
                after = re.search(r'href="/\?after=(q\d{4})" rel="next"', body)
                path = f"/?after={after.group(1)}" if after else None
        finally:
            w.close()
        # Then the first page holds the first 100 names, q0100 with a row on each shard
        assert sorted({name for name, _shard in pages[0]}) == [f"q{i:04d}" for i in range(1, 101)]
        assert ("q0100", "a") in pages[0] and ("q0100", "b") in pages[0]
        # And the next page the other 60, each (name, shard) shown once over the pages
        assert [name for name, _shard in pages[1]] == [f"q{i:04d}" for i in range(101, 161)]
        shown = [row for page in pages for row in page]
        assert len(shown) == len(set(shown)) == 161
    finally:
        drop_test_db(other)
