#!/usr/bin/env python3
"""What a durable step costs (job.step, issue 39): a drain of N jobs of three steps each, by kind
of step, against a drain of jobs without steps.

    .venv/bin/python benchmarks/steps.py [--jobs 2000] [--rounds 3] [--batch 100]

One worker (in this process) on a private MariaDB/MySQL server (LocalServer in a temp dir). Modes:
`none` (the handler does nothing), `plain` (three job.step() outside any block: each stores its
record in a transaction of its own), `in_block` (job.transaction() holding three steps that each
write a row), `step_tx` (three job.step(transaction=True) that each write a row). The modes
alternate within each round. Reported per mode: jobs/s (median [min-max] over the rounds),
statements per job (the server's Questions delta), and the wall time a step adds (µs, against
`none`, per step). Prints a table, then the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
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

MODES = ("none", "plain", "in_block", "step_tx")
STEPS = ("a", "b", "c")
INSERT = "INSERT INTO effect (job_id, step) VALUES (%s, %s)"


def none(job) -> None:
    pass


def plain(job) -> None:
    for name in STEPS:
        with job.step(name) as step:
            if not step.done:
                step.result = name


def in_block(job) -> None:
    with job.transaction() as cur:
        for name in STEPS:
            with job.step(name) as step:
                if not step.done:
                    cur.execute(INSERT, (job.id, name))
                    step.result = name


def step_tx(job) -> None:
    for name in STEPS:
        with job.step(name, transaction=True) as step:
            if not step.done:
                step.cursor.execute(INSERT, (job.id, name))
                step.result = name


def status(conn, name: str) -> int:
    cur = conn.cursor()
    cur.execute("SHOW GLOBAL STATUS LIKE %s", (name,))
    return int(cur.fetchone()[1])


def drain(cfg: config_mod.Config, mode: str, n: int, batch: int, admin) -> dict:
    admin.cursor().execute("DELETE FROM effect")
    admin.cursor().execute("DELETE FROM nq_step")
    with Producer("st", cfg) as p:
        for i in range(0, n, 1000):
            p.put_many([{"n": k} for k in range(i, min(n, i + 1000))])
    worker = Worker(cfg, "st", handlers.PythonHandler(globals()[mode], False), stop=threading.Event(),
                    budget=Budget(None), batch_size=batch, exit_when_empty=True)
    q0 = status(admin, "Questions")
    t0 = time.perf_counter()
    worker.run()
    elapsed = time.perf_counter() - t0
    q1 = status(admin, "Questions")
    assert worker.error is None, worker.error
    cur = admin.cursor()
    cur.execute("SELECT COUNT(*) FROM nq_step")
    steps = cur.fetchone()[0]
    assert steps == (0 if mode == "none" else n * len(STEPS)), (mode, steps)
    return {"jobs_s": n / elapsed, "statements_per_job": (q1 - q0 - 2) / n}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=100)
    a = ap.parse_args(argv)
    rows: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="nq-steps-bench-") as tmp:
        server = LocalServer(Path(tmp) / "server", redo_log_mb=96)
        server.start()
        try:
            dsn = config_mod.DSN.parse(server.dsn + "nq_st")
            schema.init(dsn)
            admin = MySQLdb.connect(**dsn.connect_args(), autocommit=True)
            admin.cursor().execute("CREATE TABLE effect (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
                                   "job_id BIGINT UNSIGNED NOT NULL, step VARCHAR(8) NOT NULL)")
            cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"}, overrides={"dsn": server.dsn + "nq_st"})
            for rnd in range(a.rounds):
                for mode in (MODES if rnd % 2 == 0 else MODES[::-1]):
                    rows[mode].append(drain(cfg, mode, a.jobs, a.batch, admin))
            admin.close()
        finally:
            server.cleanup()
    summary = {}
    base = statistics.median(r["jobs_s"] for r in rows["none"])
    print(f"{a.jobs} jobs of {len(STEPS)} steps, batch {a.batch}, one worker, {a.rounds} rounds (modes alternating)")
    print(f"{'mode':<10} {'jobs/s median [min-max]':>28} {'statements/job':>15} {'µs per step':>12}")
    for mode in MODES:
        rates = [r["jobs_s"] for r in rows[mode]]
        med = statistics.median(rates)
        per_step = 0.0 if mode == "none" else (1 / med - 1 / base) / len(STEPS) * 1e6
        stmts = statistics.median(r["statements_per_job"] for r in rows[mode])
        summary[mode] = {"jobs_s": round(med, 1), "jobs_s_min": round(min(rates), 1), "jobs_s_max": round(max(rates), 1),
                         "statements_per_job": round(stmts, 2), "us_per_step": round(per_step, 1)}
        print(f"{mode:<10} {f'{med:,.0f} [{min(rates):,.0f}-{max(rates):,.0f}]':>28} {stmts:>15.2f} {per_step:>12.0f}")
    print(json.dumps({"jobs": a.jobs, "batch": a.batch, "rounds": a.rounds, "modes": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
