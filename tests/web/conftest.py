"""The status pages' fixtures: a private `notifyq web` server in this process (on a free port of
127.0.0.1, against the test's database), dead jobs made by a real consumer, and a headless
Chromium driven by Playwright (Debian's package; the browser tests skip with one line without it)."""

from __future__ import annotations

import dataclasses
import http.cookiejar
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import run_cli
from notifyq.web import server

TOKEN = "test-actions-token-0123456789"
# The docs' screenshots are refreshed on request only (NOTIFYQ_SCREENSHOTS_DIR=docs/img): a test
# run must leave the checkout as it found it.
IMG = Path(os.environ["NOTIFYQ_SCREENSHOTS_DIR"]) if os.environ.get("NOTIFYQ_SCREENSHOTS_DIR") else None


@pytest.fixture
def web(db):
    """start(token=None, bind="127.0.0.1", sources=None) -> a started WebServer; every one is
    closed at the end of the test. sources: the config files its config names as read (the
    test's config reads none)."""
    started = []

    def start(token: str | None = None, bind: str = "127.0.0.1", sources: tuple[str, ...] | None = None, **config):
        made = db.config(**config)
        if sources is not None:
            made = dataclasses.replace(made, sources=sources)
        started.append(server.serve(made, 0, bind, token))
        return started[-1]

    yield start
    for w in started:
        w.close()


def produce(db, queue: str, *payloads: str, flags: tuple[str, ...] = ()) -> list[int]:
    r = run_cli(db.env, "produce", "-q", queue, *flags, *payloads)
    assert r.returncode == 0, r.stderr
    return [int(line) for line in r.stdout.split()]


def dead_job(db, queue: str = "mail", payload: str = '{"to": "a@example.com"}') -> int:
    """A job a real consumer ran once and buried: its handler raised an error with markup."""
    (job_id,) = produce(db, queue, payload, flags=("--max-attempts", "1"))
    r = run_cli(db.env, "consume", "-q", queue, "--handler", "nqweb:fail_with_markup", "--exit-when-empty")
    assert r.returncode == 0, r.stderr
    assert db.scalar("SELECT status FROM nq_job WHERE id = %s", (job_id,)) == 4
    return job_id


class Client:
    """A browser without a browser: cookies kept, redirects not followed, errors returned."""

    def __init__(self, base: str):
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect)

    def request(self, path: str, form: dict | None = None, headers: dict | None = None) -> tuple[int, str, dict]:
        body = None if form is None else urllib.parse.urlencode(form).encode()
        req = urllib.request.Request(self.base.rstrip("/") + path, data=body, headers=headers or {})
        try:
            with self.opener.open(req, timeout=30) as r:
                return r.status, r.read().decode(), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), dict(e.headers)

    def get(self, path: str) -> tuple[int, str]:
        code, body, _ = self.request(path)
        return code, body

    def post(self, path: str, form: dict, headers: dict | None = None) -> tuple[int, str, dict]:
        return self.request(path, form, headers)

    def csrf(self, path: str = "/") -> str:
        code, body = self.get(path)
        return re.search(r'name="csrf" value="([0-9a-f]+)"', body).group(1)

    def sign_in(self, who: str = "alice", token: str = TOKEN) -> int:
        code, body = self.get("/login")
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', body).group(1)
        return self.post("/login", {"csrf": csrf, "who": who, "token": token, "back": "/"})[0]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def chromium_or_skip(module_level: bool = False) -> str:
    """Debian's chromium for Playwright to drive, or skip: the test, or the whole module (one line
    for it, called at its top, before it imports Playwright) when `module_level`."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("browser tests skipped: Playwright is not installed (pip install -e '.[test]')",
                    allow_module_level=module_level)
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("browser tests skipped: no chromium on PATH (Debian: apt-get install chromium; "
                    "scripts/bootstrap.sh installs it as root)", allow_module_level=module_level)
    return exe


@pytest.fixture(scope="module")  # not the session: Playwright's event loop runs in this thread
def browser():  # until it stops, and a later module's asyncio.run() would refuse to start
    exe = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    yield context.new_page()
    context.close()


def screenshot(page, name: str) -> Path:
    """The page as a PNG: into $NOTIFYQ_SCREENSHOTS_DIR when set (docs/img), else a temporary file."""
    directory = IMG or Path(tempfile.gettempdir()) / "notifyq-screenshots"  # overwritten by the next run
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    page.screenshot(path=str(path), full_page=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return path
