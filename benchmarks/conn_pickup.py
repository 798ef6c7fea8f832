#!/usr/bin/env python3
"""Transactional enqueue pick-up: from the caller's COMMIT of a `put(conn=...)` to the handler's
first line, with `Producer.wake()` after the COMMIT (what contrib.django's enqueue_on_commit
does on commit) and without it (the consumers' backoff poll finds the job).

    .venv/bin/python benchmarks/conn_pickup.py [--dsn mysql://root@host:port/] [--jobs 200] [--json out.json]

Without --dsn it starts a private throwaway MariaDB. Default settings (wakeup.poll_max_s = 1 s);
one consumer worker in this process (ConsumerService on a thread), producer and consumer logging
in as one user. Jobs go one at a time, 0 to --max-gap-s apart (0.05 s; 2 s lets the poll reach its cap),
each waited for before the next.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import MySQLdb  # noqa: E402

import notifyq  # noqa: E402
from notifyq import config as config_mod  # noqa: E402
from notifyq.config.dsn import DSN  # noqa: E402
from notifyq.store import schema  # noqa: E402


def measure(cfg, dsn: DSN, queue: str, jobs: int, wake: bool, max_gap_s: float) -> list[float]:
    started: dict[int, float] = {}
    seen = threading.Condition()

    def handler(job) -> None:
        now = time.monotonic()
        with seen:
            started[job.id] = now
            seen.notify_all()

    stop = threading.Event()
    service = notifyq.ConsumerService(cfg, notifyq.ConsumeOptions(queues=(queue,), function=handler))
    thread = threading.Thread(target=service.run, args=(stop,), daemon=True)
    thread.start()
    conn = MySQLdb.connect(**dsn.connect_args())
    out = []
    try:
        with notifyq.Producer(queue, cfg, ring=True) as producer:
            for i in range(jobs + 1):
                time.sleep(random.uniform(0, max_gap_s))
                job_id = producer.put({"n": i}, conn=conn)
                conn.commit()
                committed = time.monotonic()
                if wake:
                    producer.wake()
                with seen:
                    seen.wait_for(lambda: job_id in started, timeout=30)
                if i:  # the first arms the bell (a consumer waits on it from its next statement)
                    out.append((started[job_id] - committed) * 1000)
    finally:
        conn.close()
        stop.set()
        thread.join(60)
    return out


def summary(name: str, ms: list[float]) -> dict:
    ms = sorted(ms)
    return {"case": name, "jobs": len(ms), "p50_ms": round(statistics.median(ms), 2),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2), "max_ms": round(ms[-1], 2)}


def run(url: str, jobs: int, max_gap_s: float) -> list[dict]:
    root = DSN.parse(url)
    dsn = dataclasses.replace(root, database=f"nq_pickup_bench_{random.randrange(1 << 30):x}")
    schema.init(dsn)
    env = {"NOTIFYQ_CONFIG": "/dev/null", **({"NOTIFYQ_PASSWORD": dsn.password} if dsn.password else {})}
    cfg = config_mod.load(env=env, overrides={"dsn": f"mysql://{dsn.user}@{dsn.host}:{dsn.port}/{dsn.database}",
                                              "log": {"level": "warning"}})
    try:
        return [summary("put(conn=) + commit + wake()", measure(cfg, dsn, "with_wake", jobs, True, max_gap_s)),
                summary("put(conn=) + commit, no wake (poll)", measure(cfg, dsn, "no_wake", jobs, False, max_gap_s))]
    finally:
        args = root.connect_args()
        args.pop("database", None)
        c = MySQLdb.connect(**args)
        c.cursor().execute(f"DROP DATABASE IF EXISTS `{dsn.database}`")
        c.close()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn")
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--max-gap-s", type=float, default=0.05, help="jobs this far apart at most (uniform)")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    if a.dsn:
        rows = run(a.dsn, a.jobs, a.max_gap_s)
    else:
        from notifyq.run.localserver import LocalServer

        with tempfile.TemporaryDirectory(prefix="nq-pickup-") as tmp, LocalServer(Path(tmp)) as server:
            rows = run(server.dsn, a.jobs, a.max_gap_s)
    print(f"{'case':<40} {'jobs':>5} {'p50':>9} {'p99':>9} {'max':>9}")
    for r in rows:
        print(f"{r['case']:<40} {r['jobs']:>5} {r['p50_ms']:>7.1f}ms {r['p99_ms']:>7.1f}ms {r['max_ms']:>7.1f}ms")
    print(json.dumps(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
