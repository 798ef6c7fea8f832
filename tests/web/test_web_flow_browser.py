"""Flow control and workflows in the console, in a real headless Chromium (Playwright driving
Debian's chromium): a limited queue's held keys as an operator sees them move, and what its live
consumers apply; a workflow's members from a job's page, and a cancelled workflow brought back
with a retry from the page.
Waits are Playwright's own (a condition with a deadline)."""

from __future__ import annotations

from web.conftest import chromium_or_skip

chromium_or_skip(module_level=True)  # one line for the whole module when the browser cannot run
from playwright.sync_api import expect  # noqa: E402  (only once the browser can run)

from web.conftest import TOKEN, screenshot
from web.test_web_console_browser import DEADLINE_MS, _sign_in, _status
from web.test_web_flow_http import FLOW, _consumer, _jobs

import notifyq


def test_a_limited_queues_held_keys_are_shown_and_follow_the_running_jobs(db, web, page):
    # Given a queue whose key a runs at its limit of 2 with 5 ready jobs, and key b with 3 ready
    _jobs(db, "api", "a", 2, 2)
    _jobs(db, "api", "a", 0, 5)
    _jobs(db, "api", "b", 0, 3)
    # and two live consumers of it: one applies this page's config, the other 3 per key
    ours = db.config(queue=FLOW).queue("api").flow_settings
    _consumer(db, "web-1", {"api": ours})
    _consumer(db, "web-2", {"api": {**ours, "limit_per_key": 3}})
    base = web(queue=FLOW, sources=("/etc/notifyq/notifyq.toml",)).url  # the default file, as in production
    # When the flow page is opened, and the queue clicked
    page.goto(base + "flow")
    expect(page.locator('tr[data-queue="api"] [data-figure="running"]')).to_have_text("2")
    expect(page.locator('tr[data-queue="api"] [data-figure="consumers"]')).to_have_text("2 live: consumers disagree")
    page.click('tr[data-queue="api"] a')
    # Then the consumers' settings are shown, the one that is not this config's marked
    expect(page.locator('#applied tr[data-as-config="no"]')).to_contain_text("web-2:7 (not this config's)")
    expect(page.locator('#applied tr[data-as-config="no"] td').nth(2)).to_have_text("3; vip = 5")
    expect(page.locator('#applied tr[data-as-config="yes"]')).to_contain_text("web-1:7 (as this config)")
    # Then key a's ready jobs are held, with why; key b's are not
    a = page.locator('#ready-keys tr[data-key="a"]')
    expect(a.locator('[data-figure="held"]')).to_have_text("5")
    expect(a.locator(".why")).to_have_text("key at its limit (2 of 2 running)")
    expect(page.locator('#ready-keys tr[data-key="b"] [data-figure="held"]')).to_have_text("0")
    expect(page.locator('#busiest tr[data-key="a"] [data-figure="running"]')).to_have_text("2 of 2")
    expect(page.locator("#limits-source")).to_contain_text("read from /etc/notifyq/notifyq.toml")
    screenshot(page, "flow.png")
    # When one of a's running jobs ends, the live refresh shows its jobs no longer held
    db.query("DELETE FROM nq_job WHERE queue = 'api' AND status = 2 LIMIT 1")
    expect(a.locator('[data-figure="held"]')).to_have_text("0", timeout=DEADLINE_MS)
    expect(a.locator(".why")).to_have_text("")


def test_a_cancelled_workflow_is_followed_from_a_job_and_brought_back_by_a_retry(db, web, page):
    # Given a chain of three whose first job was cancelled (the workflow: what had not run)
    wf = notifyq.Workflow()
    first, second, third = wf.chain("q", [{"n": 0}, {"n": 1}, {"n": 2}])
    batch = wf.batch([third], on_success=("q", {"ok": 1}))
    with notifyq.Producer("q", db.config()) as p:
        p.put_workflow(wf)
    base = web(token=TOKEN).url
    _sign_in(page, base)
    page.goto(base + f"jobs/{first.id}")
    page.click('button[data-action="cancel"]')
    expect(page.locator(".flash")).to_have_text(f"job {first.id}: cancelled (kept: a retry brings it back)")
    # When the third job's page is opened
    page.goto(base + f"jobs/{third.id}")
    # Then it shows its parent cancelled, what waits for it, and leads to the whole workflow
    expect(page.locator('#parents tr[data-job="%d"]' % second.id)).to_contain_text("cancelled")
    expect(page.locator('#children tr[data-job="%d"]' % batch.on_success.id)).to_contain_text("cancelled")
    page.click("#whole-workflow")
    members = page.locator("#members tr[data-job]")
    expect(members).to_have_count(4)
    expect(page.locator('[data-total="cancelled"]')).to_have_text("4 cancelled")
    expect(page.locator(f'#members tr[data-job="{third.id}"] td').first).to_have_text("2")
    # When the first job is retried from its page (its link in the workflow)
    page.click(f'#members tr[data-job="{first.id}"] a')
    page.click('button[data-action="retry"]')
    # Then it is ready, and the rest of the workflow waits again, level by level
    expect(page.locator(".flash")).to_have_text(f"job {first.id}: retried")
    assert [_status(db, r.id) for r in (first, second, third, batch.on_success)] == [0, 6, 6, 6]
    page.goto(base + f"workflow?job={first.id}")
    expect(page.locator('[data-total="waiting"]')).to_have_text("3 waiting")
    expect(page.locator(f'#members tr[data-job="{second.id}"]')).to_contain_text("waiting for 1 parent")
    screenshot(page, "workflow.png")


def test_a_workflows_graph_is_drawn_on_its_page_and_each_job_leads_to_its_own(db, web, page):
    # Given a workflow: a fetch, two transforms after it, a batch of three loads after those
    # with callbacks on success and on a death; the fetch done, one transform running, one ready
    wf = notifyq.Workflow()
    fetch = wf.add("etl", {"step": "fetch"})
    transforms = [wf.add("etl", {"step": f"transform-{i}"}, after=[fetch]) for i in range(2)]
    loads = [wf.add("etl", {"step": f"load-{i}"}, after=transforms) for i in range(3)]
    batch = wf.batch(loads, on_success=("etl", {"step": "report"}), on_dead=("etl", {"step": "alert"}))
    with notifyq.Producer("etl", db.config()) as p:
        p.put_workflow(wf)
    db.query("UPDATE nq_job SET status = 3, finished_at = UTC_TIMESTAMP(6) WHERE id = %s", (fetch.id,))
    db.query("UPDATE nq_edge SET state = 2 WHERE parent_id = %s", (fetch.id,))
    db.query("UPDATE nq_job SET status = 2, owner = REPEAT('o', 32) WHERE id = %s", (transforms[0].id,))
    db.query("UPDATE nq_job SET status = 0 WHERE id = %s", (transforms[1].id,))
    refused: list[str] = []  # what the page's CSP blocked, if anything
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    # When the workflow page is opened from a transform
    base = web().url
    page.goto(base + f"workflow?job={transforms[0].id}")
    # Then the graph shows every job with its state, parents above children, nothing refused
    nodes = page.locator("svg#graph a.node")
    expect(nodes).to_have_count(8)
    expect(page.locator(f'svg#graph a.node[data-job="{fetch.id}"]')).to_have_attribute("data-state", "done")
    expect(page.locator(f'svg#graph a.node[data-job="{transforms[0].id}"]')).to_have_class("node claimed here")
    top = page.locator(f'svg#graph a.node[data-job="{fetch.id}"] rect').bounding_box()["y"]
    low = page.locator(f'svg#graph a.node[data-job="{batch.on_success.id}"] rect').bounding_box()["y"]
    assert top < low
    expect(page.locator("svg#graph path.edge")).to_have_count(2 + 6 + 6)
    assert refused == []
    screenshot(page, "workflow-graph.png")
    # When a job's box is clicked, its page opens
    page.click(f'svg#graph a.node[data-job="{loads[1].id}"]')
    expect(page).to_have_url(base + f"jobs/{loads[1].id}")
    expect(page.locator("h1")).to_contain_text(str(loads[1].id))
