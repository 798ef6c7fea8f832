"""The console's flow-control and workflow pages over plain HTTP (no browser): a queue's limits,
its keys' running, ready and held jobs with why, a job's place in its workflow and the
workflow around it; escaped, bounded (a queue of 100,000 held jobs, a batch of 600), and bad
input one clear error."""

from __future__ import annotations

import dataclasses
import html
import json
import re

from number_rows import numbers
from web.conftest import Client

import notifyq
from notifyq.config import load
from notifyq.store import admin_queries
from notifyq.web import applied, graph, server

FLOW = {"api": {"limit": 10, "limit_per_key": 2, "key_limits": {"vip": 5}, "rate_per_key": "3/1h", "fair": True}}


def _jobs(db, queue: str, key: str | None, status: int, n: int) -> None:
    """n jobs of `key` in `status` (2: claimed by a consumer that holds them a minute more)."""
    db.query("INSERT INTO nq_job (queue, status, run_at, max_attempts, payload, job_key, owner, lease_until, "
             "claimed_at) SELECT %s, %s, UTC_TIMESTAMP(6), 5, '{}', %s, IF(%s = 2, REPEAT('o', 32), NULL), "
             f"IF(%s = 2, UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, NULL), NULL FROM {numbers(n)}",
             (queue, status, key, status, status))


def _row(body: str, table: str, key: str) -> str:
    section = re.search(rf'<table class="figures" id="{table}">(.*?)</table>', body, re.S).group(1)
    return re.search(rf'<tr data-key="{re.escape(key)}">(.*?)</tr>', section, re.S).group(1)


def _cells(row: str) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


def test_a_queues_limits_and_its_keys_running_ready_and_held_jobs_with_why(db, web):
    # Given a limited, fair, rated queue: key a at its limit, b with its rate spent, c free,
    # vip under its own limit, a job without a key running, and a key that holds markup
    for key, claimed, ready in (("a", 2, 30), ("b", 1, 4), ("c", 0, 2), ("vip", 3, 1), (None, 1, 0),
                                ("<i>k</i>", 0, 1)):
        if claimed:
            _jobs(db, "api", key, 2, claimed)
        if ready:
            _jobs(db, "api", key, 0, ready)
    db.query("INSERT INTO nq_rate (queue, rate_key, slot, started_at) "
             "VALUES ('api', 'b', 0, UTC_TIMESTAMP(6)), ('api', 'b', 1, UTC_TIMESTAMP(6)), ('api', 'b', 2, UTC_TIMESTAMP(6))")
    c = Client(web(queue=FLOW).url)
    # When the flow page is read
    code, body = c.get("/flow")
    # Then the queue is listed with its settings, its running and ready jobs
    assert code == 200, body
    row = re.search(r'<tr data-queue="api">(.*?)</tr>', body, re.S).group(1)
    assert _cells(row) == ["api", "10", "2 (1 override)", "-", "3/1h", "yes", "none live", "7", "38"]
    # When the queue's page is read
    code, body = c.get("/flow?queue=api")
    assert code == 200, body
    # Then its keys running most come first, each with its limit
    busiest = re.search(r'<table class="figures" id="busiest">(.*?)</table>', body, re.S).group(1)
    assert re.findall(r'<tr data-key="([^"]+)">', busiest) == ["vip", "a", "b"]
    assert _cells(_row(body, "busiest", "vip")) == ["vip", "3 of 5", "1", "0", "0 of 3", ""]
    # And each key with ready jobs, in key order, with the jobs its limit or its rate holds, and why
    listed = re.search(r'<table class="figures" id="ready-keys">(.*?)</table>', body, re.S).group(1)
    assert re.findall(r'<tr data-key="([^"]+)">', listed) == ["&lt;i&gt;k&lt;/i&gt;", "a", "b", "c", "vip"]
    a = _cells(_row(body, "ready-keys", "a"))
    assert a == ["a", "2 of 2", "30", "30", "0 of 3", "key at its limit (2 of 2 running)"]
    b = _cells(_row(body, "ready-keys", "b"))
    assert b[:5] == ["b", "1 of 2", "4", "4", "3 of 3"] and b[5].startswith("key's rate spent (3 of 3 starts in 1h00m")
    assert _cells(_row(body, "ready-keys", "c")) == ["c", "0 of 2", "2", "0", "0 of 3", ""]
    # And the key's markup is text
    assert "<i>k</i>" not in body and "&lt;i&gt;k&lt;/i&gt;" in body
    assert re.search(r"running <strong[^>]*>7</strong> of 10\s*\(1 without a key\)", body), body


def test_the_keys_are_paged_in_key_order(db, web, monkeypatch):
    # Given five keys with ready jobs, and pages of two keys
    for key in "edcba":
        _jobs(db, "api", key, 0, 1)
    monkeypatch.setattr(admin_queries, "WEB_FLOW_KEYS", 2)
    c = Client(web(queue=FLOW).url)
    # When the pages are followed
    seen, path = [], "/flow?queue=api"
    while path:
        body = c.get(path)[1]
        section = re.search(r'id="ready-keys">(.*?)</table>', body, re.S).group(1)
        seen.append(re.findall(r'<tr data-key="([^"]+)">', section))
        after = re.search(r'href="(/flow\?queue=api&amp;after=[^"]+)" rel="next"', body)
        path = after.group(1).replace("&amp;", "&") if after else None
    # Then every key is shown once, two a page
    assert seen == [["a", "b"], ["c", "d"], ["e"]]


def test_bad_flow_input_is_one_clear_error(db, web):
    c = Client(web(queue=FLOW).url)
    code, body = c.get("/flow?queue=plain")
    assert code == 400 and "queue &#39;plain&#39;: no limit, fairness or rate in this config" in body
    assert c.get("/flow?queue=no%20such%20name")[0] == 400
    assert c.get("/workflow")[0] == 400
    assert c.get("/workflow?job=x")[0] == 400
    code, body = c.get("/flow")
    assert code == 200 and 'data-queue="api"' in body


def _index_reads(db) -> int:
    """Index entries the server has read (dives and steps along a range), on MariaDB and MySQL."""
    rows = db.query("SHOW GLOBAL STATUS WHERE Variable_name IN ('Handler_read_key', 'Handler_read_next', "
                    "'Handler_read_prev', 'Handler_read_first', 'Handler_read_last')")
    return sum(int(v) for _, v in rows)


def test_a_queue_of_100000_held_jobs_costs_its_page_a_bounded_read(db, web):
    # Given 100,000 ready jobs held back: 50,000 of a key at its limit, 500 keys of 100 each,
    # and a queue at its limit
    db.query("INSERT INTO nq_job (queue, status, run_at, max_attempts, payload, job_key) "
             "SELECT 'api', 0, UTC_TIMESTAMP(6), 5, '{}', "
             f"IF(seq <= 50000, 'hot', CONCAT('k', LPAD(seq % 500, 3, '0'))) FROM {numbers(100_000)}")
    _jobs(db, "api", "hot", 2, 2)
    _jobs(db, "api", None, 2, 8)
    db.query("ANALYZE TABLE nq_job")
    c = Client(web(queue=FLOW).url)
    c.get("/flow?queue=api")  # the session connects
    # When the queue's page and the flow page are read
    before = _index_reads(db)
    code, body = c.get("/flow?queue=api")
    cost = _index_reads(db) - before
    # Then the page reads a bounded number of rows: the ready ones counted up to 20,000, each
    # key's up to 1,000, one dive per key of the page (a count of every held job reads 100,000)
    assert code == 200, body
    assert cost < 30_000, cost
    assert _cells(_row(body, "ready-keys", "hot"))[:4] == ["hot", "2 of 2", "1,000+", "1,000+"]
    assert _cells(_row(body, "ready-keys", "k000"))[2] == "100"
    assert "queue at its limit (10 of 10 running)" in body
    assert re.search(r'ready <strong data-figure="ready">20,000\+</strong>', body), body
    before = _index_reads(db)
    assert c.get("/flow")[0] == 200
    assert _index_reads(db) - before < 25_000


def test_a_jobs_page_shows_its_place_in_its_workflow_and_the_workflow_page_its_members(db, web):
    # Given a chain a -> b, a batch of b and three more members with callbacks; one member dead
    wf = notifyq.Workflow()
    a, b = wf.chain("q", [{"n": 0}, {"n": 1}])
    members = [b, *(wf.add("q", {"m": i}) for i in range(3))]
    batch = wf.batch(members, on_success=("q", {"ok": 1}), on_dead=("q", {"dead": 1}))
    with notifyq.Producer("q", db.config()) as p:
        p.put_workflow(wf)
    db.query("UPDATE nq_job SET status = 4, finished_at = NOW(6), last_error = '<b>boom</b>' WHERE id = %s",
             (members[1].id,))
    db.query("UPDATE nq_edge SET state = 3 WHERE parent_id = %s", (members[1].id,))
    db.query("UPDATE nq_job SET status = 2, owner = REPEAT('o', 32) WHERE id = %s", (members[2].id,))
    c = Client(web().url)
    # When the callback's page is read
    code, body = c.get(f"/jobs/{batch.on_success.id}")
    assert code == 200, body
    # Then it shows its batch's progress and its members with their states
    progress = " ".join(re.sub(r"<[^>]+>", " ", re.search(r'<p id="progress">(.*?)</p>', body, re.S).group(1)).split())
    assert "0 done · 1 dead · 0 cancelled · 3 pending (1 running, 1 ready, 1 waiting)" in progress, progress
    parents = re.search(r'<table class="figures" id="parents">(.*?)</table>', body, re.S).group(1)
    states = dict(re.findall(r'<tr data-job="(\d+)">.*?<td>[^<]*</td><td>(\w+)</td><td data-awaits', parents, re.S))
    assert states == {str(b.id): "waiting", str(members[1].id): "dead", str(members[2].id): "claimed",
                      str(members[3].id): "ready"}
    assert f'href="/workflow?job={batch.on_success.id}"' in body
    # When the workflow page is read from one of its jobs
    code, body = c.get(f"/workflow?job={a.id}")
    assert code == 200, body
    # Then every job of it is listed, by level, with its state; totals by state; the error as text
    rows = re.findall(r'<tr data-job="(\d+)" data-state="(\w+)"[^>]*>\s*<td class="num">(\d+)</td>', body)
    got = {int(j): (s, int(level)) for j, s, level in rows}
    assert got == {a.id: ("ready", 0), b.id: ("waiting", 1), members[1].id: ("dead", 0),
                   members[2].id: ("claimed", 0), members[3].id: ("ready", 0),
                   batch.on_success.id: ("waiting", 2), batch.on_dead.id: ("waiting", 2)}
    assert '<span data-total="waiting">3 waiting</span>' in body and '<span data-total="dead">1 dead</span>' in body
    assert "&lt;b&gt;boom&lt;/b&gt;" in body and "<b>boom" not in body
    assert 'id="truncated"' not in body


def test_a_batch_of_600_is_walked_to_a_bound_and_its_progress_counted_to_a_cap(db, web, monkeypatch):
    # Given a batch of 600 members with a callback
    wf = notifyq.Workflow()
    batch = wf.batch([wf.add("q", {"m": i}) for i in range(600)], on_complete=("q", {"cb": 1}))
    with notifyq.Producer("q", db.config()) as p:
        p.put_workflow(wf)
    monkeypatch.setattr(admin_queries, "WEB_PROGRESS_CAP", 100)
    c = Client(web().url)
    # When its callback's page and the workflow page are read
    code, body = c.get(f"/jobs/{batch.on_complete.id}")
    # Then the progress counts the first 100 parents and says so; 50 members are listed
    assert code == 200, body
    assert "100 pending" in body and "(of its first 100 parents)" in body
    assert len(re.findall(r"<tr data-job=", re.search(r'id="parents">(.*?)</table>', body, re.S).group(1))) == 50
    code, body = c.get(f"/workflow?job={batch.on_complete.id}")
    # And the walk stops at 500 jobs, and says so
    assert code == 200, body
    assert len(re.findall(r'<tr data-job="\d+"', body)) == admin_queries.WEB_WORKFLOW_JOBS
    assert 'id="truncated"' in body


def test_with_the_database_down_every_page_is_a_503(db):
    # Given the pages of a config whose server does not answer (nothing listens on port 1;
    # the sessions connect when first used, as after an outage that began once serving)
    config = db.config(queue=FLOW, dsn="mysql://nq@127.0.0.1:1/nq", connect_retry_s=0.2)
    pages = server.WebServer(config, ("127.0.0.1", 0), None).start()
    try:
        c = Client(pages.url)
        # When the overview, the flow pages, a workflow and a job are asked for
        answers = {path: c.get(path) for path in ("/", "/flow", "/flow?queue=api", "/workflow?job=1", "/jobs/1")}
    finally:
        pages.close()
    # Then each is a 503 (monitoring sees the outage), and the page says what failed
    assert {path: code for path, (code, _) in answers.items()} == dict.fromkeys(answers, 503)
    for path, (_, body) in answers.items():
        assert "127.0.0.1:1" in html.unescape(body) or "reach" in body, (path, body[-2000:])


def _parent_rows(body: str) -> dict[int, list[str]]:
    """The job page's parents: id -> its cells (job, queue, state, awaited)."""
    table = re.search(r'<table class="figures" id="parents">(.*?)</table>', body, re.S).group(1)
    return {int(i): _cells(row) for i, row in re.findall(r'<tr data-job="(\d+)">(.*?)</tr>', table, re.S)}


def test_a_parent_cancelled_then_retried_is_shown_as_it_is_now_on_its_childs_page(db, web):
    # Given b -> c put as a workflow; b cancelled (c with it), then c retried: it runs without b
    from conftest import run_cli

    with notifyq.Producer("wf", db.config()) as p:
        wf = notifyq.Workflow()
        b = wf.add("wf", {"step": "b"})
        c = wf.add("later", {"step": "c"}, after=[b])  # another queue: c is not run below
        p.put_workflow(wf)
    b, c = b.id, c.id
    for args in (("cancel", str(b)), ("retry", str(c))):
        r = run_cli(db.env, "jobs", *args)
        assert r.returncode == 0, r.stderr
    client = Client(web().url)
    # When b is retried too (its edge to c waits again), and then runs and finishes
    r = run_cli(db.env, "jobs", "retry", str(b))
    assert r.returncode == 0, r.stderr
    retried = client.get(f"/jobs/{c}")[1]
    of_b = client.get(f"/jobs/{b}")[1]
    r = run_cli(db.env, "consume", "-q", "wf", "--handler", "nqweb:succeed_or_fail", "--exit-when-empty")
    assert r.returncode == 0, r.stderr
    finished = client.get(f"/jobs/{c}")[1]
    # Then c's page lists b in its state of now, and not as awaited: c is ready and waits for
    # nothing (the page said "parents: it waits for these" of b, ready, then done)
    assert db.scalar("SELECT status FROM nq_job WHERE id = %s", (c,)) == 0
    for body, state in ((retried, "ready"), (finished, "done")):
        assert _parent_rows(body)[b][2:] == [state, "no"], _parent_rows(body)
        assert "it waits for these" not in body
        assert "it waits for none of them: it is ready" in html.unescape(body)
    # And b's own page does not say that c waits for it
    assert re.search(rf'<tr data-job="{c}">.*?data-awaits="no"', of_b, re.S), of_b


def test_a_waiting_childs_page_marks_the_parents_it_waits_for(db, web):
    # Given a child waiting for two parents, one of them done
    with notifyq.Producer("wf", db.config()) as p:
        wf = notifyq.Workflow()
        first, second = wf.add("wf", {"n": 1}), wf.add("other", {"n": 2})
        child = wf.add("later", {}, after=[first, second])
        p.put_workflow(wf)
    from conftest import run_cli

    r = run_cli(db.env, "consume", "-q", "wf", "--handler", "nqweb:succeed_or_fail", "--exit-when-empty")
    assert r.returncode == 0, r.stderr
    client = Client(web().url)
    # When its page is read
    body = client.get(f"/jobs/{child.id}")[1]
    # Then it waits for the pending parent, not the done one, and the parent's page says so too
    assert "it waits for those marked" in body
    rows = _parent_rows(body)
    assert rows[first.id][2:] == ["done", "no"] and rows[second.id][2:] == ["ready", "yes"], rows
    assert re.search(rf'<tr data-job="{child.id}">.*?data-awaits="yes"', client.get(f"/jobs/{second.id}")[1], re.S)


def test_a_done_parent_retried_is_counted_as_it_is_now_in_its_childs_progress(db, web):
    # Given a -> c put as a workflow; a done and kept (as its ack with keep_done leaves it: its
    # row done, its edge counted done), so c is ready
    from conftest import run_cli

    with notifyq.Producer("wf", db.config()) as p:
        wf = notifyq.Workflow()
        a = wf.add("wf", {"step": "a"})
        c = wf.add("later", {"step": "c"}, after=[a])
        p.put_workflow(wf)
    a, c = a.id, c.id
    db.query("UPDATE nq_job SET status = 3, finished_at = UTC_TIMESTAMP(6) WHERE id = %s", (a,))
    db.query("UPDATE nq_edge SET state = 2 WHERE parent_id = %s", (a,))
    db.query("UPDATE nq_job SET status = 0, waits_on = 0 WHERE id = %s", (c,))
    client = Client(web().url)
    assert "1 done · 0 dead · 0 cancelled · 0 pending" in _progress(client.get(f"/jobs/{c}")[1])
    # When a is retried (ready again; c, not waiting, keeps its edge counted done)
    r = run_cli(db.env, "jobs", "retry", str(a))
    assert r.returncode == 0, r.stderr
    assert db.scalar("SELECT state FROM nq_edge WHERE parent_id = %s", (a,)) == 2
    # Then c's progress counts a as it is now: ready, pending, not done
    progress = _progress(client.get(f"/jobs/{c}")[1])
    assert "0 done · 0 dead · 0 cancelled · 1 pending (1 ready)" in progress, progress
    # And once it runs, as claimed (running)
    db.query("UPDATE nq_job SET status = 2, owner = REPEAT('o', 32) WHERE id = %s", (a,))
    progress = _progress(client.get(f"/jobs/{c}")[1])
    assert "0 done · 0 dead · 0 cancelled · 1 pending (1 running)" in progress, progress


def test_a_done_parent_retried_is_counted_alike_by_the_api_and_every_page(db, web):
    # Given a, b -> c; a done and kept (its edge counted done), b still ready: c waits for b
    from conftest import run_cli

    with notifyq.Producer("wf", db.config()) as p:
        wf = notifyq.Workflow()
        a = wf.add("wf", {"step": "a"})
        b = wf.add("wf", {"step": "b"})
        c = wf.add("later", {"step": "c"}, after=[a, b])
        p.put_workflow(wf)
    a, b, c = a.id, b.id, c.id
    db.query("UPDATE nq_job SET status = 3, finished_at = UTC_TIMESTAMP(6) WHERE id = %s", (a,))
    db.query("UPDATE nq_edge SET state = 2 WHERE parent_id = %s", (a,))
    db.query("UPDATE nq_job SET waits_on = 1 WHERE id = %s", (c,))
    # When a is retried (ready again; its edge to c stays counted done)
    r = run_cli(db.env, "jobs", "retry", str(a))
    assert r.returncode == 0, r.stderr
    # Then the API counts a as it is now, pending, and says c waits for one of the two
    with notifyq.Producer("wf", db.config()) as p:
        assert p.progress(c) == {"done": 0, "failed": 0, "pending": 2, "awaited": 1}
    client = Client(web().url)
    body = client.get(f"/jobs/{c}")[1]
    progress = _progress(body)
    assert "0 done · 0 dead · 0 cancelled · 2 pending (2 ready); it waits for 1 of them" in progress, progress
    rows = _parent_rows(body)
    assert rows[a][2:] == ["ready", "no"] and rows[b][2:] == ["ready", "yes"], rows
    # And the workflow page says c waits for one parent, as its counter does
    wbody = client.get(f"/workflow?job={c}")[1]
    assert re.search(rf'<tr data-job="{c}"[^>]*>.*?<td>waiting for 1 parent</td>', wbody, re.S), wbody


def _progress(body: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", re.search(r'<p id="progress">(.*?)</p>', body, re.S).group(1)).split())


def test_the_flow_pages_say_whose_limits_they_show_and_mark_running_jobs_over_them(db, web, tmp_path):
    # Given `notifyq web` whose own config file limits queue api to 2 running jobs and a key to 1,
    # while the consumers (whose config the database does not record) run 3 of the queue's jobs,
    # 2 of them of key a
    conf = tmp_path / "web.toml"
    conf.write_text('[queue.api]\nlimit = 2\nlimit_per_key = 1\n')
    from_file = load(env={"NOTIFYQ_CONFIG": str(conf)})  # its queues and sources; the test's server
    assert from_file.sources == (str(conf),)
    config = dataclasses.replace(db.config(), queues=from_file.queues, sources=from_file.sources)
    _jobs(db, "api", "a", 2, 2)
    _jobs(db, "api", "b", 2, 1)
    _jobs(db, "api", "a", 0, 1)
    pages = server.WebServer(config, ("127.0.0.1", 0), None).start()
    try:
        c = Client(pages.url)
        # When the flow pages are read
        code, overview = c.get("/flow")
        code_q, queue = c.get("/flow?queue=api")
    finally:
        pages.close()
    assert code == code_q == 200, (overview, queue)
    # Then each names where its limits come from: this process's config file, not the consumers'
    for body in (overview, queue):
        source = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", re.search(
            r'<p id="limits-source"[^>]*>(.*?)</p>', body, re.S).group(1))).split())
        assert f"this notifyq web process's config sets them (read from {conf}" in source, source
        assert "Each consumer applies its own config's, and records them when it registers" in source, source
    # And the running counts over those limits are marked: the consumers apply others
    row = re.search(r'<tr data-queue="api">(.*?)</tr>', overview, re.S).group(1)
    assert "data-over" in row and "over this config's limit" in row
    assert "data-over" in _row(queue, "busiest", "a") and "data-over" not in _row(queue, "busiest", "b")
    assert re.search(r'running <strong data-figure="running">3</strong> of 2 <span class="over" data-over', queue)


def _graph(body: str) -> tuple[dict[int, str], set[tuple[int, int, str]], str]:
    """The workflow page's graph: {job: state} of the boxes drawn (each a link to its job),
    {(parent, child, edge state)} of the lines, and the sentence under it."""
    svg = re.search(r'<svg id="graph"[^>]*>(.*?)</svg>', body, re.S).group(1)
    nodes = {int(j): s for j, s in re.findall(r'<a href="/jobs/\d+" class="node [^"]*" data-job="(\d+)" '
                                              r'data-state="(\w+)">', svg)}
    for href, j in re.findall(r'<a href="/jobs/(\d+)"[^>]*data-job="(\d+)"', svg):
        assert href == j
    edges = {(int(p), int(c), s) for s, p, c in re.findall(r'<path class="edge (\w+)" d="[^"]+" '
                                                            r'marker-end="url\(#arrow\)" data-edge="(\d+)-(\d+)"', svg)}
    bounds = " ".join(re.sub(r"<[^>]+>", " ", re.search(r'<p class="muted" id="graph-bounds">(.*?)</p>', body,
                                                        re.S).group(1)).split())
    return nodes, edges, bounds


def test_the_workflow_page_draws_its_graph_parents_above_children_each_job_linked_with_its_state(db, web):
    # Given a diamond a -> (b, c) -> d; a done and kept, b dead
    wf = notifyq.Workflow()
    a = wf.add("q", {"n": "a"})
    b, c = wf.add("q", {"n": "b"}, after=[a]), wf.add("q", {"n": "c"}, after=[a])
    d = wf.add("q", {"n": "d"}, after=[b, c])
    with notifyq.Producer("q", db.config()) as p:
        p.put_workflow(wf)
    db.query("UPDATE nq_job SET status = 3, finished_at = UTC_TIMESTAMP(6) WHERE id = %s", (a.id,))
    db.query("UPDATE nq_edge SET state = 2 WHERE parent_id = %s", (a.id,))
    db.query("UPDATE nq_job SET status = 0 WHERE id IN (%s, %s)", (b.id, c.id))
    db.query("UPDATE nq_job SET status = 4, finished_at = UTC_TIMESTAMP(6) WHERE id = %s", (b.id,))
    db.query("UPDATE nq_edge SET state = 3 WHERE parent_id = %s", (b.id,))
    # When its workflow page is read
    code, body = Client(web().url).get(f"/workflow?job={c.id}")
    assert code == 200, body
    # Then the graph draws each job, as a link to its page, with its state; and each edge, as its child counts it
    nodes, edges, bounds = _graph(body)
    assert nodes == {a.id: "done", b.id: "dead", c.id: "ready", d.id: "waiting"}
    assert edges == {(a.id, b.id, "done"), (a.id, c.id, "done"), (b.id, d.id, "failed"), (c.id, d.id, "waiting")}
    assert bounds.startswith("Drawn: 4 of 4 jobs.")
    # And parents are drawn above their children (a row per level), the job the page is about marked
    boxes = r'data-job="(\d+)"[^>]*>\s*<title>[^<]*</title>\s*<rect x="\d+" y="(\d+)"'
    y = {int(j): int(v) for j, v in re.findall(boxes, body)}
    assert y[a.id] < y[b.id] == y[c.id] < y[d.id], y
    assert re.search(rf'class="node ready here" data-job="{c.id}"', body)


def test_a_big_workflows_graph_is_drawn_to_a_bound_and_says_what_it_left_out(db, web):
    # Given a batch of 300 members with a callback
    wf = notifyq.Workflow()
    batch = wf.batch([wf.add("q", {"m": i}) for i in range(300)], on_complete=("q", {"cb": 1}))
    with notifyq.Producer("q", db.config()) as p:
        p.put_workflow(wf)
    # When the workflow page is read from the callback
    code, body = Client(web().url).get(f"/workflow?job={batch.on_complete.id}")
    assert code == 200, body
    # Then the graph draws at most a level's bound of members and the callback, with the edges
    # between them, and says how many jobs and edges it left out; the table lists all 301
    nodes, edges, bounds = _graph(body)
    per_level = graph.PER_LEVEL
    assert len(nodes) == per_level + 1 and batch.on_complete.id in nodes
    assert len(edges) == per_level and all(c == batch.on_complete.id for _p, c, _s in edges)
    assert f"Drawn: {per_level + 1} of 301 jobs ({300 - per_level} omitted" in bounds, bounds
    assert f"{300 - per_level} edges to jobs not drawn" in bounds, bounds
    assert re.search(rf'<g class="more" data-level="0">.*?\+{300 - per_level} more</text>', body, re.S)
    assert len(re.findall(r'<tr data-job="\d+"', body)) == 301


def test_a_job_deep_in_a_long_chain_is_drawn_with_its_neighbours(db, web):
    # Given a chain of 700 jobs: more levels than the graph draws, more jobs than the walk reads
    wf = notifyq.Workflow()
    chain = wf.chain("q", [{"k": i} for i in range(700)])
    with notifyq.Producer("q", db.config()) as p:
        p.put_workflow(wf)
    ids = [j.id for j in chain]
    client = Client(web().url)
    for at in (600, 155, 699, 0):
        # When the workflow page of a member is read
        code, body = client.get(f"/workflow?job={ids[at]}")
        assert code == 200, body
        # Then the graph draws that job, marked, with its parent and its child
        nodes, edges, bounds = _graph(body)
        assert re.search(rf'class="node [a-z]+ here" data-job="{ids[at]}"', body), (at, bounds)
        near = [ids[i] for i in (at - 1, at, at + 1) if 0 <= i < 700]
        assert all(j in nodes for j in near), (at, bounds)
        assert len(nodes) == graph.NODES, (at, bounds)
        # And the sentence under it says how many levels it left out above and below
        assert re.search(r"levels? not drawn \(\d+ above, \d+ below the levels around this job\)", bounds), bounds


def _consumer(db, host: str, flow: dict | None, queues: str = "api", alive: bool = True) -> None:
    """A consumer's row as it registers (judged by its heartbeat: polling), recording `flow`
    per queue (None: an older consumer, which records nothing)."""
    db.query("INSERT INTO nq_consumer (id, lock_name, host, pid, queues, wakeup, last_seen, flow) "
             "VALUES (%s, 'l', %s, 7, %s, 'polling', UTC_TIMESTAMP(6) - INTERVAL %s SECOND, %s)",
             (host.ljust(32, "0"), host, queues, 0 if alive else 3600, None if flow is None else json.dumps(flow)))


def test_the_flow_pages_show_what_each_live_consumer_applies_and_flag_where_they_disagree(db, web, monkeypatch):
    # Given this page's config limiting api (FLOW), and the live consumers of api: one applying the
    # same, one a limit of 20 (and its markup-holding host), one of an older notifyq that records
    # nothing; one dead consumer with yet other settings; and a consumer that alone limits `batch`
    ours = db.config(queue=FLOW).queue("api").flow_settings
    _consumer(db, "same", {"api": ours})
    _consumer(db, "<b>other</b>", {"api": {**ours, "limit": 20}})
    _consumer(db, "old", None)
    _consumer(db, "dead", {"api": {**ours, "limit": 1}}, alive=False)
    _consumer(db, "batcher", {"batch": {**ours, "limit": 3, "key_limits": [], "rate_per_key": "", "fair": False}},
              queues="batch")
    reads = []
    read = admin_queries.web_consumer_flows
    monkeypatch.setattr(admin_queries, "web_consumer_flows", lambda session, limit: reads.append(1) or read(session, limit))
    c = Client(web(queue=FLOW).url)
    # When the flow page is read
    code, body = c.get("/flow")
    assert code == 200, body
    # Then api's row counts its live consumers, the unknown one, and flags their disagreement
    row = re.search(r'<tr data-queue="api">(.*?)</tr>', body, re.S).group(1)
    assert _cells(row)[6] == "3 live, 1 unknown: consumers disagree"
    assert "data-disagree" in row
    # And the queue only a consumer limits is listed, its settings not this config's
    row = re.search(r'<tr data-queue="batch">(.*?)</tr>', body, re.S).group(1)
    assert _cells(row)[:7] == ["batch", "-", "-", "-", "-", "no", "1 live: not this config's"]
    assert "data-differs" in row
    # And the consumers' rows were read once for the page
    assert len(reads) == 1
    # When api's page is read
    code, body = c.get("/flow?queue=api")
    assert code == 200, body
    # Then it shows this config's settings, each group of consumers with the settings they apply
    # (whether they are this config's), and the consumer that records none as unknown
    table = re.search(r'<table class="figures" id="applied">(.*?)</table>', body, re.S).group(1)
    rows = [(kind, _cells(cells))
            for kind, cells in re.findall(r'<tr data-applied="(\w+)"[^>]*>(.*?)</tr>', table, re.S)]
    assert rows == [
        ("config", ["this config", "10", "2; vip = 5", "none", "3/1h", "yes"]),
        ("consumers", ["1 consumer: same:7 (as this config)", "10", "2; vip = 5", "none", "3/1h", "yes"]),
        ("consumers", ["1 consumer: <b>other</b>:7 (not this config's)", "20", "2; vip = 5", "none", "3/1h", "yes"]),
        ("unknown", ["1 consumer: old:7", "unknown: it records no settings (an older notifyq)"])]
    assert "<b>other" not in body
    assert 'data-as-config="no"' in table and "data-disagree" in body
    # (the setting that is not this config's marked, and only it)
    assert table.count(' over"') == 1 and '<td class="num over">20</td>' in table
    # And the page of the queue only a consumer limits shows it, not a 400
    code, body = c.get("/flow?queue=batch")
    assert code == 200 and "1 live" in body and "data-differs" in body, body
    # When the consumer of another limit is gone, the rest agree with this config: nothing is flagged
    db.query("DELETE FROM nq_consumer WHERE host IN ('<b>other</b>', 'batcher')")
    body = c.get("/flow")[1]
    row = re.search(r'<tr data-queue="api">(.*?)</tr>', body, re.S).group(1)
    assert _cells(row)[6] == "2 live, as this config, 1 unknown"
    assert "data-disagree" not in row and "data-differs" not in row and 'data-queue="batch"' not in body


def test_a_consumer_row_that_records_an_invalid_queue_name_is_skipped_not_an_error_of_the_pages(db, web):
    # Given a live consumer of api as this config, and one whose row records a queue name that is
    # not a valid one (markup), next to api
    ours = db.config(queue=FLOW).queue("api").flow_settings
    _consumer(db, "same", {"api": ours})
    _consumer(db, "damaged", {"<script>x</script>": {**ours, "limit": 3}, "api": {**ours, "limit": 20}},
              queues="api,<script>x</script>")
    c = Client(web(queue=FLOW).url)
    # When the overview and api's page are read
    for path in ("/flow", "/flow?queue=api"):
        code, body = c.get(path)
        # Then each is a page, the invalid name left out, the damaged row's valid queue read
        assert code == 200, (path, body)
        assert "<script>x" not in body and "&lt;script&gt;x" not in body, path
        assert "damaged:7" in body or path == "/flow", path
    row = re.search(r'<tr data-queue="api">(.*?)</tr>', c.get("/flow")[1], re.S).group(1)
    assert _cells(row)[6] == "2 live: consumers disagree"


def test_many_consumers_of_distinct_settings_are_read_to_a_cap_and_shown_in_a_bounded_number_of_groups(
        db, web, monkeypatch):
    # Given 300 live consumers of api, each applying a limit of its own, and a page that reads
    # 200 consumers at most
    monkeypatch.setattr(admin_queries, "WEB_CONSUMERS_CAP", 200)
    db.query("INSERT INTO nq_consumer (id, lock_name, host, pid, queues, wakeup, last_seen, flow) "
             "SELECT LPAD(seq, 32, '0'), 'l', CONCAT('h', seq), 7, 'api', 'polling', UTC_TIMESTAMP(6), "
             "CONCAT('{\"api\":{\"limit\":', seq, ',\"limit_per_key\":2,\"key_limits\":[[\"vip\",5]],"
             "\"rate\":\"\",\"rate_per_key\":\"3/1h\",\"fair\":true}}') "
             f"FROM {numbers(300)}")
    c = Client(web(queue=FLOW).url)
    # When api's page is read
    code, body = c.get("/flow?queue=api")
    assert code == 200, body
    # Then it shows 10 groups of settings (this config's first: limit 10), and counts the rest
    table = re.search(r'<table class="figures" id="applied">(.*?)</table>', body, re.S).group(1)
    assert len(re.findall(r'<tr data-applied="consumers"', table)) == applied.GROUPS_SHOWN
    assert re.search(r'<tr data-applied="consumers" data-as-config="yes"', table)
    more = _cells(re.search(r'<tr data-applied="more">(.*?)</tr>', table, re.S).group(1))
    assert more == ["and 190 more groups of settings, of 190 consumers"]
    # And it says it read the first 200 consumers only
    assert "data-consumers-capped" in body and "The first 200 live consumers read" in body
    assert "200 live" in body
    # And the overview says so too
    code, body = c.get("/flow")
    assert code == 200 and "The first 200 live consumers read" in body, body
