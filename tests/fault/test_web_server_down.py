"""`notifyq web` with its database server frozen (SIGSTOP) or stopped: every page is a 503 within
the 15 s docs/web.md promises, however many reads it makes and however many requests come at
once, and the pages answer again once the server is back."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from conftest import wait_until
from web.conftest import Client

PAGES = ("/jobs", "/dead", "/history?queue=mail")  # two reads each: the list, then the queue names
BOUND_S = 15.0  # docs/web.md, "Limits"


def _url(proc) -> str | None:
    m = re.search(r"notifyq web: (http://\S+)", proc.stderr_text())
    return m.group(1) if m else None


def _timed(c: Client, paths: tuple[str, ...]) -> dict[str, tuple[int, float, str]]:
    """Each page fetched at once, in threads: (status, seconds, body) by path."""
    out: dict[str, tuple[int, float, str]] = {}

    def fetch(path: str) -> None:
        started = time.monotonic()
        code, body = c.get(path)
        out[path] = (code, time.monotonic() - started, body)

    threads = [threading.Thread(target=fetch, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return out


def test_with_the_server_frozen_then_stopped_every_page_is_a_503_within_15_s(server, fdb, procs):
    # Given `notifyq web` (the default 5 s connect retry, 15 s read timeout) whose session has read a page
    proc = procs.start(fdb.env, "web", "--port", "0")
    url = wait_until(lambda: _url(proc), timeout=30, message="notifyq web listening")
    c = Client(url)
    assert c.get("/jobs")[0] == 200
    pid = int(Path(server.basedir, "mysqld.pid").read_text())
    # When the server is frozen (it accepts connections and answers nothing)
    os.kill(pid, signal.SIGSTOP)
    try:
        frozen = _timed(c, PAGES)
    finally:
        os.kill(pid, signal.SIGCONT)
    # Then each page is a 503 within the bound: its read on the session that was connected was
    # cut at the page's deadline, and the page's second read did not ask the server again (the
    # first page took 15 s for its statement and 5 s more to reconnect for its second: 20 s)
    for path, (code, took, body) in frozen.items():
        assert code == 503 and took < BOUND_S, (path, code, round(took, 2), body[-400:])
    assert any("did not answer within the page" in body for _code, _took, body in frozen.values()), frozen
    # And once it runs again, the pages answer (the cut session reconnects)
    wait_until(lambda: all(c.get(p)[0] == 200 for p in PAGES), timeout=30, message="the pages answered again")
    # When the server is stopped (connections refused at once, retried for 5 s)
    server.stop()
    stopped = _timed(c, PAGES)
    # Then each page is a 503 within the bound too, naming the server it could not reach
    for path, (code, took, body) in stopped.items():
        assert code == 503 and took < BOUND_S, (path, code, round(took, 2), body[-400:])
        assert "cannot reach the database server" in body or "did not answer" in body, (path, body[-400:])


CROWD = 24  # three times the requests served at once (bounds.HANDLERS)


def _crowd(url: str, n: int) -> list[tuple[int | str, float, dict]]:
    """n GETs of / at once, each on its own connection: (status, or the error that ended it
    unanswered; seconds from its connect; headers)."""
    out: list[tuple[int | str, float, dict]] = []
    lock = threading.Lock()

    def fetch() -> None:
        started = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                got: tuple[int | str, dict] = (r.status, dict(r.headers))
                r.read()
        except urllib.error.HTTPError as e:
            got = (e.code, dict(e.headers))
            e.read()
        except OSError as e:  # closed unanswered (RemoteDisconnected, a reset), or no answer in 60 s
            got = (f"{type(e).__name__}: {e}", {})
        with lock:
            out.append((got[0], time.monotonic() - started, got[1]))

    threads = [threading.Thread(target=fetch) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return out


def test_with_the_server_frozen_24_requests_at_once_are_each_answered_within_15_s(server, fdb, procs):
    # Given `notifyq web` (8 requests served at once, 3 database sessions) whose sessions have read a page
    proc = procs.start(fdb.env, "web", "--port", "0")
    url = wait_until(lambda: _url(proc), timeout=30, message="notifyq web listening")
    assert _crowd(url, 3)[0][0] == 200
    pid = int(Path(server.basedir, "mysqld.pid").read_text())
    # When the server is frozen and 24 pages are asked for at once
    os.kill(pid, signal.SIGSTOP)
    try:
        answers = _crowd(url, CROWD)
    finally:
        os.kill(pid, signal.SIGCONT)
    # Then every one is answered, a 503, within the bound from its connect: those no handler
    # took within 5 s are told the pages are busy and when to come back (before, 8 handlers
    # each held a page up to 14 s, and the connections still waiting at 10 s were closed unanswered)
    assert len(answers) == CROWD
    summary = sorted((str(code)[:60], round(took, 1)) for code, took, _ in answers)
    for code, took, _headers in answers:
        assert code == 503 and took < BOUND_S, summary
    # And those told the pages are busy (no handler, or no database session free) are told
    # when to come back: all but the few whose reads held the sessions until their deadline
    busy = [h for code, _took, h in answers if "Retry-After" in h]
    assert len(busy) >= CROWD // 2 and all(h["Retry-After"] == "5" for h in busy), summary
    # And once the server runs again, the pages answer
    wait_until(lambda: _crowd(url, 1)[0][0] == 200, timeout=30, message="the pages answered again")
