#!/usr/bin/env python3
"""How long the status pages take with a big backlog: `notifyq web` in this process, each page
fetched over HTTP (render and transfer, as a browser waits for it), --rounds times.

    .venv/bin/python benchmarks/web_pages.py --dsn mysql://root@127.0.0.1:3306/ [--jobs 1000000]

The backlog, filled on the server (INSERT ... SELECT from tests/number_rows.py): 80 % ready over
5 priorities on queue `bulk`, 10 % scheduled on `mail` (half of them retries), 5 % dead and 5 %
done on `thumbs`, finished over the last hour. Prints a table (ms: median, p95, max) and the
same as one JSON line. It creates and drops a database of its own (nq_web_bench; --keep keeps it,
and a kept one of the same size is reused).

--attempts N adds N attempt records on `thumbs` (ended over the last 6 hours, each of a job of
the backlog, a third of them with a task in its payload) for the history page; the console's
pages (running, history, the payload search) are timed beside the others.

--queues N adds N small queues (`many00001`...: one ready job each) for the overview's cost in
queues (its bytes are reported too). --crowd times /consumers while 20 overview requests are in
flight, and counts the server's threads and a page's time while 300 sockets sit idle on it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import MySQLdb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))  # number_rows

from notifyq import config as config_mod  # noqa: E402
from notifyq.config.dsn import DSN  # noqa: E402
from notifyq.store import schema  # noqa: E402
from notifyq.web import server  # noqa: E402
from number_rows import numbers  # noqa: E402

DATABASE = "nq_web_bench"
CHUNK = 100_000
# status, queue, attempts and finished_at by share of the rows (seq is 1..jobs)
FILL = ("INSERT INTO nq_job (queue, status, priority, run_at, attempts, max_attempts, finished_at, last_error, payload) "
        "SELECT ELT(k, 'bulk', 'mail', 'thumbs', 'thumbs'), ELT(k, 0, 1, 4, 3), IF(k = 1, seq % 5, 0), "
        "IF(k = 2, UTC_TIMESTAMP(6) + INTERVAL (seq % 3600) SECOND, UTC_TIMESTAMP(6) - INTERVAL (seq % 3600) SECOND), "
        "IF(k = 2, seq % 2, IF(k >= 3, 5, 0)), 5, "
        "IF(k >= 3, UTC_TIMESTAMP(6) - INTERVAL (seq % 3600) SECOND, NULL), IF(k = 3, 'timeout after 30 s', NULL), "
        "'{\"n\": 1}' FROM (SELECT seq, CASE WHEN seq % 20 < 16 THEN 1 WHEN seq % 20 < 18 THEN 2 "
        "WHEN seq % 20 = 18 THEN 3 ELSE 4 END AS k FROM NUMBERS) s")


def fill(root: DSN, jobs: int) -> None:
    dsn = dataclasses.replace(root, database=DATABASE)
    args = dsn.connect_args()
    conn = MySQLdb.connect(**args, autocommit=True)
    cur = conn.cursor()
    cur.execute("SELECT COUNT(*) FROM nq_job WHERE queue IN ('bulk', 'mail', 'thumbs')")
    if cur.fetchone()[0] == jobs:
        print(f"reusing {DATABASE} with {jobs:,} jobs", file=sys.stderr)
        return
    cur.execute("DELETE FROM nq_job WHERE queue IN ('bulk', 'mail', 'thumbs')")
    started = time.monotonic()
    for first in range(1, jobs + 1, CHUNK):
        cur.execute(FILL.replace("NUMBERS", numbers(min(jobs, first + CHUNK - 1), first)))
    for queue in ("bulk", "mail", "thumbs"):
        cur.execute("INSERT IGNORE INTO nq_queue (queue) VALUES (%s)", (queue,))
    cur.execute("ANALYZE TABLE nq_job")
    cur.fetchall()
    print(f"filled {jobs:,} jobs in {time.monotonic() - started:.1f} s", file=sys.stderr)
    conn.close()


def add_attempts(root: DSN, attempts: int) -> None:
    """`attempts` records on queue thumbs over the last 6 hours, each of a stored job (its id),
    their outcomes mixed; a third of those jobs get a task in their payload."""
    conn = MySQLdb.connect(**dataclasses.replace(root, database=DATABASE).connect_args(), autocommit=True)
    cur = conn.cursor()
    cur.execute("SELECT COUNT(*) FROM nq_attempt WHERE queue = 'thumbs'")
    if cur.fetchone()[0] == attempts:
        return
    cur.execute("DELETE FROM nq_attempt WHERE queue = 'thumbs'")
    cur.execute("SELECT MIN(id), MAX(id) FROM nq_job WHERE queue = 'thumbs'")
    low, high = cur.fetchone()
    for first in range(1, attempts + 1, CHUNK):
        cur.execute("INSERT IGNORE INTO nq_attempt (job_id, claim_token, attempt, queue, outcome, started_at, ended_at) "
                    "SELECT %s + seq %% (%s - %s + 1), seq, 1, 'thumbs', ELT(1 + seq %% 4, 'done', 'failed', 'dead', 'done'), "
                    "UTC_TIMESTAMP(6) - INTERVAL (seq %% 21600) SECOND - INTERVAL (seq %% 900 * 1000) MICROSECOND, "
                    "UTC_TIMESTAMP(6) - INTERVAL (seq %% 21600) SECOND "
                    f"FROM {numbers(min(attempts, first + CHUNK - 1), first)}", (low, high, low))
    cur.execute("UPDATE nq_job SET payload = JSON_OBJECT('task', ELT(1 + id % 3, 'thumbs.make', 'thumbs.crop', 'thumbs.zip')) "
                "WHERE queue = 'thumbs' AND id % 3 = 0")
    cur.execute("ANALYZE TABLE nq_attempt")
    cur.fetchall()
    conn.close()


def add_queues(root: DSN, queues: int) -> None:
    """`queues` more queues, one ready job each (kept with --keep, like the backlog)."""
    conn = MySQLdb.connect(**dataclasses.replace(root, database=DATABASE).connect_args(), autocommit=True)
    cur = conn.cursor()
    cur.execute("SELECT (SELECT COUNT(*) FROM nq_queue WHERE queue LIKE 'many%%'), "
                "(SELECT COUNT(*) FROM nq_job WHERE queue LIKE 'many%%')")
    if cur.fetchone() != (queues, queues):
        cur.execute("DELETE FROM nq_job WHERE queue LIKE 'many%%'")
        cur.execute("DELETE FROM nq_queue WHERE queue LIKE 'many%%'")
        if queues:
            cur.execute(f"INSERT INTO nq_queue (queue) SELECT CONCAT('many', LPAD(seq, 5, '0')) FROM {numbers(queues)}")
            cur.execute("INSERT INTO nq_job (queue, status, run_at, max_attempts, payload) "
                        f"SELECT CONCAT('many', LPAD(seq, 5, '0')), 0, UTC_TIMESTAMP(6), 5, '{{}}' FROM {numbers(queues)}")
    conn.close()


def fetch(url: str, sizes: dict | None = None) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read()
        assert r.status == 200, (url, r.status)
    if sizes is not None:
        sizes[url] = len(body)
    return (time.perf_counter() - started) * 1000


def crowd(url: str) -> dict:
    """/consumers while 20 overview requests are in flight; then threads and a page's time
    with 300 idle sockets open on the server."""
    out: dict = {}
    busy = [threading.Thread(target=fetch, args=(url,)) for _ in range(20)]
    for t in busy:
        t.start()
    out["consumers_in_crowd_ms"] = round(fetch(url + "consumers"), 1)
    for t in busy:
        t.join()
    where = urllib.parse.urlsplit(url)
    threads_before = threading.active_count()
    idle = [socket.create_connection((where.hostname, where.port)) for _ in range(300)]
    try:
        time.sleep(1)  # a benchmark's settling time, not a test's synchronisation: the accepts happen
        out["threads_with_300_idle"] = threading.active_count() - threads_before
        out["consumers_with_300_idle_ms"] = round(fetch(url + "consumers"), 1)
    finally:
        for s in idle:
            s.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default="mysql://root@127.0.0.1:3306/", help="A server and an account that may create a database.")
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--keep", action="store_true", help="Keep the database (and reuse it next time).")
    p.add_argument("--queues", type=int, default=0, help="Add this many small queues (one job each).")
    p.add_argument("--attempts", type=int, default=0, help="Add this many attempt records on thumbs (6 hours).")
    p.add_argument("--crowd", action="store_true", help="Also time a page among 20 overviews and 300 idle sockets.")
    a = p.parse_args()
    root = DSN.parse(a.dsn)
    dsn = dataclasses.replace(root, database=DATABASE)
    schema.init(dsn)
    fill(root, a.jobs)
    add_queues(root, a.queues)
    add_attempts(root, a.attempts)
    cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"}, overrides={"dsn": a.dsn.rstrip("/") + "/" + DATABASE})
    web = server.serve(cfg, 0, "127.0.0.1", None)
    conn = MySQLdb.connect(**dsn.connect_args())
    cur = conn.cursor()
    cur.execute("SELECT MAX(id) FROM nq_job WHERE status = 4 AND queue = 'thumbs'")
    dead_id = cur.fetchone()[0]
    conn.close()
    pages = {"overview": "", "consumers": "consumers", "jobs: bulk ready": "jobs?queue=bulk&state=ready",
             "jobs: mail scheduled": "jobs?queue=mail&state=scheduled", "dead: every queue": "dead",
             "dead: thumbs": "dead?queue=thumbs", "a dead job": f"jobs/{dead_id}", "periodic": "periodic",
             "running now": "running", "history: thumbs, 1 h": "history?queue=thumbs&hours=1",
             "history: thumbs, 6 h": "history?queue=thumbs&hours=6",
             "search: bulk ready, text": "jobs?queue=bulk&state=ready&q=needle",
             "search: thumbs dead, task": "jobs?queue=thumbs&state=dead&task=thumbs.zip"}
    results, sizes, extra = {}, {}, {}
    try:
        for name, path in pages.items():
            fetch(web.url + path)  # warm: the session connects, the templates compile
            times = sorted(fetch(web.url + path, sizes) for _ in range(a.rounds))
            results[name] = {"median_ms": round(statistics.median(times), 2),
                             "p95_ms": round(times[min(len(times) - 1, int(len(times) * 0.95))], 2),
                             "max_ms": round(times[-1], 2), "bytes": sizes[web.url + path]}
        if a.crowd:
            extra = crowd(web.url)
    finally:
        web.close()
        if not a.keep:
            args = root.connect_args()
            args.pop("database", None)  # a DSN without one names notifyq's default
            conn = MySQLdb.connect(**args, autocommit=True)
            conn.cursor().execute(f"DROP DATABASE IF EXISTS {DATABASE}")
            conn.close()
    width = max(map(len, results))
    print(f"{'page'.ljust(width)}  median_ms  p95_ms  max_ms    bytes   ({a.jobs:,} jobs, "
          f"{a.queues:,} more queues, {a.rounds} rounds)")
    for name, r in results.items():
        print(f"{name.ljust(width)}  {r['median_ms']:9.2f}  {r['p95_ms']:6.2f}  {r['max_ms']:6.2f}  {r['bytes']:7,}")
    for name, value in extra.items():
        print(f"{name}: {value}")
    print(json.dumps({"jobs": a.jobs, "queues": a.queues, "rounds": a.rounds, "pages": results, **extra}))


if __name__ == "__main__":
    main()
