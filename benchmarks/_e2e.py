"""End to end under load, for bench.py: long-lived producers (bell holders) offer a fraction of
the drain rate to 4 idle consumer processes; latency is handler start - the job's COMMIT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _procs import machine_jiffies, proc_cpu_s, wait_rusage
from _stats import pct, summary

from notifyq.config import WakeupConfig

HERE = Path(__file__).resolve().parent


def e2e_once(bench, rate: float, duration: float, warmup: float, tick: float) -> dict:
    k, p = bench.size["consumers"], bench.size["producers"]
    bench.reset()
    out = bench.outdir()
    consumers = [bench.spawn(bench.consumer_argv("notifyq", "stamp"), out) for _ in range(k)]
    try:
        deadline = time.monotonic() + 60
        while bench.scalar("SELECT COUNT(*) FROM nq_consumer") < k:
            if time.monotonic() > deadline:
                raise RuntimeError("consumers did not register within 60 s")
            time.sleep(0.05)
        time.sleep(1.0)  # let them go idle: one watches, the others queue behind it
        files = [out / f"producer{i}.ids" for i in range(p)]
        settle = WakeupConfig().poll_max_s + 0.5
        producers = [
            bench.spawn([sys.executable, str(HERE / "_nqchild.py"), "paced", json.dumps(
                {"dsn": bench.url, "queue": bench.queue, "rate": rate / p, "duration_s": warmup + duration,
                 "out": str(f), "ring": True, "tick_s": tick, "settle_s": settle})],
                       stdout=subprocess.DEVNULL)
            for f in files]
        time.sleep(settle + 0.2)
        busy0, total0 = machine_jiffies()
        srv0, t0 = proc_cpu_s(bench.server_pid), time.monotonic()
        for proc in producers:
            wait_rusage(proc, warmup + duration + 120)
            if proc.returncode != 0:
                raise RuntimeError(f"producer failed{bench.log_tail()}")
        busy1, total1 = machine_jiffies()
        srv1, t1 = proc_cpu_s(bench.server_pid), time.monotonic()
        deadline = time.monotonic() + 120
        while bench.scalar("SELECT COUNT(*) FROM nq_job") > 0:
            if time.monotonic() > deadline:
                raise RuntimeError("e2e: jobs left after 120 s")
            time.sleep(0.02)
    finally:
        for proc in consumers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in consumers:
            wait_rusage(proc, 90)
    commits = {}
    for f in files:
        d = json.loads(f.read_text())
        commits.update(zip(d["ids"], d["commits"]))
    starts = {}
    dupes = 0
    for r in bench.records(out):
        for i, t in zip(r["ids"], r["stamps"]):
            if i in starts:
                dupes += 1
            starts.setdefault(i, t)
    starts = {i: t for i, t in starts.items() if i in commits}  # drop the warm-up jobs
    if dupes or set(starts) != set(commits):
        raise RuntimeError(f"e2e: {dupes} duplicates, {len(set(commits) - set(starts))} missing")
    t_begin = min(commits.values())
    # Only jobs committed after the warm-up count (reported apart): service under load, not
    # the fleet finding its rhythm. The producers held the bell before their clock started.
    measured = {i: c for i, c in commits.items() if c >= t_begin + warmup}
    lat = [(starts[i] - c) * 1e3 for i, c in measured.items()]
    first = [(starts[i] - c) * 1e3 for i, c in commits.items() if c < t_begin + warmup]
    return {"offered_jobs_s": rate,
            "achieved_jobs_s": len(measured) / (max(measured.values()) - min(measured.values())),
            "jobs": len(measured), "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95),
            "p99_ms": pct(lat, 99), "max_ms": max(lat), "warmup_jobs": len(first),
            "warmup_max_ms": max(first) if first else None,
            # Everything on the machine while producers ran (server, producers, consumers,
            # and anything else running): how close "N % of the drain rate" is to saturation.
            "cpu_busy_cores": (busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1),
            "server_cores": (srv1 - srv0) / (t1 - t0) if srv0 is not None else None}

def e2e(bench, drain_rate: float) -> dict:
    """Offered load as a fraction of the drain rate measured above (no producers then)."""
    out = {}
    for load in bench.size["e2e_loads"]:
        reps = [e2e_once(bench, load * drain_rate, bench.size["e2e_s"], bench.size["e2e_warmup_s"],
                              bench.size["e2e_tick_s"]) for _ in range(bench.size["e2e_reps"])]
        metrics = ("offered_jobs_s", "achieved_jobs_s", "p50_ms", "p95_ms", "p99_ms", "warmup_max_ms",
                   "cpu_busy_cores", "server_cores")
        out[f"{round(load * 100)}%"] = {"raw": reps, **{m: summary([r[m] for r in reps]) for m in metrics}}
    return out
