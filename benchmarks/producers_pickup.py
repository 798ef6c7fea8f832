#!/usr/bin/env python3
"""Pick-up with several long-lived producers on one queue: a web app's worker processes.

    .venv/bin/python benchmarks/producers_pickup.py [--dsn mysql://root@host:port/] [--producers 8]
        [--jobs 60] [--max-gap-s 0.6] [--consumers 3] [--producer-user other] [--json out.json]

Without --dsn it starts a private throwaway MariaDB. Every producer is a process of its own
holding one `Producer(queue, config, ring=True)` for its life, as each worker process of a web
app would; they put jobs one at a time, each at uniform random gaps of 0..--max-gap-s, onto one
queue served by a few idle `notifyq consume` processes (one worker each). Default settings
everywhere (only the DSN is set). The latency is from put() returning to the handler's first
line, both stamped with CLOCK_MONOTONIC (the same clock in every process of the machine); the
handler is benchmarks/wakeup.py's `record`. One producer holds the queue's bell (the first to
put); the table shows each producer, marked `bell` when its puts rang.

--producer-user other: the producers log in as a second database user (the consumers keep
root), the case where a producer may not KILL QUERY the consumers' sessions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
QUEUE = "bench"  # wakeup.py's Fleet consumes this queue


def child(jobs: int, max_gap_s: float, seed: int) -> int:
    """One producer process: warm up, say ready, wait for "go" on stdin, then put `jobs` jobs and
    print "job_id put_returned_at" per job, then "rings N" (the bell's rings among them)."""
    from notifyq import config as config_mod
    from notifyq.produce.producer import Producer

    cfg = config_mod.load()
    rng = random.Random(seed)
    with Producer(QUEUE, cfg, ring=True) as producer:
        producer.put({"warm": seed})  # connections; the first producer to put arms the bell
        print("ready", flush=True)
        sys.stdin.readline()
        rings_before = producer._waker.bell.rings if producer._waker.bell is not None else 0
        for _ in range(jobs):
            time.sleep(rng.uniform(0, max_gap_s))
            job_id = producer.put({})
            print(f"{job_id} {time.monotonic():.9f}", flush=True)
        bell = producer._waker.bell
        print(f"rings {(bell.rings if bell is not None else 0) - rings_before}", flush=True)
    return 0


def collect(rx: socket.socket, started: dict[int, float], stop: threading.Event) -> None:
    rx.settimeout(0.2)
    while not stop.is_set():
        try:
            got, at = rx.recv(128).decode().split()
        except socket.timeout:
            continue
        started[int(got)] = float(at)


def stats(ms: list[float]) -> dict:
    from _stats import pct

    return {"jobs": len(ms), "p50_ms": round(pct(ms, 50), 2), "p99_ms": round(pct(ms, 99), 2),
            "max_ms": round(max(ms), 2)}


def run(root_dsn: str, workdir: Path, args) -> dict:
    from wakeup import Admin, Env, Fleet, settled, wait_until

    from notifyq.config import DSN
    from notifyq.store import schema

    env = Env(root_dsn, f"nq_bench_{uuid.uuid4().hex[:10]}", workdir)
    schema.init(DSN.parse(env.dsn()))
    admin = Admin(env)
    producer_dsn = env.dsn()
    if args.producer_user:
        password = uuid.uuid4().hex
        admin.query("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s", (args.producer_user, password))
        admin.query("CREATE USER IF NOT EXISTS %s@'localhost' IDENTIFIED BY %s", (args.producer_user, password))
        for host in ("%", "localhost"):
            admin.query(f"GRANT ALL ON `{env.database}`.* TO %s@%s", (args.producer_user, host))
        dsn = DSN.parse(env.dsn())
        producer_dsn = f"mysql://{args.producer_user}:{password}@{dsn.host}:{dsn.port}/{env.database}"
    sock = str(workdir / "rx.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(sock)
    started: dict[int, float] = {}
    stop = threading.Event()
    receiver = threading.Thread(target=collect, args=(rx, started, stop), daemon=True)
    receiver.start()
    procs: list[subprocess.Popen] = []
    try:
        with Fleet(env, args.consumers, {}, sock) as fleet:
            wait_until(lambda: settled(admin, env, args.consumers, True), 90, "idle consumers", fleet)
            child_env = {**os.environ, "NOTIFYQ_CONFIG": "/dev/null", "NOTIFYQ_DSN": producer_dsn,
                         "NOTIFYQ_LOG_LEVEL": "warning", "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)])}
            child_env.pop("NOTIFYQ_PASSWORD", None)
            for i in range(args.producers):
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, "--child", "--jobs", str(args.jobs),
                     "--max-gap-s", str(args.max_gap_s), "--seed", str(args.seed * 100 + i)],
                    env=child_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            for p in procs:
                if p.stdout.readline().strip() != "ready":
                    raise RuntimeError("a producer did not start")
            wait_until(lambda: settled(admin, env, args.consumers, True), 90, "idle consumers", fleet)
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            outputs = [p.communicate(timeout=args.jobs * (args.max_gap_s + 5) + 60)[0] for p in procs]
            if any(p.returncode for p in procs):
                raise RuntimeError(f"a producer failed: {[p.returncode for p in procs]}")
            puts = [[tuple(line.split()) for line in out.splitlines() if line and not line.startswith("rings")]
                    for out in outputs]
            rings = [int(next(line.split()[1] for line in out.splitlines() if line.startswith("rings")))
                     for out in outputs]
            wanted = {int(j) for per in puts for j, _ in per}
            wait_until(lambda: wanted <= started.keys(), 30, "every job's handler", fleet)
            fleet.check_alive()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        stop.set()
        receiver.join(5)
        rx.close()
        with contextlib.suppress(Exception):
            if args.producer_user:
                for host in ("%", "localhost"):
                    admin.query("DROP USER IF EXISTS %s@%s", (args.producer_user, host))
            admin.query(f"DROP DATABASE IF EXISTS `{env.database}`")
            admin.conn.close()
    per, every = [], []
    for i, (jobs, n_rings) in enumerate(zip(puts, rings)):
        ms = [(started[int(j)] - float(t)) * 1e3 for j, t in jobs]
        every += ms
        per.append({"producer": i + 1, "bell": n_rings > 0, **stats(ms)})
    return {"per_producer": per, "overall": stats(every), "loadavg_1m_after": round(os.getloadavg()[0], 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", default=os.environ.get("NOTIFYQ_DSN"),
                    help="root DSN of a server to use (default: a private throwaway MariaDB)")
    ap.add_argument("--producers", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=60, help="jobs per producer")
    ap.add_argument("--max-gap-s", type=float, default=0.6, help="each producer's gaps: uniform 0..this")
    ap.add_argument("--consumers", type=int, default=3, help="idle consumer processes")
    ap.add_argument("--producer-user", help="producers log in as this second database user")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    if args.child:
        return child(args.jobs, args.max_gap_s, args.seed)
    from notifyq.run.localserver import LocalServer

    workdir = Path(tempfile.mkdtemp(prefix="nq-producers-bench-"))
    try:
        if args.dsn:
            result = run(args.dsn, workdir, args)
        else:
            with LocalServer(workdir / "server") as server:
                result = run(server.dsn, workdir, args)
    finally:
        shutil.rmtree(workdir, True)
    result = {"producers": args.producers, "jobs_per_producer": args.jobs, "max_gap_s": args.max_gap_s,
              "consumers": args.consumers, "producer_user": args.producer_user or "the consumers'",
              "cpus": os.cpu_count(), **result}
    print("| producer | bell | jobs | p50 ms | p99 ms | max ms |")
    print("|---|---|---:|---:|---:|---:|")
    for r in result["per_producer"]:
        print(f"| {r['producer']} | {'yes' if r['bell'] else 'no'} | {r['jobs']} | {r['p50_ms']:.2f} | "
              f"{r['p99_ms']:.2f} | {r['max_ms']:.2f} |")
    o = result["overall"]
    print(f"| all | | {o['jobs']} | {o['p50_ms']:.2f} | {o['p99_ms']:.2f} | {o['max_ms']:.2f} |")
    print(f"load 1m after: {result['loadavg_1m_after']}")
    print(json.dumps(result))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
