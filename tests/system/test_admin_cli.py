"""The real `notifyq` command: `jobs` admin commands, produce --delay/--at, status figures, and
the metrics endpoint of a `notifyq consume` process."""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import socket
import subprocess
import urllib.request

from conftest import notifyq_cmd, run_cli, wait_until

from notifyq.jobs import Status


def produce(db, *args: str) -> list[int]:
    r = run_cli(db.env, "produce", *args)
    assert r.returncode == 0, r.stderr
    return [int(x) for x in r.stdout.split()]


def one_line_error(r, code: int, text: str) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], r.stderr


def test_jobs_list_filters_by_queue_status_and_age_as_table_or_json(db):
    # Given ready jobs on two queues, one of them old, and a dead job
    a = produce(db, "-q", "alpha", '{"n": 1}', '{"n": 2}', '{"n": 3}')
    b = produce(db, "-q", "beta", '{"n": 4}')
    db.query("UPDATE nq_job SET created_at = NOW(6) - INTERVAL 2 HOUR WHERE id = %s", (a[0],))
    db.query("UPDATE nq_job SET status = 4, last_error = 'boom\nline two', finished_at = NOW(6) "
             "WHERE id = %s", (a[2],))
    # When listing with filters
    every = json.loads(run_cli(db.env, "jobs", "list", "--json").stdout)
    alpha = json.loads(run_cli(db.env, "jobs", "list", "-q", "alpha", "--json").stdout)
    dead = json.loads(run_cli(db.env, "jobs", "list", "--status", "dead", "--json").stdout)
    old = json.loads(run_cli(db.env, "jobs", "list", "--older-than", "1h", "--json").stdout)
    first = json.loads(run_cli(db.env, "jobs", "list", "--limit", "2", "--json").stdout)
    table = run_cli(db.env, "jobs", "list", "-q", "alpha")
    # Then each filter holds, oldest first
    assert [j["id"] for j in every] == a + b
    assert [j["id"] for j in alpha] == a
    assert [(j["id"], j["status"], j["last_error"]) for j in dead] == [(a[2], "dead", "boom\nline two")]
    assert [j["id"] for j in old] == [a[0]]
    assert [j["id"] for j in first] == (a + b)[:2]
    lines = table.stdout.splitlines()
    assert table.returncode == 0 and lines[0].split()[:3] == ["id", "queue", "status"]
    assert len(lines) == 4 and "boom line two" in lines[3]


def test_jobs_show_prints_every_field_and_the_payload_pretty(db):
    (job_id,) = produce(db, "-q", "show", "--priority", "7", "--dedup-key", "k1", '{"user": {"id": 42}}')
    r = run_cli(db.env, "jobs", "show", str(job_id))
    assert r.returncode == 0, r.stderr
    for field in ("queue", "status", "priority", "attempts", "max_attempts", "run_at", "created_at",
                  "dedup_key", "cancel_requested", "last_error", "finished_at"):
        assert field in r.stdout
    assert '"user": {\n    "id": 42\n  }' in r.stdout
    assert re.search(r"^suspect +False$", r.stdout, re.M), r.stdout
    data = json.loads(run_cli(db.env, "jobs", "show", str(job_id), "--json").stdout)
    assert data["priority"] == 7 and data["dedup_key"] == "k1" and data["payload"] == {"user": {"id": 42}}
    assert data["suspect"] is False
    # A job taken back from a consumer that died is a suspect (claimed alone from then on)
    db.query("UPDATE nq_job SET suspect = 1 WHERE id = %s", (job_id,))
    assert re.search(r"^suspect +True$", run_cli(db.env, "jobs", "show", str(job_id)).stdout, re.M)


def test_jobs_retry_puts_dead_jobs_back_with_attempts_reset_and_skips_taken_dedup_keys(db):
    # Given dead jobs on two queues; one's dedup key is now held by a new pending job
    a = produce(db, "-q", "r1", '{"n": 1}', '{"n": 2}')
    (b,) = produce(db, "-q", "r2", '{"n": 3}')
    (keyed,) = produce(db, "-q", "r1", "--dedup-key", "k", '{"n": 4}')
    db.query("UPDATE nq_job SET status = 4, attempts = 5, finished_at = NOW(6), last_error = 'x'")
    (holder,) = produce(db, "-q", "r1", "--dedup-key", "k", '{"n": 5}')
    # When one job is retried by id, then every dead job of queue r1
    one = run_cli(db.env, "jobs", "retry", str(b))
    many = run_cli(db.env, "jobs", "retry", "--dead", "-q", "r1")
    # Then they are ready with no attempts used; the keyed one stays dead; the signal moved
    assert one.stdout.strip() == f"job {b}: retried"
    assert many.stdout.strip().startswith("retried 2, skipped 1"), many.stdout
    rows = dict((r[0], (r[1], r[2])) for r in db.query("SELECT id, status, attempts FROM nq_job"))
    assert rows == {a[0]: (0, 0), a[1]: (0, 0), b: (0, 0), keyed: (4, 5), holder: (0, 0)}
    assert db.scalar("SELECT SUM(seq) FROM nq_signal WHERE queue = 'r2'") == 2  # put + retry
    # And retrying the keyed one by id says why it cannot
    one_line_error(run_cli(db.env, "jobs", "retry", str(keyed)), 4, "dedup key 'k'")


def test_jobs_cancel_deletes_pending_and_flags_running(db):
    pending, running = produce(db, "-q", "c", '{"n": 1}', '{"n": 2}')
    db.query("UPDATE nq_job SET status = 2, claimed_at = NOW(6) WHERE id = %s", (running,))
    assert run_cli(db.env, "jobs", "cancel", str(pending)).stdout.strip() == f"job {pending}: deleted"
    r = run_cli(db.env, "jobs", "cancel", str(running))
    assert r.returncode == 0 and "cancel requested" in r.stdout
    assert db.query("SELECT id, cancel_requested FROM nq_job") == [(running, 1)]


def test_jobs_cancel_keeps_a_workflows_waiting_job_and_retry_brings_it_back_with_its_children(db):
    import notifyq
    from notifyq import testing

    # Given a chain a -> b -> c, nothing run yet
    wf = notifyq.Workflow()
    wf.chain("w", [{"n": 0}, {"n": 1}, {"n": 2}])
    with notifyq.Producer("w", db.config()) as producer:
        a, b, c = producer.put_workflow(wf)
    # When the waiting b is cancelled, then retried
    cancelled = run_cli(db.env, "jobs", "cancel", str(b))
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == (f"job {b}: cancelled (a workflow's job: kept, with what it cancelled; "
                                        "`jobs retry` brings them back)")
    assert db.query("SELECT id, status FROM nq_job ORDER BY id") == [(a, 0), (b, 5), (c, 5)]
    retried = run_cli(db.env, "jobs", "retry", str(b))
    # Then b waits for a again, c for b; a retry of a waiting job says so and changes nothing
    assert retried.stdout.strip() == f"job {b}: retried (it waits for 1 parent still pending)"
    assert db.query("SELECT id, status FROM nq_job ORDER BY id") == [(a, 0), (b, 6), (c, 6)]
    again = run_cli(db.env, "jobs", "retry", str(c))
    assert again.returncode == 0 and again.stdout.strip() == f"job {c}: already waiting for 1 parent still pending"
    # And the chain runs in order
    ran = []
    testing.drain(db.config(), "w", lambda job: ran.append(job.payload["n"]))
    assert ran == [0, 1, 2]
    # And a retry of a done job (its row gone with its ack) is one clear error
    one_line_error(run_cli(db.env, "jobs", "retry", str(a)), 4, f"no job {a}: it was done at")


def test_jobs_purge_deletes_only_old_finished_jobs_of_the_given_kinds(db):
    ids = produce(db, "-q", "p", *[json.dumps({"n": i}) for i in range(6)])
    db.query("UPDATE nq_job SET status = %s, finished_at = NOW(6) - INTERVAL 8 DAY WHERE id IN %s",
             (Status.DEAD, ids[:2]))
    db.query("UPDATE nq_job SET status = %s, finished_at = NOW(6) - INTERVAL 8 DAY WHERE id IN %s",
             (Status.DONE, ids[2:4]))
    db.query("UPDATE nq_job SET status = %s, finished_at = NOW(6) WHERE id = %s", (Status.DEAD, ids[4]))
    r = run_cli(db.env, "jobs", "purge", "--dead", "--older-than", "7d")
    assert r.stdout.strip() == "purged 2"
    r = run_cli(db.env, "jobs", "purge", "--done", "--dead", "--older-than", "7d", "-q", "p")
    assert r.stdout.strip() == "purged 2"
    assert [r[0] for r in db.query("SELECT id FROM nq_job ORDER BY id")] == ids[4:]


def test_admin_user_errors_are_one_line_with_an_exit_code(db):
    one_line_error(run_cli(db.env, "jobs", "show", "999999"), 4, "no job 999999")
    one_line_error(run_cli(db.env, "jobs", "list", "--older-than", "soon"), 4, "invalid age")
    one_line_error(run_cli(db.env, "jobs", "list", "--status", "lost"), 4, "invalid status")
    one_line_error(run_cli(db.env, "jobs", "list", "-q", "no way"), 4, "invalid queue name")
    # A wrong combination of arguments is a usage error (2), like a missing one
    one_line_error(run_cli(db.env, "jobs", "retry"), 2, "give a JOB_ID, or --dead")
    one_line_error(run_cli(db.env, "jobs", "retry", "5", "--dead"), 2, "give a JOB_ID, or --dead")
    one_line_error(run_cli(db.env, "jobs", "purge", "--older-than", "7d"), 2, "--dead, --done")
    one_line_error(run_cli(db.env, "jobs", "cancel", "999999"), 4, "no job 999999")
    (job_id,) = produce(db, "-q", "e", '{"n": 1}')
    db.query("UPDATE nq_job SET status = 2 WHERE id = %s", (job_id,))
    one_line_error(run_cli(db.env, "jobs", "retry", str(job_id)), 4, "is running")


def test_produce_delay_and_at_schedule_jobs_and_status_shows_when_the_next_is_due(db):
    (later,) = produce(db, "-q", "d", "--delay", "300", '{"n": 1}')
    at = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)).isoformat()
    (at_id,) = produce(db, "-q", "d", "--at", at, '{"n": 2}')
    rows = dict(db.query("SELECT id, TIMESTAMPDIFF(SECOND, NOW(6), run_at) FROM nq_job WHERE status = 1"))
    assert 290 <= rows[later] <= 300 and 7190 <= rows[at_id] <= 7200
    data = json.loads(run_cli(db.env, "status", "-q", "d", "--json").stdout)
    assert data["queues"]["d"]["delayed"] == 2 and 280 < data["queues"]["d"]["next_due_in_s"] <= 300
    one_line_error(run_cli(db.env, "produce", "-q", "d", "--at", "tomorrow", "{}"), 4, "--at")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_consume_serves_metrics_on_the_configured_port(db, tmp_path):
    # Given a consumer started with NOTIFYQ_METRICS_PORT
    port = _free_port()
    env = {**db.env, "NOTIFYQ_METRICS_PORT": str(port), "NQ_TEST_OUT": str(tmp_path)}
    proc = subprocess.Popen(notifyq_cmd("consume", "-q", "mx", "--handler", "nqhandlers:record"), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        produce(db, "-q", "mx", '{"n": 1}', '{"n": 2}', '{"n": 3}')

        def claimed() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return 'notifyq_jobs_succeeded_total{queue="mx"} 3.0' in r.read().decode()
            except OSError:
                return False

        # Then the scrape shows the three jobs done
        wait_until(claimed, 30, 0.1, "metrics showing 3 jobs done")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.stderr.read()
