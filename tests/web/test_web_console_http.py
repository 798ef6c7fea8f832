"""The operations console over plain HTTP (no browser): what runs now, history per queue and
task, the bounded payload search, bulk actions and their bound, periodic run-now and
enable/disable; every action behind the token and the CSRF check, and logged with its ids."""

from __future__ import annotations

import datetime as dt
import html
import json
import logging
import re
import subprocess
import threading
import urllib.parse

from conftest import admin_connect, notifyq_cmd, run_cli, wait_until
from web.conftest import TOKEN, Client, dead_job, produce

from notifyq.consume.periodic import Scheduler
from notifyq.store import admin_queries
from notifyq.store.db import Session
from notifyq.web import console


def _status(db, job_id: int) -> int | None:
    return db.scalar("SELECT status FROM nq_job WHERE id = %s", (job_id,))


def _ids(body: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-job="(\d+)">', body)]


def _task(name: str, **more) -> str:
    return json.dumps({"task": name, "args": [], "kwargs": {}, **more})


def test_history_counts_a_queues_attempts_per_outcome_and_per_task(db, web):
    # Given 3 jobs of task mail.send that a real consumer ran (done), and one of mail.bounce
    # that failed once and was buried
    produce(db, "mail", _task("mail.send"), _task("mail.send"), _task("mail.send"))
    (dead,) = produce(db, "mail", _task("mail.bounce", fail=True), flags=("--max-attempts", "1"))
    r = run_cli(db.env, "consume", "-q", "mail", "--handler", "nqweb:succeed_or_fail", "--exit-when-empty")
    assert r.returncode == 0, r.stderr
    assert _status(db, dead) == 4
    c = Client(web().url)
    # When the queue's history is read
    code, body = c.get("/history?queue=mail&hours=1")
    assert code == 200, body
    # Then the totals count each outcome, and the run time has percentiles
    totals = dict(re.findall(r'data-outcome="(\w+)" rowspan="2">(\d+)<', body))
    assert totals == {"done": "3", "failed": "0", "dead": "1", "cancelled": "0"}, totals
    run_row = body.split('data-figure="run"', 1)[1].split("</tr>", 1)[0]
    assert re.search(r"\d+ ms|\d\.\d\d s", run_row), run_row
    # And the buried job's task has a row of its own (its job is stored), with its dead count
    row = body.split('<tr data-task="mail.bounce">', 1)[1].split("</tr>", 1)[0]
    assert re.findall(r'<td class="num">(\d+)</td>', row)[:4] == ["0", "0", "1", "0"], row
    # And one task's view counts that task only
    code, body = c.get("/history?queue=mail&hours=1&task=mail.bounce")
    assert dict(re.findall(r'data-outcome="(\w+)" rowspan="2">(\d+)<', body))["dead"] == "1"
    assert dict(re.findall(r'data-outcome="(\w+)" rowspan="2">(\d+)<', body))["done"] == "0"
    # And a window out of bounds is one clear error
    code, body = c.get("/history?queue=mail&hours=7")
    assert code == 400 and "hours 7: expected 1 to 6" in body


def test_the_payload_search_finds_by_text_and_task_and_reads_a_bounded_range(db, web):
    # Given 5 ready jobs, two of which mention a needle, one of them task report.build
    produce(db, "mail", '{"to": "a"}', '{"to": "needle-1"}', '{"to": "b"}')
    (second,) = produce(db, "mail", _task("report.build", to="needle-2"))
    produce(db, "mail", _task("report.build", to="c"))
    first = second - 2
    c = Client(web().url)
    # When the jobs page searches the payloads of queue mail
    # Then it lists the jobs whose payload holds the text, and those whose task is named
    assert _ids(c.get("/jobs?queue=mail&state=ready&q=needle")[1]) == [first, second]
    assert _ids(c.get("/jobs?queue=mail&state=ready&task=report.build")[1]) == [second, second + 1]
    assert _ids(c.get("/jobs?queue=mail&state=ready&q=needle&task=report.build")[1]) == [second]
    # And markup in a search is shown as text
    body = c.get("/jobs?queue=mail&state=ready&q=%3Cscript%3Ex")[1]
    assert "<script>x" not in body and "&lt;script&gt;x" in body
    # And a search needs a queue (one index range): one clear error without it
    code, body = c.get("/jobs?state=ready&q=needle")
    assert code == 400 and "a search reads one queue" in body
    # And the read stops after its scan bound: of the first 3 jobs only, one holds the needle
    session = Session(db.dsn, name="test")
    try:
        rows = admin_queries.web_search(session, queue="mail", status=0, newest=False, text="needle", task="",
                                        since=dt.datetime(1000, 1, 1), limit=50, scan=3)
    finally:
        session.close()
    assert [r[0] for r in rows] == [first]


def test_bulk_actions_act_on_the_selected_jobs_and_are_logged_with_their_ids(db, web, caplog):
    # Given three dead jobs and a signed-in browser
    jobs = [dead_job(db) for _ in range(3)]
    c = Client(web(token=TOKEN).url)
    assert c.sign_in(who="alice") == 303
    # When two are retried in one bulk action
    form = [("csrf", c.csrf("/dead")), ("verb", "bulk-retry"), ("back", "/dead"), ("shard", ""),
            ("ids", str(jobs[0])), ("ids", str(jobs[1]))]
    with caplog.at_level(logging.INFO, logger="notifyq.web"):
        code, _, headers = c.post("/act", form)
    # Then those two are ready, the third still dead, and the page says so once
    assert code == 303 and headers["Location"] == "/dead"
    assert [_status(db, j) for j in jobs] == [0, 0, 4]
    assert "retried 2 of 2 jobs" in c.get("/dead")[1]
    # And the log names who, the action and the ids
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("web action")]
    assert f"who=alice@127.0.0.1 action=bulk-retry ids={jobs[0]},{jobs[1]}" in line
    # And purge takes the one dead job and says why not for the ready ones
    code, _, _ = c.post("/act", [("csrf", c.csrf()), ("verb", "bulk-purge"), ("back", "/dead"),
                                 *[("ids", str(j)) for j in jobs]])
    flash = c.get("/dead")[1]
    assert "purged 1 of 3 jobs; 2 refused:" in flash and "only dead, done and cancelled jobs are purged" in flash
    assert _status(db, jobs[2]) is None and _status(db, jobs[0]) == 0


def test_a_bulk_action_beyond_its_bound_is_one_clear_error_and_does_nothing(db, web):
    # Given a dead job and a signed-in browser
    job = dead_job(db)
    c = Client(web(token=TOKEN).url)
    assert c.sign_in() == 303
    # When 101 ids are sent (the job's among them)
    ids = [str(job)] + [str(10_000_000 + i) for i in range(console.MAX_BULK)]
    code, body, _ = c.post("/act", [("verb", "bulk-retry"), *[("ids", i) for i in ids]],
                           {"Authorization": f"Bearer {TOKEN}"})
    # Then it is refused in one line, and the job is still dead
    assert code == 400 and body.strip() == (f"bulk-retry refused: {console.MAX_BULK + 1} jobs selected: a bulk "
                                            f"action takes at most {console.MAX_BULK}; nothing was done")
    assert _status(db, job) == 4
    # And a form of more fields than any page sends is refused whole
    code, body, _ = c.post("/act", [("verb", "bulk-retry"), *[("ids", "1")] * 1001],
                           {"Authorization": f"Bearer {TOKEN}"})
    assert code == 413
    # And without this browser's CSRF token, or without signing in, nothing is done either
    other = Client(c.base)
    for client, form in ((c, [("verb", "bulk-retry"), ("ids", str(job))]),
                         (other, [("csrf", other.csrf()), ("verb", "bulk-retry"), ("ids", str(job))])):
        assert client.post("/act", form)[0] == 403
    assert _status(db, job) == 4


def test_periodic_entries_run_now_and_are_disabled_for_every_scheduler(db, web, caplog):
    # Given a periodic entry due every minute, and a signed-in browser
    config = {"queue": {"reports": {"periodic": [{"cron": "* * * * *", "name": "digest",
                                                  "payload": {"kind": "digest"}}]}}}
    c = Client(web(token=TOKEN, **config).url)
    assert c.sign_in() == 303
    act = lambda verb: c.post("/act", {"csrf": c.csrf("/periodic"), "verb": verb, "queue": "reports",  # noqa: E731
                                       "name": "digest", "back": "/periodic"})
    # When Run now is posted
    with caplog.at_level(logging.INFO, logger="notifyq.web"):
        assert act("periodic-run")[0] == 303
    # Then the entry's job is on its queue at once, its payload as a tick's
    (payload,) = [json.loads(p) for (p,) in db.query("SELECT payload FROM nq_job WHERE queue = 'reports'")]
    assert payload["kind"] == "digest" and payload["periodic"] == "digest" and payload["tick"]
    assert any("action=periodic-run name='digest' queue=reports" in r.getMessage() for r in caplog.records)
    # When it is disabled
    assert act("periodic-disable")[0] == 303
    row = c.get("/periodic")[1].split('data-entry="reports/digest"', 1)[1].split("</tr>", 1)[0]
    assert '<span class="disabled">disabled</span>' in row and 'data-action="periodic-enable"' in row
    # Then a consumer's scheduler, leading the queue, enqueues no tick
    scheduler = Scheduler(db.config(**config), ("reports",), leader_retry_s=0.1)
    try:
        scheduler.tick()
        assert scheduler.state["reports"].leader
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = 'reports'") == 1
        # And enabled again, it resumes from now: no tick missed meanwhile is enqueued at once
        assert act("periodic-enable")[0] == 303
        last = db.scalar("SELECT last_tick FROM nq_periodic WHERE queue = 'reports' AND name = 'digest'")
        now = db.scalar("SELECT NOW(6)")
        assert abs((now - last).total_seconds()) < 60
        for entry in scheduler.entries:
            entry.next_due = None
        scheduler.tick()
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = 'reports'") == 1
    finally:
        scheduler.close()
    assert "enabled" in c.get("/periodic")[1].split('data-entry="reports/digest"', 1)[1].split("</tr>", 1)[0]
    # And an entry that is not in the config is one clear error
    code, _, _ = c.post("/act", {"csrf": c.csrf(), "verb": "periodic-run", "queue": "reports", "name": "nope"})
    assert "no periodic entry 'nope' on queue 'reports' in this config" in html.unescape(c.get("/")[1])


def test_the_running_page_shows_each_consumers_jobs_with_task_since_and_lease(db, web):
    # Given a consumer process running a job of task mail.send until it is cancelled
    (job,) = produce(db, "mail", _task("mail.send"))
    proc = subprocess.Popen(notifyq_cmd("consume", "-q", "mail", "--handler", "nqweb:until_cancelled"),
                            env=db.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        c = Client(web(token=TOKEN).url)
        assert c.sign_in() == 303
        # When the running page is read
        wait_until(lambda: f'<tr data-job="{job}">' in c.get("/running")[1], timeout=30, message="the running job")
        body = c.get("/running")[1]
        # Then the job's row names its task, its queue, its claim time and a lease in the future
        row = body.split(f'<tr data-job="{job}">', 1)[1].split("</tr>", 1)[0]
        assert "mail.send" in row and "<td>mail</td>" in row
        assert re.search(r"<td>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d</td>", row) and "over" not in row
        # And it is under its consumer's host and pid
        heading = body.split(f'<tr data-job="{job}">', 1)[0].rsplit("<h2", 1)[1]
        assert f"pid {proc.pid}" in heading
        # When it is cancelled from the page
        assert c.post("/act", {"csrf": c.csrf("/running"), "verb": "cancel", "job": str(job), "back": "/running"})[0] == 303
        # Then the handler is asked to stop, and the job ends cancelled, by the signed-in name
        wait_until(lambda: _status(db, job) in (5, None), timeout=30, message="the job cancelled")
        assert db.scalar("SELECT cancelled_by FROM nq_job WHERE id = %s", (job,)) in ("alice@127.0.0.1", None)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_traced_jobs_task_is_read_inside_its_envelope(db, web):
    # Given a task's job stored with a trace context (its payload in the tracing envelope), and
    # a job whose own payload holds a "payload" with a task in it (not an envelope)
    from notifyq.jobs import envelope

    context = envelope.context_text({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    (plain,) = produce(db, "mail", json.dumps({"payload": {"task": "report.build"}}))
    traced = plain + 1
    db.query("INSERT INTO nq_job (id, queue, status, run_at, max_attempts, payload, created_at) "
             "VALUES (%s, 'mail', 0, NOW(6), 5, %s, NOW(6))",
             (traced, envelope.stamped(_task("report.build"), context)))
    # When the jobs page searches for the task
    # Then the traced job is found by its task, and the plain one is not
    assert _ids(Client(web().url).get("/jobs?queue=mail&state=ready&task=report.build")[1]) == [traced]


def test_a_bulk_action_stopped_midway_by_the_database_says_how_many_were_done(db, web, caplog):
    # Given five ready jobs, and the database failing the cancel of the third (a trigger refuses
    # its delete: an error that no retry cures, as a server gone for good mid-action)
    jobs = produce(db, "mail", *['{"n": %d}' % i for i in range(5)])
    db.query("CREATE TRIGGER fail_one BEFORE DELETE ON nq_job FOR EACH ROW "
             "IF OLD.id = %d THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'injected failure'; END IF" % jobs[2])
    c = Client(web(token=TOKEN).url)
    # When the five are cancelled in one bulk action
    with caplog.at_level(logging.INFO, logger="notifyq.web"):
        code, body, _ = c.post("/act", [("verb", "bulk-cancel"), *[("ids", str(j)) for j in jobs]],
                               {"Authorization": f"Bearer {TOKEN}"})
    # Then the two done before the failure are gone, the rest untouched
    assert [_status(db, j) for j in jobs] == [None, None, 0, 0, 0]
    # And the answer (503: the action did not finish) and the log say so, not "refused"
    assert code == 503, (code, body)
    assert body.startswith("cancelled 2 of 5 jobs; then failed: ") and "injected failure" in body, body
    assert body.strip().endswith("3 not tried"), body
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("web action")]
    assert "outcome=cancelled 2 of 5 jobs; then failed:" in line and "refused" not in line, line


def test_a_bulk_retry_counts_retried_already_pending_refused_and_duplicates_apart(db, web):
    # Given two dead jobs and two ready ones
    dead = [dead_job(db) for _ in range(2)]
    ready = produce(db, "mail", '{"n": 1}', '{"n": 2}')
    c = Client(web(token=TOKEN).url)
    # When a bulk retry names them all, one dead job four times, and a job that does not exist
    ids = [*dead, *ready, dead[0], dead[0], dead[0], 99_999_999]
    code, body, _ = c.post("/act", [("verb", "bulk-retry"), *[("ids", str(j)) for j in ids]],
                           {"Authorization": f"Bearer {TOKEN}"})
    # Then each kind is counted apart: only the dead ones were retried
    assert code == 200, body
    assert body.startswith("retried 2 of 5 jobs; 2 already waiting or ready; 1 refused: 99999999 (no job 99999999"), body
    assert body.strip().endswith("; 3 duplicate ids collapsed"), body
    assert [_status(db, j) for j in [*dead, *ready]] == [0, 0, 0, 0]
    # And 100 copies of one id retry it once, and say the 99 others were the same
    again = dead_job(db)
    code, body, _ = c.post("/act", [("verb", "bulk-retry"), *[("ids", str(again))] * 100],
                           {"Authorization": f"Bearer {TOKEN}"})
    assert (code, body.strip()) == (200, "retried 1 of 1 jobs; 99 duplicate ids collapsed")


def test_job_ids_are_ascii_digits_only(db, web):
    # Given a dead job, and its id written in Arabic-Indic digits (Python's int() reads them)
    job = dead_job(db)
    arabic = "".join(chr(0x660 + int(d)) for d in str(job))
    c = Client(web(token=TOKEN).url)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    # When it is retried, bulk-retried, its workflow and its page asked for by that id
    retry = c.post("/act", {"verb": "retry", "job": arabic}, bearer)
    bulk = c.post("/act", {"verb": "bulk-retry", "ids": arabic}, bearer)
    flow = c.get("/workflow?job=" + urllib.parse.quote(arabic))
    page = c.get("/jobs/" + urllib.parse.quote(arabic))
    # Then each is refused as not a job id, and the job is still dead
    assert retry[0] == 400 and "expected a job id" in retry[1], retry[:2]
    assert bulk[0] == 400 and "expected a job id" in bulk[1], bulk[:2]
    assert flow[0] == 400 and "expected a job id" in html.unescape(flow[1]), flow[0]
    assert page[0] == 404, page[0]
    assert _status(db, job) == 4


def test_a_retried_job_no_longer_carries_who_cancelled_it(db, web):
    # Given a job cancelled by alice while it ran (asked from the console, then ended cancelled
    # by its consumer)
    (job,) = produce(db, "mail", '{"n": 1}')
    db.query("UPDATE nq_job SET status = 2, owner = REPEAT('o', 32), claimed_at = UTC_TIMESTAMP(6), "
             "lease_until = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE WHERE id = %s", (job,))
    c = Client(web(token=TOKEN).url)
    assert c.sign_in(who="alice") == 303
    assert c.post("/act", [("csrf", c.csrf()), ("verb", "cancel"), ("job", str(job)), ("back", "/")])[0] == 303
    assert db.scalar("SELECT cancelled_by FROM nq_job WHERE id = %s", (job,)) == "alice@127.0.0.1"
    db.query("UPDATE nq_job SET status = 5, finished_at = UTC_TIMESTAMP(6), owner = NULL WHERE id = %s", (job,))
    # When it is retried
    assert c.post("/act", [("csrf", c.csrf()), ("verb", "retry"), ("job", str(job)), ("back", "/")])[0] == 303
    # Then it is ready with no cancel on its row, and its page names no canceller
    assert db.query("SELECT status, cancelled_by, cancelled_at FROM nq_job WHERE id = %s", (job,)) == [(0, None, None)]
    assert "alice@127.0.0.1" not in c.get(f"/jobs/{job}")[1]


def test_the_jobs_pages_query_fields_are_one_clear_error_never_a_redirect_or_a_crash(db, web):
    # Given the pages, and a ready job
    (job,) = produce(db, "mail", "{}")
    c = Client(web().url)
    # When the job id box holds blanks, a NUL, a negative, non-ASCII digits or 5,000 digits
    for value in ("%20", "%09%20", "%00", "-1", "%D9%A3", "9" * 5000, "1_0"):
        code, body, headers = c.request(f"/jobs?id={value}")
        # Then it is the page with one error (the blanks were sent to /jobs/None before, 5,000
        # digits were a 500), never a redirect
        assert code == 400 and "expected a job id" in body, (value[:20], code, headers.get("Location"))
        assert "Location" not in headers, value[:20]
    # And a valid id still goes to its page, its shard checked first
    assert c.request(f"/jobs?id=%20{job}%20")[2]["Location"] == f"/jobs/{job}"
    code, body = c.get(f"/jobs?id={job}&shard=%00")
    assert code == 400 and "no shard" in body, code
    # And the numbers of the list, the search and the history take ASCII digits only, in range
    # (int() read '٣' as 3, '1_0' as 10, and 5,000 digits as a 500)
    for path, words in (("/jobs?limit=%D9%A3", "limit '٣': expected a whole number from 1 to 500"),
                        ("/jobs?limit=1_0", "limit '1_0'"), ("/jobs?limit=-5", "limit '-5'"),
                        ("/jobs?limit=%00", "limit '\\x00'"), ("/jobs?limit=" + "9" * 5000, "expected 1 to 500"),
                        ("/jobs?queue=mail&q=x&since_hours=%D9%A3", "since_hours '٣'"),
                        ("/jobs?queue=mail&q=x&since_hours=0", "since_hours 0: expected 1 to 2160"),
                        ("/history?queue=mail&hours=%D9%A3", "hours '٣'"),
                        ("/history?queue=mail&hours=" + "9" * 5000, "expected 1 to 6")):
        code, body = c.get(path)
        assert code == 400 and words in html.unescape(body), (path[:50], code, html.unescape(body)[-600:])
    # And a query of more fields than a page takes is one error (the connection was dropped)
    code, body = c.get("/jobs?" + "&".join(f"f{i}=1" for i in range(30)))
    assert code == 400 and "more than 20 query fields" in body, code


def _retries_in_flight(db) -> int:
    """The sessions of this test's database inside a retry's UPDATE of nq_job (blocked on a row lock)."""
    return int(db.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = %s AND INFO LIKE %s",
                         (db.admin.database, "UPDATE nq_job FORCE INDEX (PRIMARY)%SET status = IF(EXISTS%")))


def _dead(db, ids: list[int]) -> None:
    db.query("UPDATE nq_job SET status = 4, finished_at = UTC_TIMESTAMP(6), attempts = 1 WHERE id IN %s", (ids,))


def test_two_identical_bulk_retries_at_once_retry_each_job_once_and_say_so(db, web):
    # Given 20 dead jobs, and a session of the test's holding their rows locked, so that both
    # bulk retries below read the first job dead and then wait on its lock
    jobs = produce(db, "mail", *['{"n": %d}' % i for i in range(20)])
    _dead(db, jobs)
    base = web(token=TOKEN).url
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    form = [("verb", "bulk-retry"), *[("ids", str(j)) for j in jobs]]
    holder = admin_connect(db.admin, db.admin.database)
    holder.autocommit(False)
    holder.cursor().execute("SELECT id FROM nq_job WHERE id IN %s FOR UPDATE", (jobs,))
    answers: list[tuple[int, str]] = []
    racers = [threading.Thread(target=lambda: answers.append(Client(base).post("/act", form, bearer)[:2]))
              for _ in range(2)]
    try:
        for t in racers:
            t.start()
        wait_until(lambda: _retries_in_flight(db) == 2, timeout=30,
                   message="both bulk retries waiting on the first job's row lock")
    finally:
        holder.rollback()
        holder.close()
    for t in racers:
        t.join(timeout=60)
    # Then every job is ready, and the two answers together retried each job exactly once: the
    # other found it already ready (it said "refused: ... is ready now" before)
    assert [_status(db, j) for j in jobs] == [0] * 20
    assert len(answers) == 2 and all(code == 200 for code, _ in answers), answers
    counts = []
    for _code, body in answers:
        m = re.fullmatch(r"retried (\d+) of 20 jobs(?:; (\d+) already waiting or ready)?", body.strip())
        assert m, answers
        counts.append((int(m.group(1)), int(m.group(2) or 0)))
    assert sum(r for r, _ in counts) == 20 and all(r + a == 20 for r, a in counts), answers
