"""The status pages in a real headless Chromium (Playwright driving Debian's chromium): what an
operator sees and clicks. Waits are Playwright's own (a condition with a deadline)."""

from __future__ import annotations

import re

from web.conftest import chromium_or_skip

chromium_or_skip(module_level=True)  # one line for the whole module when the browser cannot run
from playwright.sync_api import expect  # noqa: E402  (only once the browser can run)

from conftest import run_cli
from number_rows import numbers
from web.conftest import TOKEN, dead_job, produce, screenshot

DEADLINE_MS = 15_000


def _cell(page, queue: str, state: str):
    return page.locator(f'tr[data-queue="{queue}"] td[data-state="{state}"]')


def _sign_in(page, base: str, who: str = "alice") -> None:
    page.goto(base + "login")
    page.fill('input[name="who"]', who)
    page.fill('input[name="token"]', TOKEN)
    page.click("form.login button")
    expect(page.locator("header .mode")).to_contain_text(f"signed in as {who}", timeout=DEADLINE_MS)


def test_the_overview_shows_a_queues_depths_after_producing(db, web, page):
    # Given 3 ready jobs and 2 delayed ones on queue mail, and one dead on queue thumbs
    produce(db, "mail", "{}", "{}", "{}")
    produce(db, "mail", "{}", "{}", flags=("--delay", "3600"))
    dead_job(db, "thumbs")
    # When the overview is opened
    page.goto(web().url)
    # Then each queue's row shows its depths by state
    for queue, state, n in (("mail", "ready", "3"), ("mail", "scheduled", "2"), ("mail", "dead", "0"),
                            ("thumbs", "dead", "1"), ("thumbs", "ready", "0")):
        expect(_cell(page, queue, state)).to_have_text(n)


def test_a_dead_jobs_error_is_visible_on_its_page(db, web, page):
    # Given a job its handler failed once, out of attempts
    job = dead_job(db, "mail", '{"to": "a@example.com", "subject": "welcome"}')
    # When the dead list is opened and the job followed from it
    page.goto(web().url + "dead")
    page.click(f'tr[data-job="{job}"] a')
    # Then its page shows the state, the handler's error (as text) and the payload
    expect(page.locator("#job-state")).to_have_text("dead")
    expect(page.locator("#last-error")).to_contain_text(f"<b>refused</b> <script>window.pwnedByError = 1</script> job {job}")
    expect(page.locator("#payload")).to_contain_text('"subject": "welcome"')
    # And its attempt's record, with the handler's traceback one click away
    attempt = page.locator('#attempts tr[data-attempt="1"]')
    expect(attempt).to_contain_text("dead")
    screenshot(page, "dead-job.png")  # (before the traceback opens: its file paths are this machine's)
    attempt.locator("summary").click()
    expect(attempt.locator("pre.traceback")).to_contain_text("Traceback (most recent call last)")
    expect(attempt.locator("pre.traceback")).to_contain_text("fail_with_markup")
    # And it stays open through the page's live refresh (the stamp says one happened)
    stamp = page.locator("#refreshed").text_content()
    expect(page.locator("#refreshed")).not_to_have_text(stamp or "", timeout=DEADLINE_MS)
    expect(page.locator('#attempts tr[data-attempt="1"] pre.traceback')).to_be_visible()
    assert page.evaluate("window.pwnedByError") is None


def test_retry_from_the_page_makes_a_dead_job_ready(db, web, page):
    # Given a dead job and a server with actions enabled, signed in
    job = dead_job(db)
    base = web(token=TOKEN).url
    _sign_in(page, base)
    # When Retry is clicked on the job's page
    page.goto(f"{base}jobs/{job}")
    page.click('button[data-action="retry"]')
    # Then the page says so, shows it ready, and the database has it ready with attempts reset
    expect(page.locator(".flash")).to_have_text(f"job {job}: retried")
    expect(page.locator("#job-state")).to_have_text("ready")
    assert db.query("SELECT status, attempts FROM nq_job WHERE id = %s", (job,))[0] == (0, 0)


def test_retry_is_refused_without_the_token(db, web, page):
    # Given a dead job, a server with actions enabled, and a browser that never signed in
    job = dead_job(db)
    base = web(token=TOKEN).url
    page.goto(f"{base}jobs/{job}")
    # When Retry is clicked
    page.click('button[data-action="retry"]')
    # Then it is refused and the job stays dead
    expect(page.locator("#message")).to_contain_text("sign in with the actions token first")
    assert db.scalar("SELECT status FROM nq_job WHERE id = %s", (job,)) == 4
    # And a read-only server offers no button at all
    page.goto(f"{web().url}jobs/{job}")
    expect(page.locator("#job-state")).to_have_text("dead")
    assert page.locator('button[data-action="retry"]').count() == 0


def test_a_script_payload_is_shown_as_text_and_never_run(db, web, page):
    # Given a job whose payload is a script
    (job,) = produce(db, "mail", '{"html": "<script>window.pwned = 1</script><img src=x onerror=\\"window.pwned = 2\\">"}')
    # When its page is opened
    page.goto(f"{web().url}jobs/{job}")
    # Then the script is shown as text, and neither it nor the image's handler ran
    expect(page.locator("#payload")).to_contain_text("<script>window.pwned = 1</script>")
    assert page.locator("#payload script, #payload img").count() == 0
    assert page.evaluate("window.pwned") is None


def test_the_page_refreshes_its_numbers_without_a_reload(db, web, page):
    # Given the overview open on a queue with 2 ready jobs, and a mark left in the page
    produce(db, "mail", "{}", "{}")
    page.goto(web().url)
    expect(_cell(page, "mail", "ready")).to_have_text("2")
    page.evaluate("window.notReloaded = true")
    # When 3 more jobs are produced and one queue is paused behind its back
    produce(db, "mail", "{}", "{}", "{}")
    assert run_cli(db.env, "pause", "-q", "mail").returncode == 0
    # Then the numbers change in place (live.js), and the page was never reloaded
    expect(_cell(page, "mail", "ready")).to_have_text("5", timeout=DEADLINE_MS)
    expect(page.locator('tr[data-queue="mail"] .paused')).to_have_text("paused", timeout=DEADLINE_MS)
    expect(page.locator("#refreshed")).to_have_text(re.compile("^updated "))
    assert page.evaluate("window.notReloaded") is True


def test_overview_screenshot(db, web, page):
    # Given a few queues with work in every state: done jobs kept, dead ones, a paused queue
    produce(db, "mail", *["{}"] * 40)
    produce(db, "mail", *["{}"] * 12, flags=("--delay", "600"))
    for _ in range(2):
        dead_job(db, "thumbs")
    produce(db, "reports", *["{}"] * 7, flags=("--priority", "5"))
    assert run_cli(db.env, "pause", "-q", "reports").returncode == 0
    # Done and dead jobs finished over the last minutes draw the chart (seeded: a consumer would
    # take the minutes to make them)
    db.query("INSERT INTO nq_job (queue, status, run_at, max_attempts, payload, finished_at, last_error) "
             "SELECT 'thumbs', IF(seq % 9 = 0, 4, 3), NOW(6), 1, '{}', "
             "UTC_TIMESTAMP(6) - INTERVAL (seq % 840) SECOND - INTERVAL (seq % 7) MINUTE, "
             f"IF(seq % 9 = 0, 'timeout', NULL) FROM {numbers(900)}")
    base = web(token=TOKEN).url
    _sign_in(page, base)
    # When the overview is opened
    page.goto(base)
    expect(_cell(page, "thumbs", "dead")).to_have_text("102")
    # Then it is saved for the docs
    screenshot(page, "overview.png")
