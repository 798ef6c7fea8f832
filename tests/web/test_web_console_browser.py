"""The operations console in a real headless Chromium (Playwright driving Debian's chromium):
each page and action as an operator clicks it. Waits are Playwright's own (a condition with a
deadline) or tests/conftest.py's wait_until."""

from __future__ import annotations

import json
import re
import subprocess

from web.conftest import chromium_or_skip

chromium_or_skip(module_level=True)  # one line for the whole module when the browser cannot run
from playwright.sync_api import expect  # noqa: E402  (only once the browser can run)

from conftest import notifyq_cmd, wait_until
from number_rows import numbers
from web.conftest import TOKEN, dead_job, produce, screenshot

DEADLINE_MS = 15_000


def _sign_in(page, base: str, who: str = "alice") -> None:
    page.goto(base + "login")
    page.fill('input[name="who"]', who)
    page.fill('input[name="token"]', TOKEN)
    page.click("form.login button")
    expect(page.locator("header .mode")).to_contain_text(f"signed in as {who}", timeout=DEADLINE_MS)


def _status(db, job_id: int):
    return db.scalar("SELECT status FROM nq_job WHERE id = %s", (job_id,))


def _task(name: str, **more) -> str:
    return json.dumps({"task": name, "args": [], "kwargs": {}, **more})


def test_a_running_job_is_shown_with_its_task_and_cancelled_from_the_page(db, web, page):
    # Given a consumer process running a job of task mail.send until it is cancelled
    (job,) = produce(db, "mail", _task("mail.send", to="a@example.com"))
    proc = subprocess.Popen(notifyq_cmd("consume", "-q", "mail", "--handler", "nqweb:until_cancelled"),
                            env=db.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = web(token=TOKEN).url
        _sign_in(page, base)
        # When the running page is opened
        page.goto(base + "running")
        row = page.locator(f'tr[data-job="{job}"]')
        # Then the job is there (the live refresh brings it once claimed), with its task and lease
        expect(row).to_contain_text("mail.send", timeout=DEADLINE_MS)
        expect(page.locator("#running h2").first).to_contain_text(f"pid {proc.pid}")
        screenshot(page, "running.png")
        # When Cancel is clicked
        row.locator('button[data-action="cancel"]').click()
        # Then the page says so, and the job ends cancelled
        expect(page.locator(".flash")).to_have_text(f"job {job}: cancel requested")
        wait_until(lambda: _status(db, job) in (5, None), timeout=30, message="the job cancelled")
        expect(page.locator(f'tr[data-job="{job}"]')).to_have_count(0, timeout=DEADLINE_MS)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_history_shows_a_queues_outcomes_per_minute_and_per_task(db, web, page):
    # Given a queue's attempt records over the last hour (ended 1 to 52 minutes ago: inside the
    # window however slowly the page comes): three tasks, every outcome, with jobs
    # still stored for the ones that failed (seeded: a consumer would take the hour to make them)
    db.query("INSERT INTO nq_queue (queue) VALUES ('mail')")
    db.query("INSERT INTO nq_job (id, queue, status, run_at, attempts, max_attempts, payload, finished_at) "
             "SELECT seq + 1, 'mail', IF(seq % 10 = 0, 4, 3), NOW(6) - INTERVAL (120 + seq * 5 % 3000) SECOND, 1, 1, "
             "JSON_OBJECT('task', ELT(1 + seq % 3, 'mail.send', 'mail.digest', 'mail.bounce')), NOW(6) "
             f"FROM {numbers(1200)}")
    db.query("INSERT INTO nq_attempt (job_id, claim_token, attempt, queue, outcome, started_at, ended_at) "
             "SELECT seq + 1, seq + 1, 1, 'mail', IF(seq % 10 = 0, 'dead', IF(seq % 7 = 0, 'failed', "
             "IF(seq % 31 = 0, 'cancelled', 'done'))), "
             "NOW(6) - INTERVAL (120 + seq * 5 % 3000) SECOND + INTERVAL (seq % 5) SECOND, "
             "NOW(6) - INTERVAL (120 + seq * 5 % 3000) SECOND + INTERVAL (5 + seq % 40) SECOND "
             f"FROM {numbers(1200)}")
    dead, failed = db.query("SELECT SUM(outcome = 'dead'), SUM(outcome = 'failed') FROM nq_attempt")[0]
    base = web().url
    # When the history page is opened and its queue chosen
    page.goto(base + "history")
    page.select_option('select[name="queue"]', "mail")
    page.click("form.filters button")
    # Then the totals count each outcome, and the chart has bars
    expect(page.locator('td[data-outcome="dead"]')).to_have_text(str(int(dead)))
    expect(page.locator('td[data-outcome="failed"]')).to_have_text(str(int(failed)))
    assert page.locator("svg.chart.history rect.done").count() > 30
    expect(page.locator('tr[data-figure="run"]')).to_contain_text(" s")
    screenshot(page, "history.png")
    # When a task is followed from the per-task table
    page.click('tr[data-task="mail.bounce"] a')
    # Then its view counts its attempts only
    expect(page.locator("h1")).to_contain_text("task mail.bounce")
    bounce = db.scalar("SELECT COUNT(*) FROM nq_attempt a JOIN nq_job j ON j.id = a.job_id "
                       "WHERE a.outcome = 'dead' AND JSON_VALUE(j.payload, '$.task') = 'mail.bounce'")
    expect(page.locator('td[data-outcome="dead"]')).to_have_text(str(bounce))


def test_search_then_bulk_retry_the_selected_dead_jobs(db, web, page):
    # Given four dead jobs, two of which mention an order
    jobs = [dead_job(db, "mail", json.dumps({"order": n} if n % 2 else {"other": n})) for n in range(4)]
    base = web(token=TOKEN).url
    _sign_in(page, base)
    # When the dead jobs whose payload holds "order" are searched
    page.goto(base + "dead?queue=mail")
    page.fill('input[name="q"]', '"order"')
    page.click("form.filters button")
    # Then only those two are listed
    expect(page.locator("tr[data-job]")).to_have_count(2)
    # When both are selected and retried in one action
    for job in (jobs[1], jobs[3]):
        page.check(f'tr[data-job="{job}"] input[type="checkbox"]')
    screenshot(page, "bulk.png")
    page.click('button[data-action="bulk-retry"]')
    # Then the page says so, and exactly those two are ready
    expect(page.locator(".flash")).to_have_text("retried 2 of 2 jobs")
    assert [_status(db, j) for j in jobs] == [4, 0, 4, 0]


def test_a_selection_survives_the_live_refresh(db, web, page):
    # Given the dead list with a job selected
    job = dead_job(db)
    base = web(token=TOKEN).url
    _sign_in(page, base)
    page.goto(base + "dead")
    page.check(f'tr[data-job="{job}"] input[type="checkbox"]')
    page.evaluate("document.activeElement.blur()")  # a focused form field pauses every refresh
    page.evaluate("document.querySelector('#refreshed').textContent = 'mark'")
    # When another dead job appears, and a refresh has run since (its stamp replaces the mark)
    other = dead_job(db)
    expect(page.locator("#refreshed")).to_have_text(re.compile("^updated "), timeout=DEADLINE_MS)
    # Then the list kept its selection, and was not swapped for the new one
    assert page.is_checked(f'tr[data-job="{job}"] input[type="checkbox"]')
    assert page.locator(f'tr[data-job="{other}"]').count() == 0
    # And once unselected, the refresh brings the new job in
    page.uncheck(f'tr[data-job="{job}"] input[type="checkbox"]')
    page.evaluate("document.activeElement.blur()")
    expect(page.locator(f'tr[data-job="{other}"]')).to_have_count(1, timeout=DEADLINE_MS)


def test_periodic_run_now_and_disable_from_the_page(db, web, page):
    # Given a periodic entry in the config
    config = {"queue": {"reports": {"periodic": [{"cron": "0 6 * * *", "name": "morning-digest"}]}}}
    base = web(token=TOKEN, **config).url
    _sign_in(page, base)
    page.goto(base + "periodic")
    row = page.locator('tr[data-entry="reports/morning-digest"]')
    # When Run now is clicked
    row.locator('button[data-action="periodic-run"]').click()
    # Then its job is enqueued at once
    expect(page.locator(".flash")).to_contain_text("enqueued now")
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = 'reports'") == 1
    # When it is disabled
    page.locator('tr[data-entry="reports/morning-digest"] button[data-action="periodic-disable"]').click()
    # Then the page shows it disabled, with no next tick, and offers to enable it
    expect(page.locator(".flash")).to_have_text("periodic reports/morning-digest: disabled")
    expect(row.locator(".periodic-state")).to_contain_text("disabled")
    screenshot(page, "periodic.png")
    row.locator('button[data-action="periodic-enable"]').click()
    expect(row.locator(".periodic-state")).to_contain_text("enabled")
