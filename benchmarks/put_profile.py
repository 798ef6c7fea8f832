#!/usr/bin/env python3
"""What a producer's call costs on the client, next to the seed's: CPU, Python function calls
and, with --callgrind, instructions per job; with --top, cProfile's heaviest entries.

    .venv/bin/python benchmarks/put_profile.py --dsn mysql://root@127.0.0.1:3306/ [--callgrind] [--top 15]

Sides, each in a process of its own, the order reversed every other round: `put()` without and
with the ring and with no wake-up at all, `put_many()` of 100 without the ring, and the seed's loops (benchmarks/_seed.py:
json.dumps, cursor.execute, COMMIT), on the same server and payloads (_floor.payload). CPU per
job is the process's, median over the rounds; waits per job are its voluntary context switches
(each a reply it blocked for: the server sends each statement's reply as that statement ends,
so a query of two statements can wake the producer twice); calls per job are cProfile's count
(they do not depend on the machine's load); instructions (callgrind) are a run of N jobs less
a run of none, per job, interpreter start and connect taken off. jobs/s here is no benchmark
of the server (bench.py --only enqueue is): it only shows the run was sane.
It creates and drops a database of its own (nq_put_profile).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))
sys.path.append(str(REPO / "tests"))  # _floor's number_rows

import MySQLdb  # noqa: E402

import _seed  # noqa: E402
from _floor import payload  # noqa: E402

from notifyq.config.dsn import DSN  # noqa: E402

DATABASE = "nq_put_profile"
QUEUE = "bench"
# put_no_wake: instant_wake off, no ring: no look rides a COMMIT. The looks (one per QUIET_LOOK_S
# at most) come more often per put the slower the puts go, under callgrind most of all.
SIDES = ("put", "put_ring", "put_no_wake", "put_many", "seed_put", "seed_put_many")
CHUNK = 100


def _loop(side: str, url: str, n: int):
    """The timed loop of `side`, set up and warmed (its connection, the queue, the plans)."""
    if side.startswith("seed"):
        dsn = DSN.parse(url)
        conn = MySQLdb.connect(**dsn.connect_args(), autocommit=False)
        cur = conn.cursor()
        chunk = CHUNK if side == "seed_put_many" else 1

        def seed() -> None:
            for start in range(0, n, chunk):
                params: list = []
                for i in range(start, start + chunk):
                    params += (QUEUE, json.dumps(payload(i)))
                cur.execute(_seed.INSERT + ",".join([_seed.INSERT_ROW] * chunk), params)
                conn.commit()
        cur.execute(_seed.INSERT + _seed.INSERT_ROW, (QUEUE, json.dumps(payload(-1))))
        conn.commit()
        return seed, conn.close

    from notifyq import config as config_mod
    from notifyq.produce.producer import Producer

    wakeup = {"wakeup": {"instant_wake": False}} if side == "put_no_wake" else {}
    config = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"}, overrides={"dsn": url, **wakeup})
    producer = Producer(QUEUE, config, ring=side == "put_ring")
    producer.put(payload(-1))

    def put() -> None:
        for i in range(n):
            producer.put(payload(i))

    def put_many() -> None:
        for start in range(0, n, CHUNK):
            producer.put_many([payload(i) for i in range(start, start + CHUNK)])
    return (put_many if side == "put_many" else put), producer.close


def child(side: str, url: str, n: int, how: str, top: int) -> dict:
    """One side's run in this process: 'time' (CPU, wall), 'profile' (cProfile), 'bare' (for
    callgrind: the loop and nothing else)."""
    loop, close = _loop(side, url, n)
    result: dict = {}
    if how == "time":
        t0, c0, w0 = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
        loop()
        result = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                  "waits": resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - w0}
    elif how == "profile":
        profile = cProfile.Profile()
        profile.runcall(loop)
        stats = pstats.Stats(profile, stream=io.StringIO())
        result = {"calls": stats.total_calls}
        if top:
            out = io.StringIO()
            pstats.Stats(profile, stream=out).strip_dirs().sort_stats("tottime").print_stats(top)
            result["top"] = out.getvalue()
    elif how == "bare":
        loop()
    close()
    return result


def run_child(side: str, url: str, n: int, how: str, top: int = 0, callgrind: bool = False) -> dict | int:
    argv = [sys.executable, __file__, "--child", side, "--dsn", url, "--n", str(n), "--how", how, "--top", str(top)]
    if callgrind:
        argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{side} {how} exited {done.returncode}: {done.stderr[-2000:]}")
    if callgrind:
        for line in done.stderr.splitlines():
            if "Collected :" in line:
                return int(line.rsplit(":", 1)[1])
        raise RuntimeError(f"callgrind printed no count: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="mysql://root@127.0.0.1:3306/",
                    help="a root-like account (its database is not used)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--put-n", type=int, default=2000, help="jobs per put() run")
    ap.add_argument("--bulk-n", type=int, default=20000, help="jobs per put_many() run")
    ap.add_argument("--callgrind", action="store_true", help="instructions per job too (slow: valgrind)")
    ap.add_argument("--top", type=int, default=0, help="print cProfile's N heaviest entries of each side")
    ap.add_argument("--json", dest="json_path", help="write the results here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--how", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.dsn, a.n, a.how, a.top)))
        return 0

    args = DSN.parse(a.dsn).connect_args()
    args.pop("database", None)
    admin = MySQLdb.connect(**args, autocommit=True)
    url = urllib.parse.urlsplit(a.dsn)._replace(path="/" + DATABASE).geturl()  # its own database
    from notifyq.store import schema

    try:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        schema.init(DSN.parse(url))
        admin.select_db(DATABASE)
        admin.cursor().execute(_seed.DDL)
        sizes = {side: a.bulk_n if side.endswith("many") else a.put_n for side in SIDES}
        cpu: dict[str, list[float]] = {side: [] for side in SIDES}
        waits: dict[str, list[float]] = {side: [] for side in SIDES}
        rate: dict[str, list[float]] = {side: [] for side in SIDES}
        for rnd in range(a.rounds):
            for side in SIDES if rnd % 2 == 0 else reversed(SIDES):
                r = run_child(side, url, sizes[side], "time")
                cpu[side].append(r["cpu_s"] / sizes[side] * 1e6)
                waits[side].append(r["waits"] / sizes[side])
                rate[side].append(sizes[side] / r["wall_s"])
        results: dict = {}
        for side in SIDES:
            prof = run_child(side, url, sizes[side], "profile", a.top)
            results[side] = {"cpu_us_per_job": statistics.median(cpu[side]), "cpu_us_all": cpu[side],
                             "jobs_s": statistics.median(rate[side]),
                             "waits_per_job": statistics.median(waits[side]),
                             "calls_per_job": prof["calls"] / sizes[side]}
            if a.callgrind:
                n = sizes[side] // 4
                count = (run_child(side, url, n, "bare", callgrind=True)
                         - run_child(side, url, 0, "bare", callgrind=True))
                results[side]["instructions_per_job"] = count / n
            if a.top:
                results[side]["top"] = prof["top"]
        print(f"{'side':<15} {'CPU us/job':>11} {'waits/job':>10} {'calls/job':>10} {'k instr/job':>12} {'jobs/s':>8}")
        for side, r in results.items():
            instr = f"{r['instructions_per_job'] / 1000:.1f}" if "instructions_per_job" in r else "-"
            print(f"{side:<15} {r['cpu_us_per_job']:>11.1f} {r['waits_per_job']:>10.2f} {r['calls_per_job']:>10.1f} "
                  f"{instr:>12} {r['jobs_s']:>8.0f}")
        for nq, seed in (("put", "seed_put"), ("put_ring", "seed_put"), ("put_no_wake", "seed_put"),
                         ("put_many", "seed_put_many")):
            line = f"{nq} / seed: CPU {results[nq]['cpu_us_per_job'] / results[seed]['cpu_us_per_job']:.2f}"
            if a.callgrind:
                ratio = results[nq]["instructions_per_job"] / results[seed]["instructions_per_job"]
                line += f", instructions {ratio:.2f}"
            print(line)
        if a.top:
            for side, r in results.items():
                print(f"\n--- {side}: cProfile, heaviest by own time ---\n{r['top']}")
        if a.json_path:
            Path(a.json_path).write_text(json.dumps(results, indent=2))
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        admin.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
