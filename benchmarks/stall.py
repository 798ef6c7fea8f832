#!/usr/bin/env python3
"""The longest stall: how long ready jobs ever wait while no handler starts, under a web app's load.

    .venv/bin/python benchmarks/stall.py [--dsn mysql://root@host:port/] [--minutes 10]
        [--producers 8] [--consumers 3] [--gap-s 0.05] [--json out.json]

Without --dsn it starts a private throwaway MariaDB. The documented web setup: every producer is
a process of its own holding one `Producer(queue, config, ring=True)` for its life, putting one
job at a time at uniform random gaps of 0..2 x --gap-s (one every --gap-s on average). One of
them holds the queue's bell; the others wake the idle watcher with the instant wake (KILL QUERY
of its wait). A few `notifyq consume` processes (one worker each, default settings) serve the
queue; the handler is benchmarks/wakeup.py's `record`, which stamps its first line with
CLOCK_MONOTONIC, as each producer stamps put() returning (the same clock in every process).

The figure: the longest span in which at least one job was ready (its put() had returned) and no
handler started. Idle consumers waiting for a wake-up they missed, or a consumer stuck in a read,
show here; a busy fleet starts a handler every few ms. It must stay under 1 s. Also shown: the
pick-up latency (put() returned to handler start), and the consumers' log lines that say they
stalled (the `stalled:` WARNINGs of consume/stall.py and consume/worker.py).
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
BOUND_S = 1.0  # the longest stall allowed
STALL_LOG = "stalled:"  # the consumers' stall warnings (consume/stall.py, consume/worker.py)


def child(seconds: float, gap_s: float, seed: int, out: str) -> int:
    """One producer process: warm up, say ready, wait for "go" on stdin, then put jobs for
    `seconds`, writing "job_id put_returned_at" per job to `out`."""
    from notifyq import config as config_mod
    from notifyq.produce.producer import Producer

    cfg = config_mod.load()
    rng = random.Random(seed)
    with Producer(QUEUE, cfg, ring=True) as producer, open(out, "w") as f:
        producer.put({"warm": seed})  # connections; the first producer to put arms the bell
        print("ready", flush=True)
        sys.stdin.readline()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(rng.uniform(0, 2 * gap_s))
            job_id = producer.put({})
            f.write(f"{job_id} {time.monotonic():.6f}\n")
    return 0


def collect(rx: socket.socket, started: dict[int, float], stop: threading.Event) -> None:
    rx.settimeout(0.2)
    while not stop.is_set():
        try:
            got, at = rx.recv(128).decode().split()
        except socket.timeout:
            continue
        started[int(got)] = float(at)


def longest_stall(puts: dict[int, float], started: dict[int, float], end: float) -> tuple[float, float]:
    """(the longest span with a job ready and no handler start, when it began, monotonic).

    Between two consecutive handler starts s0 < s1, the jobs still ready are those that start at
    s1 or later; the span without a start while one of them was ready runs from max(s0, the
    earliest put among them) to s1. A job that never started counts until `end`."""
    order = sorted(puts, key=lambda j: started.get(j, end))
    starts = [started.get(j, end) for j in order]
    earliest_put_after = [0.0] * len(order)  # min put time over order[i:]
    low = float("inf")
    for i in range(len(order) - 1, -1, -1):
        low = min(low, puts[order[i]])
        earliest_put_after[i] = low
    worst, at = 0.0, 0.0
    for i in range(len(order)):
        previous = starts[i - 1] if i else earliest_put_after[0]
        begin = max(previous, earliest_put_after[i])
        if starts[i] - begin > worst:
            worst, at = starts[i] - begin, begin
    return worst, at


def run(root_dsn: str, workdir: Path, args) -> dict:
    from _stats import pct
    from wakeup import Admin, Env, Fleet, settled, wait_until

    from notifyq.config import DSN
    from notifyq.store import schema

    env = Env(root_dsn, f"nq_bench_{uuid.uuid4().hex[:10]}", workdir)
    schema.init(DSN.parse(env.dsn()))
    admin = Admin(env)
    sock = str(workdir / "rx.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    rx.bind(sock)
    started: dict[int, float] = {}
    stop = threading.Event()
    receiver = threading.Thread(target=collect, args=(rx, started, stop), daemon=True)
    receiver.start()
    procs: list[subprocess.Popen] = []
    seconds = args.minutes * 60
    outs = [workdir / f"puts-{i}.txt" for i in range(args.producers)]
    try:
        with Fleet(env, args.consumers, {}, sock) as fleet:
            wait_until(lambda: settled(admin, env, args.consumers, True), 90, "idle consumers", fleet)
            child_env = {**os.environ, "NOTIFYQ_CONFIG": "/dev/null", "NOTIFYQ_DSN": env.dsn(),
                         "NOTIFYQ_LOG_LEVEL": "warning", "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)])}
            for i in range(args.producers):
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, "--child", "--minutes", str(args.minutes), "--gap-s",
                     str(args.gap_s), "--seed", str(args.seed * 100 + i), "--out", str(outs[i])],
                    env=child_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            for p in procs:
                if p.stdout.readline().strip() != "ready":
                    raise RuntimeError("a producer did not start")
            wait_until(lambda: settled(admin, env, args.consumers, True), 90, "idle consumers", fleet)
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            for p in procs:
                p.communicate(timeout=seconds + 120)
            if any(p.returncode for p in procs):
                raise RuntimeError(f"a producer failed: {[p.returncode for p in procs]}")
            puts = {int(j): float(t) for out in outs for j, t in (line.split() for line in out.read_text().splitlines())}
            # Every job's handler, within the bound after the last put (a stall past it shows below)
            with contextlib.suppress(RuntimeError):
                wait_until(lambda: puts.keys() <= started.keys(), 60, "every job's handler", fleet)
            end = time.monotonic()
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
            admin.query(f"DROP DATABASE IF EXISTS `{env.database}`")
            admin.conn.close()
    stall_s, stall_at = longest_stall(puts, started, end)
    first_put = min(puts.values())
    ms = [(started[j] - t) * 1e3 for j, t in puts.items() if j in started]
    log_text = (workdir / "consumers.log").read_text(errors="replace")
    return {"jobs": len(puts), "never_started": len(puts.keys() - started.keys()),
            "longest_stall_s": round(stall_s, 3), "stall_began_after_s": round(stall_at - first_put, 1),
            "pickup_p50_ms": round(pct(ms, 50), 2), "pickup_p99_ms": round(pct(ms, 99), 2),
            "pickup_max_ms": round(max(ms), 2),
            "stall_warnings_logged": log_text.count(STALL_LOG),
            "consumer_log_warnings": sum(1 for line in log_text.splitlines() if "WARNING" in line),
            "loadavg_1m_after": round(os.getloadavg()[0], 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", default=os.environ.get("NOTIFYQ_DSN"),
                    help="root DSN of a server to use (default: a private throwaway MariaDB)")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--producers", type=int, default=8)
    ap.add_argument("--consumers", type=int, default=3, help="consumer processes (one worker each)")
    ap.add_argument("--gap-s", type=float, default=0.05, help="each producer's mean gap between puts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.minutes <= 0 or args.producers < 1 or args.consumers < 1 or args.gap_s <= 0:
        print("stall.py: --minutes, --producers, --consumers and --gap-s must be positive", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    if args.child:
        return child(args.minutes * 60, args.gap_s, args.seed, args.out)
    from notifyq.run.localserver import LocalServer

    workdir = Path(tempfile.mkdtemp(prefix="nq-stall-bench-"))
    try:
        if args.dsn:
            result = run(args.dsn, workdir, args)
        else:
            with LocalServer(workdir / "server") as server:
                result = run(server.dsn, workdir, args)
    finally:
        shutil.rmtree(workdir, True)
    result = {"minutes": args.minutes, "producers": args.producers, "consumers": args.consumers,
              "gap_s": args.gap_s, "bound_s": BOUND_S, "cpus": os.cpu_count(), **result}
    print("| minutes | producers | consumers | jobs | longest stall s | p50 ms | p99 ms | max ms | stall warnings |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.minutes:g} | {args.producers} | {args.consumers} | {result['jobs']} | "
          f"{result['longest_stall_s']:.3f} | {result['pickup_p50_ms']:.2f} | {result['pickup_p99_ms']:.2f} | "
          f"{result['pickup_max_ms']:.2f} | {result['stall_warnings_logged']} |")
    verdict = "ok" if result["longest_stall_s"] < BOUND_S and not result["never_started"] else "STALLED"
    print(f"{verdict}: longest stall {result['longest_stall_s']:.3f} s (bound {BOUND_S:g} s), "
          f"{result['never_started']} jobs never started; load 1m after: {result['loadavg_1m_after']}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    else:
        print(json.dumps(result))
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
