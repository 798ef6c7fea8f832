"""`notifyq web`: the status pages over HTTP, on the standard library's threading server.

    GET  /             every queue: depth by state, done/dead per minute, oldest ready, paused
    GET  /consumers    each consumer process: host, pid, queues, jobs in hand, last beat; with
                       ?locks=1 who holds and who waits on the advisory locks (performance_schema)
    GET  /running      what runs now, per consumer: job, task, since when, lease; cancel
    GET  /history      a queue's attempts per minute and percentiles, per task (?queue= &hours= &task=)
    GET  /jobs         one state's jobs (?queue= &state= &dedup= &limit= &shard=), a bounded
                       payload search (&q= &task= &since_hours=), bulk retry / cancel / purge
    GET  /jobs/ID      one job (?shard= with [shards]): payload, last error, times, attempts
    GET  /dead         the dead jobs, with retry / purge
    GET  /periodic     periodic entries: last and next tick, the leader's session; run now,
                       enable / disable
    GET  /flow         flow-controlled queues: limits, rates, fairness (this config's and what the
                       live consumers apply), running and ready jobs;
                       ?queue=NAME its keys: running, ready, held and why (&after=KEY: next keys)
    GET  /workflow     ?job=ID (&shard=): the workflow around a job, its members by level
    GET  /login        sign in with the actions token (only when actions are enabled)
    POST /login /logout /act     forms; /act: retry, cancel, purge, pause, resume, retry-dead,
                       bulk-retry / bulk-cancel / bulk-purge (ids=, at most console.MAX_BULK),
                       periodic-run / periodic-enable / periodic-disable (queue=, name=)

Every page is whole without JavaScript; static/live.js refreshes the parts marked data-live
in place. Responses forbid inline scripts (Content-Security-Policy) as a second line behind
the templates' escaping.
"""

from __future__ import annotations

import functools
import http.cookies
import importlib.resources
import logging
import re
import signal
import sys
import threading
import types
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from notifyq import errors
from notifyq.config import Config
from notifyq.store.driver import DriverError, describe
from notifyq.web import auth, bounds, console, data, flow, views, workflow

log = logging.getLogger("notifyq.web")

REFRESH_S = 2
MAX_FORM_BYTES = 16 * 1024
MAX_FLASH = 1000
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
STATIC = {"live.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
_JOB_PATH = re.compile(r"^/jobs/([0-9]{1,19})$")  # ASCII digits: \d takes any script's
VERBS = ("retry", "cancel", "purge", "pause", "resume", "retry-dead")
BULK_VERBS = ("bulk-retry", "bulk-cancel", "bulk-purge")
PERIODIC_VERBS = ("periodic-run", "periodic-enable", "periodic-disable")
MAX_QUERY_FIELDS = 20  # a page takes a handful
MAX_FORM_FIELDS = 1000  # more is refused whole; a bulk action's own bound (console.MAX_BULK) is checked after


class Site:
    """What a request is answered from: the readers, who may act, and one-time messages. One per
    `notifyq web`, or per consumer process serving the pages on its metrics port (mount)."""

    def __init__(self, config: Config, token: str | None, loopback: bool, reader: data.Reader | None = None):
        views.environment()  # Jinja2 missing: one clear error before listening
        self.guard = auth.Guard(token)
        self.reader = reader or data.Reader(config)
        self.loopback = loopback
        self._flash: dict[str, str] = {}
        self._flash_lock = threading.Lock()

    def flash(self, sid: str, message: str | None = None) -> str | None:
        """Set (message given) or take the one-time message shown to this browser."""
        with self._flash_lock:
            if message is None:
                return self._flash.pop(sid, None)
            while len(self._flash) >= MAX_FLASH:
                self._flash.pop(next(iter(self._flash)))
            self._flash[sid] = message
            return None

    def close(self) -> None:
        self.reader.close()


class WebServer:
    """The pages of one config's servers, served by a ThreadingHTTPServer with bounds
    (bounds.py: requests at once, time to send a request, blocked writes)."""

    def __init__(self, config: Config, addr: tuple[str, int], token: str | None, reader: data.Reader | None = None):
        self.site = Site(config, token, auth.loopback(addr[0]), reader)
        server_class = bounds.BoundedHTTPServer6 if ":" in addr[0] else bounds.BoundedHTTPServer
        try:
            self.httpd = server_class(addr, Handler)
        except (OSError, OverflowError) as e:
            self.site.close()
            why = getattr(e, "strerror", None) or str(e)
            raise errors.ConfigError(f"--bind {addr[0]} --port {addr[1]}: cannot listen: {why}") from None
        self.httpd.web = self.site  # type: ignore[attr-defined]  # how a request finds its site

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{f'[{host}]' if ':' in str(host) else host}:{port}/"

    def start(self) -> "WebServer":
        threading.Thread(target=self.httpd.serve_forever, name="notifyq-web", daemon=True).start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.site.close()


def mount(config: Config, addr: str) -> Callable[[Any], None]:
    """The pages, read-only, for another server of the standard library's (the consumer's
    metrics endpoint, consumer.metrics_pages): answer(request) takes over a GET it was handed,
    as if it had come here; answer.close() closes the sessions."""
    site = Site(config, None, auth.loopback(addr))
    handler_class, server = Handler, types.SimpleNamespace(web=site)

    def answer(request: Any) -> None:
        ours = object.__new__(handler_class)
        ours.__dict__.update(request.__dict__)  # the parsed request, its socket files
        ours.server = server
        ours.do_GET()

    answer.close = site.close  # type: ignore[attr-defined]
    return answer


def serve(config: Config, port: int = 0, bind: str = "127.0.0.1", token: str | None = None) -> WebServer:
    """Check every shard's schema, then listen on a daemon thread (port 0: a free one)."""
    reader = data.Reader(config)
    try:
        reader.check()
    except BaseException:
        reader.close()
        raise
    return WebServer(config, (bind, port), token, reader).start()


@functools.cache
def _static(name: str) -> bytes:
    return importlib.resources.files("notifyq.web").joinpath("static", name).read_bytes()


class Handler(BaseHTTPRequestHandler):
    server_version = "notifyq-web"
    sys_version = ""
    timeout = bounds.IO_TIMEOUT_S  # each read and write of the socket (StreamRequestHandler.setup)

    # ------------------------------------------------------------ plumbing

    @property
    def web(self) -> Site:
        return self.server.web  # type: ignore[attr-defined]

    def setup(self) -> None:
        """The request is read from what the dispatcher received (bounds.py): a handler never
        waits for a client to send."""
        super().setup()
        received = getattr(self.server, "received", None)  # not on a consumer's metrics port
        if received is not None:
            self.rfile = bounds.reader(received(self.request), self.rfile)

    def _accepted_at(self) -> float | None:
        """When this connection was accepted (monotonic): a page's time counts from there, the
        time it waited for a handler (at most bounds.QUEUE_S) included (deadline.py)."""
        accepted_at = getattr(self.server, "accepted_at", None)  # not on a consumer's metrics port
        return accepted_at(self.request) if accepted_at is not None else None

    def _session(self) -> tuple[str, bool]:
        """This browser's session id, and whether it is new (a cookie to set)."""
        cookie = http.cookies.SimpleCookie()
        try:
            cookie.load(self.headers.get("Cookie", ""))
        except http.cookies.CookieError:
            pass
        sid = cookie[auth.COOKIE].value if auth.COOKIE in cookie else None
        if auth.Guard.valid_session(sid):
            return sid or "", False
        return auth.Guard.new_session(), True

    def _send(self, code: int, body: bytes, content_type: str = "text/html; charset=utf-8",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in {**SECURITY_HEADERS, **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _cookie(self, sid: str) -> dict[str, str]:
        return {"Set-Cookie": f"{auth.COOKIE}={sid}; HttpOnly; SameSite=Strict; Path=/"}

    def _page(self, code: int, template: str, sid: str, new: bool, headers: dict[str, str] | None = None,
              **context: Any) -> None:
        """A page; one that a server did not answer for (context's down) is a 503, its body the
        page with what the others answered and the error: monitoring sees the outage, as it
        does on the pages that read one server (a job, a workflow)."""
        if code == 200 and context.get("down"):
            code = 503
        guard = self.web.guard
        body = views.render(template, path=self.path, actions=guard.actions, who=guard.who(sid),
                            csrf=guard.csrf(sid), flash=self.web.flash(sid), refresh_s=REFRESH_S,
                            sharded=self.web.reader.sharded, **context)
        self._send(code, body, headers={**(self._cookie(sid) if new else {}), **(headers or {})})

    def _message(self, code: int, text: str, sid: str, new: bool, headers: dict[str, str] | None = None) -> None:
        self._page(code, "message.html", sid, new, headers, title="refused" if code == 403 else "error",
                   message=text, status=code)

    def _redirect(self, to: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(303)
        self.send_header("Location", to)
        self.send_header("Content-Length", "0")
        for key, value in {**SECURITY_HEADERS, **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("web request " + format, *args)

    # ------------------------------------------------------------ GET

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def _misdirected(self) -> bool:
        """Refused, on any address: no Host header, an empty one, two, or one that names no host
        (400: what a proxy or a server in front would refuse too); on loopback, a Host that is
        not a loopback name (421)."""
        hosts = self.headers.get_all("Host") or []
        if len(hosts) != 1 or not auth.host_named(hosts[0]):
            self._send(400, b"bad request: one Host header naming this server is required\n",
                       "text/plain; charset=utf-8")
            return True
        if auth.host_ok(self.web.loopback, hosts[0]):
            return False
        self._send(421, b"misdirected: this server answers to its loopback address only\n",
                   "text/plain; charset=utf-8")
        return True

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self._misdirected():
            return
        parts = urllib.parse.urlsplit(self.path)
        path = parts.path
        if path.startswith("/static/") and path[8:] in STATIC:
            self._send(200, _static(path[8:]), STATIC[path[8:]], {"Cache-Control": "max-age=300"})
            return
        sid, new = self._session()
        reader = self.web.reader
        try:
            with reader.page(started=self._accepted_at()):
                self._get_page(path, parts.query, sid, new)
        except errors.InputError as e:
            self._message(400, str(e), sid, new)
        except data.Busy as e:  # every session in use: as a request no handler took (bounds.py)
            self._message(503, f"database: {e}", sid, new, {"Retry-After": str(bounds.RETRY_AFTER_S)})
        except errors.NotifyqError as e:
            self._message(503, f"database: {e}", sid, new)
        except DriverError as e:
            self._message(503, f"database: {describe(e)}", sid, new)
        except Exception:  # a bug: logged with its traceback, the browser gets a page
            log.exception("web: page %s failed", path)
            self._send(500, b"internal error: see the notifyq web log\n", "text/plain; charset=utf-8")

    def _get_page(self, path: str, query_string: str, sid: str, new: bool) -> None:
        """The page at `path`, in the time of one page (data.Reader.page); errors are do_GET's."""
        reader = self.web.reader
        query = _query(query_string)
        if path == "/":
            self._page(200, "overview.html", sid, new, title="queues",
                       **data.overview(reader, data.parse_after(query)))
        elif path == "/consumers":
            self._page(200, "consumers.html", sid, new, title="consumers",
                       **data.consumers(reader, locks=query.get("locks") == "1"))
        elif path == "/running":
            self._page(200, "running.html", sid, new, title="running now", **console.running(reader))
        elif path == "/history":
            self._page(200, "history.html", sid, new, title="history",
                       **console.history(reader, console.parse_history(query)))
        elif path == "/jobs" and "id" in query:  # the page's "job id" box: to that job's page
            job_id = data.parse_job_id(query["id"].strip() or query["id"])  # blanks: refused as given
            shard = query.get("shard")
            if shard and shard not in reader.names:
                raise errors.InputError(f"no shard {shard!r}")
            self._redirect(f"/jobs/{job_id}" + (f"?shard={urllib.parse.quote(shard)}" if shard else ""))
        elif path in ("/jobs", "/dead"):
            if path == "/dead":
                query["state"] = "dead"
            filters = data.parse_filters(query, reader.names)
            search = console.parse_search(query)
            found = (console.search(reader, filters, search) if search["text"] or search["task"]
                     else {**data.jobs(reader, filters), "search": search})
            self._page(200, "jobs.html", sid, new, title="dead jobs" if path == "/dead" else "jobs",
                       queues=self._queue_names(), states=data.STATES, dead_page=path == "/dead",
                       max_bulk=console.MAX_BULK, **found)
        elif _JOB_PATH.match(path):
            self._job_page(data.parse_job_id(path[6:]), query, sid, new)
        elif path == "/flow":
            name, after = flow.parse(query)
            if name is None:
                self._page(200, "flow.html", sid, new, title="flow control", **flow.queues(reader))
            else:
                self._page(200, "flow_queue.html", sid, new, title=f"flow control: {name}",
                           **flow.queue(reader, name, after))
        elif path == "/workflow":
            self._workflow_page(query, sid, new)
        elif path == "/periodic":
            self._page(200, "periodic.html", sid, new, title="periodic", **data.periodic(reader))
        elif path == "/login" and self.web.guard.actions:
            self._page(200, "login.html", sid, new, title="sign in", back=auth.safe_back(query.get("back")),
                       failed=False)
        else:
            self._message(404, f"no page {path}", sid, new)

    def _queue_names(self) -> list[str]:
        answers, _down = self.web.reader.each(lambda session: [r[0] for r in data.admin_queries.queue_rows(session)])
        return sorted({q for names in answers.values() for q in names})

    def _job_page(self, job_id: int, query: dict[str, str], sid: str, new: bool) -> None:
        shards = self.web.reader.names
        shard = query.get("shard", shards[0])
        if shard not in shards:
            raise errors.InputError(f"no shard {shard!r}")
        try:
            job = data.job(self.web.reader, shard, job_id)
        except errors.InputError as e:
            self._message(404, str(e), sid, new)
            return
        self._page(200, "job.html", sid, new, title=f"job {job_id}", job=job)

    def _workflow_page(self, query: dict[str, str], sid: str, new: bool) -> None:
        shards = self.web.reader.names
        shard = query.get("shard", shards[0])
        if shard not in shards:
            raise errors.InputError(f"no shard {shard!r}")
        job_id = _job_id(query.get("job", "").strip())
        if job_id is None:
            raise errors.InputError("which job? (/workflow?job=ID)")
        found = self.web.reader.one(shard, lambda session: workflow.walk(session, job_id))
        self._page(200, "workflow.html", sid, new, title=f"workflow of job {job_id}", shard=shard, **found)

    # ------------------------------------------------------------ POST

    def do_POST(self) -> None:  # noqa: N802
        if self._misdirected():
            return
        sid, new = self._session()
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_FORM_BYTES:
            self._message(413, "form too large", sid, new)
            return
        try:
            fields = urllib.parse.parse_qs(self.rfile.read(length).decode("utf-8", "replace"),
                                           max_num_fields=MAX_FORM_FIELDS)
        except ValueError:
            self._message(413, f"form refused: more than {MAX_FORM_FIELDS} fields", sid, new)
            return
        form = {k: v[-1] for k, v in fields.items()}
        path = urllib.parse.urlsplit(self.path).path
        guard = self.web.guard
        if not guard.actions:
            self._message(403, "read-only: actions are off (start notifyq web with --actions-token-file "
                          "or NOTIFYQ_WEB_TOKEN to enable them)", sid, new)
            return
        bearer = self.headers.get("Authorization", "")
        by_token = path == "/act" and bearer.startswith("Bearer ") and guard.token_ok(bearer[7:])
        if not by_token and not guard.csrf_ok(None if new else sid, form.get("csrf")):
            log.warning("web: form refused (CSRF token missing or wrong) path=%s addr=%s", path, self.client_address[0])
            self._message(403, "refused: this form does not carry this browser's CSRF token "
                          "(reload the page and try again)", sid, new)
            return
        if path == "/login":
            self._login(form, sid)
        elif path == "/logout":
            guard.sign_out(sid)
            self._redirect("/")
        elif path == "/act":
            who = "token" if by_token else guard.who(sid)
            if who is None:
                self._message(403, "refused: sign in with the actions token first", sid, new)
                return
            self._act(form, fields.get("ids", []), sid, f"{who}@{self.client_address[0]}", by_token)
        else:
            self._message(404, f"no form {path}", sid, new)

    def _login(self, form: dict[str, str], sid: str) -> None:
        back = auth.safe_back(form.get("back"))
        new_sid = self.web.guard.sign_in(form.get("token", ""), form.get("who", "").strip())
        if new_sid is None:
            log.warning("web: sign-in refused addr=%s", self.client_address[0])
            self._page(403, "login.html", sid, False, title="sign in", back=back, failed=True)
            return
        log.warning("web: signed in who=%s addr=%s", form.get("who", "").strip(), self.client_address[0])
        self._redirect(back, self._cookie(new_sid))

    def _act(self, form: dict[str, str], ids: list[str], sid: str, who: str, by_token: bool) -> None:
        verb, queue, shard = form.get("verb", ""), form.get("queue") or None, form.get("shard", "")
        what = f"job={form.get('job') or '-'}"
        try:
            if verb in BULK_VERBS:
                what = f"ids={','.join(ids[:console.MAX_BULK])}" + ("…" if len(ids) > console.MAX_BULK else "")
                unique = console.parse_ids(ids)
                outcome, complete = console.act_bulk(self.web.reader, verb[5:], shard=shard, ids=unique, by=who,
                                                     duplicates=len(ids) - len(unique))
                if not complete:  # stopped midway by the database: what was done stays done, and is said
                    raise _Partial(outcome)
            elif verb in PERIODIC_VERBS:
                what = f"name={form.get('name', '')!r}"
                outcome = console.periodic_act(self.web.reader, verb, queue=queue or "", name=form.get("name", ""))
            elif verb in VERBS:
                job_id = _job_id(form.get("job"))
                outcome = data.act(self.web.reader, verb, shard=shard, job_id=job_id, queue=queue, by=who)
            else:
                raise errors.InputError(f"no action {verb!r}")
        except _Partial as e:
            outcome, code = str(e), 503
        except (errors.NotifyqError, DriverError) as e:
            outcome = f"{verb} refused: {describe(e) if isinstance(e, DriverError) else e}"
            code = 400 if isinstance(e, errors.InputError) else 503
        else:
            code = 200
        log.warning("web action who=%s action=%s %s queue=%s shard=%s outcome=%s", who, verb,
                    what, queue or "-", shard or "-", outcome)
        if by_token:
            self._send(code, (outcome + "\n").encode(), "text/plain; charset=utf-8")
            return
        self.web.flash(sid, outcome)
        self._redirect(auth.safe_back(form.get("back")))


class _Partial(Exception):
    """A bulk action stopped midway by a database failure: its outcome (some were done)."""


def _query(text: str) -> dict[str, str]:
    """A GET's query string, each field's last value (an empty one is absent); more than
    MAX_QUERY_FIELDS fields is one InputError (parse_qs's own ValueError dropped the connection)."""
    try:
        fields = urllib.parse.parse_qs(text, max_num_fields=MAX_QUERY_FIELDS)
    except ValueError:
        raise errors.InputError(f"more than {MAX_QUERY_FIELDS} query fields") from None
    return {k: v[-1] for k, v in fields.items()}


def _job_id(text: str | None) -> int | None:
    """A job id from a request (data.parse_job_id), None when none was given."""
    return data.parse_job_id(text) if text else None


def run(config: Config, port: int, bind: str, token: str | None) -> int:
    """`notifyq web`: serve until SIGTERM or SIGINT; the exit code."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())  # the handler only sets the event
    web = serve(config, port, bind, token)
    mode = "actions enabled for signed-in users" if token else "read-only"
    log.info("web pages listening url=%s mode=%s", web.url, mode)
    print(f"notifyq web: {web.url} ({mode})", file=sys.stderr, flush=True)
    try:
        stop.wait()
    finally:
        web.close()
    return errors.EXIT_OK
