#!/usr/bin/env python3
"""A drain whose handler writes one row per job through job.transaction(), against a drain whose
handler writes the row in its own transaction and lets the worker ack the job (issue 29).

    .venv/bin/python benchmarks/effects.py [--jobs 3000] [--rounds 3] [--batch 100]

One worker (in this process) drains N jobs on a private MariaDB/MySQL server (LocalServer in a
temp dir). The modes alternate within each round (order reversed every other round). Reported
per mode: jobs/s (median [min-max] over the rounds), statements per job (the server's Questions
delta), COMMITs per job (Com_commit plus the COMMITs inside multi-statement queries are not told
apart by the server: Questions counts each query once), and the ratio transaction / separate.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import MySQLdb  # noqa: E402

from notifyq import config as config_mod  # noqa: E402
from notifyq.consume import handlers  # noqa: E402
from notifyq.consume.stats import Budget  # noqa: E402
from notifyq.consume.worker import Worker  # noqa: E402
from notifyq.produce.producer import Producer  # noqa: E402
from notifyq.run.localserver import LocalServer  # noqa: E402
from notifyq.store import schema  # noqa: E402

INSERT = "INSERT INTO charge (job_id, attempt) VALUES (%s, %s)"


def status(conn, name: str) -> int:
    cur = conn.cursor()
    cur.execute("SHOW GLOBAL STATUS LIKE %s", (name,))
    return int(cur.fetchone()[1])


def drain(cfg: config_mod.Config, mode: str, n: int, batch: int, admin) -> dict:
    admin.cursor().execute("DELETE FROM charge")
    with Producer("fx", cfg) as p:
        for i in range(0, n, 1000):
            p.put_many([{"n": k} for k in range(i, min(n, i + 1000))])
    own = {}

    def separate(job) -> None:  # the row in the handler's own transaction; the worker acks
        conn = own.get(threading.get_ident())
        if conn is None:
            conn = own[threading.get_ident()] = MySQLdb.connect(**cfg.dsn.connect_args())
        conn.cursor().execute(INSERT, (job.id, job.attempts))
        conn.commit()

    def transaction(job) -> None:  # the row and the completion in one transaction
        with job.transaction() as cur:
            cur.execute(INSERT, (job.id, job.attempts))

    worker = Worker(cfg, "fx", handlers.PythonHandler(transaction if mode == "transaction" else separate, False),
                    stop=threading.Event(), budget=Budget(None), batch_size=batch, exit_when_empty=True)
    q0, c0 = status(admin, "Questions"), status(admin, "Com_commit")
    t0 = time.perf_counter()
    worker.run()
    elapsed = time.perf_counter() - t0
    q1, c1 = status(admin, "Questions"), status(admin, "Com_commit")
    for conn in own.values():
        conn.close()
    cur = admin.cursor()
    cur.execute("SELECT COUNT(*), COUNT(DISTINCT job_id) FROM charge")
    rows, distinct = cur.fetchone()
    assert rows == distinct == n, (mode, rows, distinct)
    assert worker.error is None, worker.error
    return {"jobs_s": n / elapsed, "statements_per_job": (q1 - q0 - 4) / n, "commits_per_job": (c1 - c0) / n}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=100)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nq-effects-bench-") as tmp:
        server = LocalServer(Path(tmp) / "server", redo_log_mb=96)
        server.start()
        try:
            dsn = config_mod.DSN.parse(server.dsn + "nq_fx")
            schema.init(dsn)
            admin = MySQLdb.connect(**dsn.connect_args(), autocommit=True)
            admin.cursor().execute("CREATE TABLE charge (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
                                   "job_id BIGINT UNSIGNED NOT NULL, attempt INT NOT NULL)")
            cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"},
                                  overrides={"dsn": server.dsn + "nq_fx"})
            rows: dict[str, list[dict]] = {"transaction": [], "separate": []}
            for rnd in range(a.rounds):
                order = ["transaction", "separate"] if rnd % 2 == 0 else ["separate", "transaction"]
                for mode in order:
                    rows[mode].append(drain(cfg, mode, a.jobs, a.batch, admin))
            admin.close()
        finally:
            server.cleanup()
    print(f"{a.jobs} jobs, batch {a.batch}, one worker, {a.rounds} rounds (modes alternating)")
    for metric in ("jobs_s", "statements_per_job", "commits_per_job"):
        line = [f"{metric:<20}"]
        for mode in ("transaction", "separate"):
            vals = [r[metric] for r in rows[mode]]
            line.append(f"{mode} {statistics.median(vals):,.3f} [{min(vals):,.3f}-{max(vals):,.3f}]")
        ratios = [t[metric] / s[metric] for t, s in zip(rows["transaction"], rows["separate"])]
        line.append(f"transaction/separate {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")
        print("  ".join(line))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
