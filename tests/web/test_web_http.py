"""The status pages over plain HTTP (no browser): read-only by default, CSRF-checked forms,
escaped payloads and errors, no password on any page, the action log, the command's errors."""

from __future__ import annotations

import logging
import re
import signal
import subprocess

from conftest import RUNTIME_PASSWORD, notifyq_cmd, run_cli, wait_until
from number_rows import numbers
from web.conftest import TOKEN, Client, dead_job, produce

PAGES = ("/", "/consumers", "/running", "/history", "/history?queue=mail", "/jobs", "/jobs?queue=mail&q=x",
         "/dead", "/periodic")


def _status(db, job_id: int) -> int:
    return db.scalar("SELECT status FROM nq_job WHERE id = %s", (job_id,))


def test_the_pages_are_read_only_by_default(db, web):
    # Given a dead job and a server started without an actions token
    job = dead_job(db)
    w = web()
    c = Client(w.url)
    # When every page is read
    for path in (*PAGES, f"/jobs/{job}"):
        code, body = c.get(path)
        # Then it answers, with no action form and no sign-in link
        assert code == 200, (path, body)
        assert 'action="/act"' not in body and "/login" not in body and "read-only" in body
    # And a posted action is refused, whatever it carries, and changes nothing
    code, body, _ = c.post("/act", {"verb": "retry", "job": str(job), "csrf": "0" * 64})
    assert code == 403 and "read-only" in body
    code, body, _ = c.post("/act", {"verb": "retry", "job": str(job)}, {"Authorization": f"Bearer {TOKEN}"})
    assert code == 403
    assert c.get("/login")[0] == 404
    assert _status(db, job) == 4


def test_payloads_and_errors_are_shown_as_text(db, web):
    # Given a dead job whose payload and error both hold markup
    job = dead_job(db, payload='{"html": "<script>window.pwned = 1</script><img src=x onerror=alert(1)>"}')
    c = Client(web().url)
    # When its page and the dead list are read
    for path in (f"/jobs/{job}", "/dead", "/jobs?state=dead&queue=mail"):
        code, body = c.get(path)
        assert code == 200
        # Then the markup is escaped, never sent as markup
        assert "<script>window" not in body and "<img src=x" not in body and "<b>refused" not in body
        assert "&lt;b&gt;refused&lt;/b&gt;" in body
    code, body = c.get(f"/jobs/{job}")
    assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in body
    # And even a missed escape could not run: no inline script is allowed
    _, _, headers = c.request("/")
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert "unsafe-inline" not in headers["Content-Security-Policy"]


def test_the_database_password_appears_on_no_page(db, web):
    job = dead_job(db)
    c = Client(web(token=TOKEN).url)
    assert c.sign_in() == 303
    for path in (*PAGES, f"/jobs/{job}", "/jobs?state=dead", "/login"):
        code, body = c.get(path)
        assert RUNTIME_PASSWORD not in body, path


def test_an_action_without_this_browsers_csrf_token_is_refused(db, web):
    # Given a dead job and a signed-in browser on a server with actions enabled
    job = dead_job(db)
    w = web(token=TOKEN)
    c = Client(w.url)
    assert c.sign_in() == 303
    form = {"verb": "retry", "job": str(job), "back": "/dead"}
    # When the form comes without a CSRF token, with a made-up one, or with another browser's
    other = Client(w.url)
    for csrf in (None, "0" * 64, other.csrf()):
        code, body, _ = c.post("/act", {**form, **({"csrf": csrf} if csrf else {})})
        # Then it is refused and the job stays dead
        assert code == 403 and "CSRF" in body
        assert _status(db, job) == 4
    # And with this browser's own token it is done
    code, _, headers = c.post("/act", {**form, "csrf": c.csrf()})
    assert code == 303 and headers["Location"] == "/dead"
    assert _status(db, job) == 0


def test_an_action_needs_a_signed_in_browser_or_the_token(db, web, caplog):
    # Given two dead jobs and a server with actions enabled
    first, second = dead_job(db), dead_job(db)
    c = Client(web(token=TOKEN).url)
    # When a browser that has not signed in posts a well-formed form
    code, body, _ = c.post("/act", {"verb": "retry", "job": str(first), "csrf": c.csrf()})
    # Then it is refused
    assert code == 403 and "sign in" in body and _status(db, first) == 4
    # And a wrong token signs nobody in
    assert c.sign_in(token="wrong-token-wrong-token") == 403
    # And a script with the token retries by bearer header; a wrong one is refused
    code, body, _ = c.post("/act", {"verb": "retry", "job": str(second)}, {"Authorization": "Bearer nope-nope-nope-nope"})
    assert code == 403 and _status(db, second) == 4
    with caplog.at_level(logging.INFO, logger="notifyq.web"):
        code, body, _ = c.post("/act", {"verb": "retry", "job": str(second)}, {"Authorization": f"Bearer {TOKEN}"})
    assert code == 200 and body.strip() == f"job {second}: retried"
    assert _status(db, second) == 0
    # And each action is logged with who and what
    assert any(f"who=token@127.0.0.1 action=retry job={second}" in r.getMessage() for r in caplog.records)


def test_signed_in_actions_are_logged_with_the_name_given(db, web, caplog):
    job = dead_job(db)
    c = Client(web(token=TOKEN).url)
    assert c.sign_in(who="alice") == 303
    with caplog.at_level(logging.INFO, logger="notifyq.web"):
        for verb in ("pause", "resume"):
            assert c.post("/act", {"verb": verb, "queue": "mail", "csrf": c.csrf()})[0] == 303
        assert c.post("/act", {"verb": "purge", "job": str(job), "csrf": c.csrf(), "back": "/dead"})[0] == 303
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("web action")]
    assert [re.search(r"action=(\S+)", line).group(1) for line in lines] == ["pause", "resume", "purge"]
    assert all("who=alice@127.0.0.1" in line for line in lines)
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE id = %s", (job,)) == 0
    # And the outcome is shown once on the next page
    assert f"job {job}: purged" in c.get("/dead")[1]
    assert f"job {job}: purged" not in c.get("/dead")[1]


def test_bad_filters_are_one_clear_error(db, web):
    c = Client(web().url)
    produce(db, "mail", "{}")
    for path, words in (("/jobs?state=lost", "state 'lost'"), ("/jobs?queue=a%20b", "invalid queue name"),
                        ("/jobs?dedup=k", "within a queue"), ("/jobs?limit=0", "limit 0"),
                        ("/jobs?id=x", "expected a job id")):
        code, body = c.get(path)
        assert code == 400 and words in body.replace("&#39;", "'"), (path, body)
    assert c.get("/jobs/99999")[0] == 404


def test_the_command_refuses_bad_input_in_one_line(db, tmp_path):
    short = tmp_path / "short"
    short.write_text("abc\n")
    for args, env, code, words in (
            (("--port", "70000"), {}, 2, "--port"),
            (("--actions-token-file", str(tmp_path / "missing")), {}, 2, "--actions-token-file"),
            (("--actions-token-file", str(short)), {}, 3, "at least 16 characters"),
            ((), {"NOTIFYQ_WEB_TOKEN": "short"}, 3, "NOTIFYQ_WEB_TOKEN"),
            ((), {"NOTIFYQ_WEB_TOKEN": " " * 20}, 3, "NOTIFYQ_WEB_TOKEN"),  # blanks: set wrong, not unset
            (("--bind", "203.0.113.1"), {}, 3, "cannot listen"),
            (("--dsn", "mysql://root@127.0.0.1:1/nq"), {"NOTIFYQ_CONNECT_RETRY_S": "0.5"}, 5, "cannot reach")):
        r = run_cli({**db.env, **env}, "web", "--port", "0", *args, timeout=30)
        assert r.returncode == code, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, (args, r.stderr)


def test_the_command_serves_until_sigterm(db):
    # Given `notifyq web` started on a free port with a token in the environment
    proc = subprocess.Popen(notifyq_cmd("web", "--port", "0"), env={**db.env, "NOTIFYQ_WEB_TOKEN": TOKEN},
                            stderr=subprocess.PIPE, text=True)
    try:
        line = wait_until(lambda: _url_line(proc), timeout=30, message="the listening line")
        url = re.search(r"http://\S+", line).group(0)
        # Then it answers on loopback, with actions enabled, and never prints the token
        assert url.startswith("http://127.0.0.1:") and "actions enabled" in line and TOKEN not in line
        code, body = Client(url).get("/")
        assert code == 200 and "sign in to act" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def _url_line(proc: subprocess.Popen) -> str | None:
    line = proc.stderr.readline()
    assert line or proc.poll() is None, "notifyq web exited"
    return line if "http://" in line else None


def test_the_consumers_page_shows_a_live_consumer_and_the_jobs_in_its_hands(db, web, tmp_path):
    # Given a consumer process holding one job in a slow handler
    produce(db, "mail", "{}")
    env = {**db.env, "NQ_TEST_OUT": str(tmp_path), "NQ_TEST_SLEEP": "60"}
    proc = subprocess.Popen(notifyq_cmd("consume", "-q", "mail", "--handler", "nqhandlers:record_slow"),
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        c = Client(web().url)
        # When the consumers page is read
        row = wait_until(lambda: _consumer_row(c, proc.pid), timeout=30, message="the consumer's row")
        # Then its row names the host, the queue, the job in hand and a live lock
        assert ">mail</a>" in row and '<td class="num">1</td>' in row and "alive (lock held)" in row
        # And the overview counts it, and the job as claimed
        body = c.get("/")[1]
        assert re.search(r'data-state="claimed"><a [^>]*>1</a>', body)
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_the_consumers_page_reads_the_locks_only_when_asked_and_says_why_it_cannot(db, web):
    # (the shared server runs without performance_schema; a server that shows the locks:
    # tests/fault/test_status_locks.py)
    c = Client(web().url)
    code, body = c.get("/consumers")
    assert code == 200 and 'href="/consumers?locks=1"' in body and "<h2>Locks</h2>" not in body
    code, body = c.get("/consumers?locks=1")
    assert code == 200 and "<h2>Locks</h2>" in body and "Not shown: " in body


def _consumer_row(c: Client, pid: int) -> str | None:
    body = c.get("/consumers")[1]
    for row in body.split("<tr>")[1:]:
        if f'<td class="num">{pid}</td>' in row and '<td class="num">1</td>' in row:
            return row
    return None


def test_the_periodic_page_shows_last_and_next_tick(db, web):
    # Given a periodic entry in the config that has ticked once
    config = {"queue": {"reports": {"periodic": [{"cron": "*/5 * * * *", "name": "daily-digest"}]}}}
    db.query("INSERT INTO nq_periodic (queue, name, last_tick) VALUES ('reports', 'daily-digest', "
             "'2026-01-02 03:05:00')")
    # When the periodic page is read
    code, body = Client(web(**config).url).get("/periodic")
    # Then the entry shows its cron, its last tick, a next tick and no leader (no consumer runs)
    assert code == 200
    row = body.split('<td>daily-digest</td>', 1)[1].split("</tr>", 1)[0]
    assert "*/5 * * * *" in row and "2026-01-02 03:05:00" in row and "none (no consumer holds the lock)" in row
    assert re.search(r"<td>\d{4}-\d\d-\d\d \d\d:\d[05]:00</td>", row), row


def test_jobs_are_found_by_state_queue_and_dedup_key_and_cancelled(db, web):
    # Given jobs on two queues, one with a dedup key
    produce(db, "mail", "{}", "{}")
    (keyed,) = produce(db, "mail", '{"order": 42}', flags=("--dedup-key", "order-42"))
    produce(db, "thumbs", "{}")
    c = Client(web(token=TOKEN).url)
    # When the jobs page is filtered
    ids = lambda path: [int(i) for i in re.findall(r'<tr data-job="(\d+)">', c.get(path)[1])]  # noqa: E731
    # Then it lists what the filter names
    assert len(ids("/jobs")) == 4 and len(ids("/jobs?queue=mail")) == 3 and len(ids("/jobs?queue=mail&limit=2")) == 2
    assert ids("/jobs?queue=mail&dedup=order-42") == [keyed]
    assert ids("/jobs?queue=thumbs&dedup=order-42") == [] and ids("/jobs?state=dead") == []
    # And a signed-in browser cancels the keyed job (pending: deleted)
    assert c.sign_in() == 303
    assert c.post("/act", {"verb": "cancel", "job": str(keyed), "csrf": c.csrf()})[0] == 303
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE id = %s", (keyed,)) == 0
    assert f"job {keyed}: deleted" in c.get("/jobs")[1]


def test_a_workflows_waiting_job_cancelled_from_the_console_is_kept_and_its_retry_waits_again(db, web):
    import notifyq

    # Given a child waiting for its parent
    with notifyq.Producer("mail", db.config()) as p:
        [parent] = p.put_many([{}])
        child = p.put({}, after=[parent])
    c = Client(web(token=TOKEN).url)
    assert c.sign_in() == 303
    # When the console cancels it: it ends cancelled, its row kept
    assert c.post("/act", {"verb": "cancel", "job": str(child), "csrf": c.csrf()})[0] == 303
    assert _status(db, child) == 5
    assert f"job {child}: cancelled (kept: a retry brings it back)" in c.get("/jobs")[1]
    # And its retry (the action `jobs retry` runs) lets it wait for its parent again
    assert c.post("/act", {"verb": "retry", "job": str(child), "csrf": c.csrf()})[0] == 303
    assert _status(db, child) == 6
    assert f"job {child}: retried (it waits for 1 parent still pending)" in c.get("/jobs")[1]


def test_cancelled_jobs_have_a_column_on_the_overview_and_a_list_of_their_own(db, web):
    # Given a job that ended cancelled (its cancel was requested while it ran) and a ready one
    (ready,) = produce(db, "mail", "{}")
    db.query("INSERT INTO nq_job (queue, status, run_at, attempts, max_attempts, finished_at, last_error, "
             "cancel_requested, cancelled_by, cancelled_at, payload) VALUES ('mail', 5, UTC_TIMESTAMP(6), 1, 5, "
             "UTC_TIMESTAMP(6), 'cancelled: asked by alice', 1, 'alice', UTC_TIMESTAMP(6), '{}')")
    cancelled = db.scalar("SELECT id FROM nq_job WHERE status = 5")
    c = Client(web(token=TOKEN).url)
    # When the overview and the cancelled jobs' list are read
    body = c.get("/")[1]
    code, listed = c.get("/jobs?state=cancelled&queue=mail")
    # Then the overview counts it in a column of its own (none before), linked to the list
    cells = dict(re.findall(r'data-state="(\w+)"><a [^>]*>([^<]*)</a>', body))
    assert cells["cancelled"] == "1" and cells["ready"] == "1", cells
    assert 'href="/jobs?queue=mail&amp;state=cancelled"' in body
    # And the list shows it, and only it (an error page, 400, before)
    assert code == 200, listed
    assert [int(i) for i in re.findall(r'<tr data-job="(\d+)">', listed)] == [cancelled]
    assert ready != cancelled and "cancelled: asked by alice" in listed
    assert [int(i) for i in re.findall(r'<tr data-job="(\d+)">', c.get("/jobs?state=cancelled")[1])] == [cancelled]


def test_a_form_goes_back_only_to_a_page_of_this_site():
    from notifyq.web.auth import safe_back as _back

    assert _back("/dead?queue=mail") == "/dead?queue=mail"
    for bad in ("//evil.example/", "https://evil.example/", "/\\evil.example", "", None, "jobs",
                "/\t/evil.example/", "/\r\nSet-Cookie: a=b", "/\n", "/a b"):
        assert _back(bad) == "/"


def test_on_loopback_only_requests_addressed_to_loopback_are_answered(db, web):
    # Given the server on 127.0.0.1 (the default)
    c = Client(web().url)
    # When a request names another host (a rebinding attacker's name for 127.0.0.1)
    code, body, _ = c.request("/", headers={"Host": "evil.example:8089"})
    # Then it is refused, and the loopback names are answered
    assert code == 421
    for host in ("127.0.0.1:8089", "localhost:8089", "[::1]:8089", "localhost"):
        assert c.request("/", headers={"Host": host})[0] == 200, host


def test_a_name_that_only_starts_like_a_loopback_address_is_refused(db, web):
    # Given the server on 127.0.0.1
    c = Client(web().url)
    # When a request names a host of the attacker's that begins like 127.0.0.1 (DNS rebinding)
    for host in ("127.attacker.example", "127.0.0.1.nip.io:8089", "127.0.0.1.evil.example", "[127.0.0.1]"):
        code, body, _ = c.request("/", headers={"Host": host})
        # Then it is refused, and no page is sent (200 with the queues before)
        assert code == 421 and "misdirected" in body, host
    # And a loopback address other than 127.0.0.1 is still loopback
    assert c.request("/", headers={"Host": "127.0.0.2:8089"})[0] == 200


def _raw_post(base: str, path: str, form: dict, cookie: str) -> tuple[int, list[tuple[str, str]]]:
    """A POST whose response headers are kept as sent, repeats included."""
    import http.client
    import urllib.parse

    where = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    try:
        conn.request("POST", path, urllib.parse.urlencode(form),
                     {"Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie})
        response = conn.getresponse()
        response.read()
        return response.status, response.getheaders()
    finally:
        conn.close()


def test_sign_in_goes_back_to_a_page_of_this_site_and_adds_no_header(db, web):
    base = web(token=TOKEN).url
    for back in ("/\r\nSet-Cookie: nq_web=0123456789abcdef0123456789abcdef; Path=/", "/\t/evil.example/",
                 "/\n/evil.example/", "/\x0b/evil.example/"):
        # Given a browser on the sign-in page
        c = Client(base)
        csrf = c.csrf("/login")
        cookie = "; ".join(f"{k.name}={k.value}" for k in c.jar)
        # When it signs in with a `back` that holds a line break or a character browsers drop
        code, headers = _raw_post(base, "/login", {"csrf": csrf, "who": "alice", "token": TOKEN, "back": back},
                                  cookie)
        # Then it is sent to / (CR/LF ended the Location header and added a Set-Cookie before,
        # and a tab made "/<tab>/evil.example/" another site), with one cookie: its new session's
        assert code == 303, back
        assert [v for k, v in headers if k.lower() == "location"] == ["/"], (back, headers)
        cookies = [v for k, v in headers if k.lower() == "set-cookie"]
        assert len(cookies) == 1 and "0123456789abcdef" not in cookies[0], (back, headers)


def test_deep_states_are_counted_up_to_the_cap_and_retries_estimated(db, web):
    # Given 20,005 ready jobs, and 1,500 scheduled ones of which every other has run before
    db.query("INSERT INTO nq_queue (queue) VALUES ('deep')")
    db.query("INSERT INTO nq_job (queue, status, run_at, max_attempts, payload) "
             f"SELECT 'deep', 0, UTC_TIMESTAMP(6), 5, '{{}}' FROM {numbers(20005)}")
    db.query("INSERT INTO nq_job (queue, status, run_at, attempts, max_attempts, payload) "
             f"SELECT 'deep', 1, UTC_TIMESTAMP(6) + INTERVAL seq SECOND, seq % 2, 5, '{{}}' FROM {numbers(1500)}")
    # When the overview is read
    body = Client(web().url).get("/")[1]
    cells = dict(re.findall(r'data-state="(\w+)"><a [^>]*>([^<]*)</a>', body))
    # Then ready stops at the cap, and the retries are an estimate from the sample, marked so
    assert cells["ready"] == "20,000+"
    assert cells["retrying"] == "≈750" and cells["scheduled"] == "≈750"


def test_a_consumer_serves_the_pages_read_only_on_its_metrics_port_when_asked(db, tmp_path):
    import socket
    import urllib.error
    import urllib.request

    # Given a consumer with a metrics port and consumer.metrics_pages on, and a job to show
    (job,) = produce(db, "mail", '{"html": "<script>x</script>"}', flags=("--delay", "600"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**db.env, "NOTIFYQ_METRICS_PORT": str(port), "NOTIFYQ_METRICS_PAGES": "true",
           "NQ_TEST_OUT": str(tmp_path), "NOTIFYQ_WEB_TOKEN": TOKEN}
    proc = subprocess.Popen(notifyq_cmd("consume", "-q", "mail", "--handler", "nqhandlers:record"),
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        c = Client(f"http://127.0.0.1:{port}/")
        # When its pages are read
        mine = f'<td class="num">{proc.pid}</td>'
        code, body = wait_until(lambda: _answered(c, "/consumers", mine), timeout=30,
                                message="the consumers page naming this consumer")
        # Then they are the status pages, showing this very consumer, read-only even with a token set
        assert code == 200 and "read-only" in body
        code, body = c.get(f"/jobs/{job}")
        assert code == 200 and "&lt;script&gt;x&lt;/script&gt;" in body and 'action="/act"' not in body
        # And the metrics are still there
        code, body = c.get("/metrics")
        assert code == 200 and "notifyq_healthy" in body
        # And nothing is posted there
        assert c.post("/act", {"verb": "cancel", "job": str(job)})[0] in (403, 405, 501)
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE id = %s", (job,)) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()


def _answered(c: Client, path: str, text: str):
    """(code, body) of `path` once it holds `text`; None before (or while nothing listens)."""
    try:
        code, body = c.get(path)
    except OSError:
        return None
    return (code, body) if text in body else None


def _raw_hosts(url: str, hosts: list[str]) -> int:
    """The status of a GET / sent with exactly these Host headers (none, one, or several)."""
    import http.client
    import urllib.parse

    where = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    try:
        conn.putrequest("GET", "/", skip_host=True)
        for host in hosts:
            conn.putheader("Host", host)
        conn.endheaders()
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_a_request_without_one_host_header_naming_a_host_is_refused_on_any_address(db, web):
    # Given the pages on loopback, and on every interface (where any Host is answered: a proxy's name)
    for w in (web(), web(bind="0.0.0.0")):
        url = f"http://127.0.0.1:{w.httpd.server_address[1]}/"
        # When a request has an empty Host, a blank one, none, or two
        for hosts in ([""], ["   "], [], ["127.0.0.1", "evil.example"], ["127.0.0.1", ""]):
            # Then it is refused (400) and no page is sent (the empty one was answered 200 on
            # every interface, and the second of two was never looked at)
            assert _raw_hosts(url, hosts) == 400, (w.url, hosts)
        # And one Host naming this server is answered
        assert _raw_hosts(url, ["127.0.0.1"]) == 200, w.url
    # And on every interface a proxy's name is answered, as documented
    assert _raw_hosts(url, ["notifyq.internal_example.com:443"]) == 200
