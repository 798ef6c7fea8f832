#!/usr/bin/env python3
"""The cost of an edge (issue 39): workflows against the same number of independent jobs.

    .venv/bin/python benchmarks/workflows.py [--rounds 3] [--workers 2] [--batch 10] [--json out.json]

Cases: a fan-out of 10,000 children of one root with a fan-in callback after them all
(10,002 jobs, 20,000 edges); a chain of 1,000 (999 edges); a 10x10 layered DAG (each job after
every job of the layer before: 100 jobs, 900 edges). Each is put in one transaction
(Producer.put_workflow), then drained by `--workers` workers in this process; its twin puts
as many jobs with no edges (put_many) and drains them the same way. Reported per case: put s,
drain s (the put's return to the last job done), jobs/s over both, the ratio to the twin, and for
the chain the hand-off (a parent's handler returned to its child's handler started: p50, p99).
The price of the release for queues without workflows: a third side drains the twin's jobs with
the ack's release statements left out (store.workflows.release_statements patched to none).
A private MariaDB/MySQL server (LocalServer in a temp dir); the sides alternate within a round.
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

import notifyq  # noqa: E402
from notifyq import config as config_mod  # noqa: E402
from notifyq.consume import handlers  # noqa: E402
from notifyq.consume.stats import Budget  # noqa: E402
from notifyq.consume.worker import Worker  # noqa: E402
from notifyq.produce.producer import Producer  # noqa: E402
from notifyq.run.localserver import LocalServer  # noqa: E402
from notifyq.store import schema, workflows  # noqa: E402


def fan_out(n: int = 10_000) -> notifyq.Workflow:
    wf = notifyq.Workflow()
    root = wf.add("wf", {"root": True})
    children = [wf.add("wf", {"i": i}, after=[root]) for i in range(n)]
    wf.batch(children, on_success=("wf", {"callback": True}))
    return wf


def chain(n: int = 1000) -> notifyq.Workflow:
    wf = notifyq.Workflow()
    wf.chain("wf", [{"i": i} for i in range(n)])
    return wf


def layered(layers: int = 10, width: int = 10) -> notifyq.Workflow:
    wf = notifyq.Workflow()
    previous: list = []
    for layer in range(layers):
        previous = [wf.add("wf", {"l": layer, "i": i}, after=previous) for i in range(width)]
    return wf


CASES = {"fan-out 10,000 + fan-in": fan_out, "chain of 1,000": chain, "10x10 layered DAG": layered}


def drain(cfg, admin, put, workers: int, batch: int) -> dict:
    """put() the jobs, then run them on `workers` workers until none is left."""
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}

    def handler(job) -> None:
        starts[job.id] = time.monotonic()
        ends[job.id] = time.monotonic()

    stop = threading.Event()
    pool = [Worker(cfg, "wf", handlers.PythonHandler(handler, False), stop=stop, budget=Budget(None),
                   batch_size=batch) for _ in range(workers)]
    threads = [threading.Thread(target=w.run) for w in pool]
    for t in threads:
        t.start()
    cur = admin.cursor()
    try:
        t0 = time.perf_counter()
        ids = put()
        t1 = time.perf_counter()
        while True:
            cur.execute("SELECT COUNT(*) FROM nq_job")
            if cur.fetchone()[0] == 0:
                break
            failed = [w.error for w in pool if w.error is not None]
            if failed:
                raise RuntimeError(f"a worker failed: {failed[0]}")
            time.sleep(0.01)  # a benchmark's poll of its own progress, not a test's synchronisation
        t2 = time.perf_counter()
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert len(starts) == len(ids), (len(starts), len(ids))
    handoffs = [starts[b] - ends[a] for a, b in zip(ids, ids[1:])]
    return {"jobs": len(ids), "put_s": t1 - t0, "drain_s": t2 - t1, "jobs_s": len(ids) / (t2 - t0),
            "handoffs": handoffs}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args(argv)
    results: dict[str, dict[str, list[dict]]] = {c: {"workflow": [], "independent": [], "no release": []}
                                                 for c in CASES}
    with tempfile.TemporaryDirectory(prefix="nq-workflows-bench-") as tmp:
        server = LocalServer(Path(tmp) / "server", redo_log_mb=96)
        server.start()
        try:
            dsn = config_mod.DSN.parse(server.dsn + "nq_wf")
            schema.init(dsn)
            admin = MySQLdb.connect(**dsn.connect_args(), autocommit=True)
            cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"}, overrides={"dsn": server.dsn + "nq_wf"})
            with Producer("wf", cfg) as producer:
                for rnd in range(a.rounds):
                    for case, make in CASES.items():
                        n = len(make())
                        plain = lambda: producer.put_many([{"i": i} for i in range(n)])  # noqa: E731
                        sides = {"workflow": lambda: producer.put_workflow(make()), "independent": plain,
                                 "no release": plain}
                        order = ["workflow", "independent", "no release"]
                        for side in order if rnd % 2 == 0 else order[::-1]:
                            release = workflows.release_statements
                            if side == "no release":  # the acks as before workflows
                                workflows.release_statements = lambda ids, token: []
                            try:
                                results[case][side].append(drain(cfg, admin, sides[side], a.workers, a.batch))
                            finally:
                                workflows.release_statements = release
            admin.close()
        finally:
            server.cleanup()
    report(results, a)
    return 0


def med(rows: list[dict], key: str) -> str:
    vals = [r[key] for r in rows]
    return f"{statistics.median(vals):,.2f} [{min(vals):,.2f}-{max(vals):,.2f}]"


def report(results: dict, a) -> None:
    print(f"{a.workers} workers, batch {a.batch}, {a.rounds} rounds (sides alternating); median [min-max]")
    print("| case | side | jobs | put s | drain s | jobs/s | jobs/s ratio (workflow/independent; independent/no release) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    out = {}
    for case, sides in results.items():
        ratios = [w["jobs_s"] / i["jobs_s"] for w, i in zip(sides["workflow"], sides["independent"])]
        price = [i["jobs_s"] / b["jobs_s"] for i, b in zip(sides["independent"], sides["no release"])]
        for side, rows in sides.items():
            ratio = {"workflow": ratios, "independent": price}.get(side)
            ratio = f"{statistics.median(ratio):.2f} [{min(ratio):.2f}-{max(ratio):.2f}]" if ratio else ""
            print(f"| {case} | {side} | {rows[0]['jobs']:,} | {med(rows, 'put_s')} | {med(rows, 'drain_s')} | "
                  f"{med(rows, 'jobs_s')} | {ratio} |")
        out[case] = {side: [{k: v for k, v in r.items() if k != "handoffs"} for r in rows]
                     for side, rows in sides.items()}
        out[case]["ratio_jobs_s"] = ratios
        out[case]["ratio_release_price"] = price
    handoffs = sorted(h * 1000 for r in results["chain of 1,000"]["workflow"] for h in r["handoffs"])
    p50, p99 = handoffs[len(handoffs) // 2], handoffs[int(len(handoffs) * 0.99)]
    print(f"\nchain hand-off (a parent's handler returned -> its child's started): p50 {p50:.2f} ms, "
          f"p99 {p99:.2f} ms over {len(handoffs)} hand-offs")
    out["chain_handoff_ms"] = {"p50": p50, "p99": p99, "n": len(handoffs)}
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:
        Path(a.json).write_text(text)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
