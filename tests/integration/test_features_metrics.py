"""The Prometheus endpoint of a consumer, read over HTTP while the service runs, and the
extra figures `notifyq status` computes from the database."""

from __future__ import annotations

import urllib.error
import urllib.request

import prometheus_client
from conftest import wait_until
from prometheus_client.parser import text_string_to_metric_families
from test_features import running

import notifyq
from notifyq.jobs import Job
from notifyq.ops import metrics, status
from notifyq.produce.producer import Producer
from notifyq.sharding.servers import QueueDepths
from notifyq.store.db import Session


def scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


# Tasks of this module's own for the per-task figures (a consumer finds them by module name)
_tasks = notifyq.TaskRegistry()


@_tasks.task(queue="mt", name="ok")
def _ok():
    return None


@_tasks.task(queue="mt", name="bad", max_attempts=1)
def _bad():
    raise RuntimeError("no")


def test_the_job_counters_and_run_times_are_per_task_and_the_queue_wait_per_queue_and_task(db):
    # Given jobs of two tasks, two of them due a minute ago, and a job that names no task
    # the consumer runs
    cfg = db.config()
    with Producer("mt", cfg) as p:
        p.put_many([{"task": "ok", "args": [], "kwargs": {}}] * 3)
        waited = [p.put({"task": "ok", "args": [], "kwargs": {}}),
                  p.put({"task": "bad", "args": [], "kwargs": {}}, max_attempts=1)]
        p.put({"task": "nobody's", "args": []}, max_attempts=1)
    # (as if they had waited a minute: a put's time past is the server's now)
    db.query("UPDATE nq_job SET run_at = run_at - INTERVAL 60 SECOND WHERE id IN (%s, %s)", waited)
    # When a consumer of the module's tasks runs them
    with running(cfg, "mt", None, tasks=(__name__,)) as service:
        server = metrics.serve(service, QueueDepths(cfg), 0, "127.0.0.1")
        try:
            wait_until(lambda: service.totals().succeeded == 4 and service.totals().dead == 2, 20,
                       message="the jobs counted")
            code, text = scrape(server.server_port)
        finally:
            server.close()
    assert code == 200
    s = samples(text)
    ok, bad, none = (("queue", "mt"), ("task", "ok")), (("queue", "mt"), ("task", "bad")), (("queue", "mt"),)
    # Then each outcome is counted under its task; a job of no known task, under none
    assert s[("notifyq_jobs_succeeded_total", ok)] == 4 and s[("notifyq_jobs_dead_total", bad)] == 1
    assert s[("notifyq_jobs_dead_total", none)] == 1 and s[("notifyq_jobs_dead_total", ok)] == 0
    assert sum(v for (name, _), v in s.items() if name == "notifyq_jobs_failed_total") == 2  # the queue's total
    assert ("notifyq_jobs_succeeded_total", (("queue", "mt"), ("task", "nobody's"))) not in s  # bounded
    # And each job's run time is under its task
    assert s[("notifyq_job_seconds_count", ok)] == 4 and s[("notifyq_job_seconds_count", bad)] == 1
    # And the wait from the due time to the start: the two jobs due a minute ago waited that long
    assert s[("notifyq_queue_wait_seconds_count", ok)] == 4 and s[("notifyq_queue_wait_seconds_count", bad)] == 1
    assert s[("notifyq_queue_wait_seconds_bucket", (("le", "30.0"), *ok))] == 3
    assert s[("notifyq_queue_wait_seconds_bucket", (("le", "30.0"), *bad))] == 0
    assert s[("notifyq_queue_wait_seconds_sum", bad)] >= 59


def test_the_endpoint_reports_job_outcomes_histograms_depth_and_wakeups_per_queue(db):
    # Given a consumer whose handler fails jobs marked "fail" (one attempt: they die)
    cfg = db.config(defaults={"max_attempts": 1})

    def handler(job: Job) -> None:
        if job.payload.get("fail"):
            raise RuntimeError("no")

    with running(cfg, "m", handler) as service:
        server = metrics.serve(service, QueueDepths(cfg), 0, "127.0.0.1")
        try:
            # (once the queue's watcher waits: jobs put before that are taken by the first
            # claim, and no wake-up is counted)
            wait_until(lambda: any(w.watching for w in service.figures().watchers), 20,
                       message="the queue's watcher waiting")
            # When 6 jobs run, 2 of them failing, and one more waits for later
            with Producer("m", cfg) as p:
                p.put_many([{"fail": i < 2} for i in range(6)])
                p.put({"later": True}, delay=3600)
            wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE status IN (0, 2)") == 0,
                       20, message="jobs settled")
            wait_until(lambda: service.totals().succeeded + service.totals().dead == 6, 10,
                       message="stats counted")
            code, text = scrape(server.server_port)
            health, _ = scrape(server.server_port, "/healthz")
            missing, _ = scrape(server.server_port, "/nope")
        finally:
            server.close()
    # Then the counters, histograms and database figures say what happened
    assert code == 200 and health == 200 and missing == 404
    s = samples(text)
    q = (("queue", "m"),)
    assert s[("notifyq_jobs_claimed_total", q)] == 6
    assert s[("notifyq_jobs_succeeded_total", q)] == 4
    assert s[("notifyq_jobs_failed_total", q)] == 2
    assert s[("notifyq_jobs_dead_total", q)] == 2
    assert s[("notifyq_jobs_retried_total", q)] == 0
    assert s[("notifyq_handler_seconds_count", q)] == 6  # one call per job
    assert s[("notifyq_handler_seconds_bucket", (("le", "+Inf"), ("queue", "m")))] == 6
    assert s[("notifyq_claim_batch_size_sum", q)] == 6
    assert s[("notifyq_queue_jobs", (("queue", "m"), ("state", "dead")))] == 2
    assert s[("notifyq_queue_jobs", (("queue", "m"), ("state", "delayed")))] == 1
    assert s[("notifyq_oldest_ready_age_seconds", q)] == 0
    assert s[("notifyq_db_up", ())] == 1
    assert s[("notifyq_healthy", ())] == 1
    assert s[("notifyq_wakeup_locks", q)] == 1 and s[("notifyq_wakeup_polling", q)] == 0
    assert sum(v for (name, labels), v in s.items() if name == "notifyq_wakeups_total") >= 1
    assert ("notifyq_periodic_leader", q) in s
    # And nothing was put in prometheus_client's global registry
    assert not [n for n in prometheus_client.REGISTRY._names_to_collectors if n.startswith("notifyq")]


def test_the_endpoint_counts_snoozed_jobs_apart_from_failures(db):
    import notifyq

    # Given a consumer whose handler snoozes the jobs marked "snooze", each its own way
    cfg = db.config()

    def handler(job: Job) -> None:
        if job.payload.get("snooze") == "call":
            job.snooze(3600)
        elif job.payload.get("snooze") == "raise":
            raise notifyq.Snooze(3600)

    with running(cfg, "z", handler) as service:
        server = metrics.serve(service, QueueDepths(cfg), 0, "127.0.0.1")
        try:
            # When three jobs run, two of them snoozed
            with Producer("z", cfg) as p:
                p.put_many([{"snooze": "call"}, {"snooze": "raise"}, {}])
            wait_until(lambda: service.totals().succeeded == 1 and service.totals().snoozed == 2, 20,
                       message="the jobs counted")
            code, text = scrape(server.server_port)
        finally:
            server.close()
    # Then two are counted snoozed, none failed
    s = samples(text)
    q = (("queue", "z"),)
    assert code == 200
    assert s[("notifyq_jobs_snoozed_total", q)] == 2
    assert (s[("notifyq_jobs_succeeded_total", q)], s[("notifyq_jobs_failed_total", q)]) == (1, 0)


def test_status_reports_the_longest_claim_next_due_cancel_requests_and_periodic_ticks(db):
    # Given a claimed job with a cancel request, a delayed job and a periodic entry's row
    cfg = db.config()
    with Producer("s", cfg) as p:
        running_id = p.put({"n": 1})
        p.put({"n": 2}, delay=600)
    db.query("UPDATE nq_job SET status = 2, claimed_at = NOW(6) - INTERVAL 90 SECOND, "
             "cancel_requested = 1 WHERE id = %s", (running_id,))
    db.query("INSERT INTO nq_periodic (queue, name, last_tick) "
             "VALUES ('s', 'nightly', '2026-01-05 03:00:00')")
    session = Session(cfg.dsn)
    try:
        data = status.collect(session)
    finally:
        session.close()
    # Then status shows them, in JSON and in the table
    q = data["queues"]["s"]
    assert 89 <= q["oldest_claim_age_s"] < 120
    assert 500 < q["next_due_in_s"] <= 600
    assert q["cancel_requested"] == 1
    assert data["periodic"] == [{"queue": "s", "name": "nightly", "last_tick": "2026-01-05T03:00:00+00:00"}]
    text = status.render(data)
    assert "oldest_claim" in text and "s/nightly" in text and "cancel requested" in text
