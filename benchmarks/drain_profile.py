#!/usr/bin/env python3
"""Where a draining consumer's CPU goes, per job, next to the seed's and the same-schema floor's.

    .venv/bin/python benchmarks/drain_profile.py --dsn mysql://root@127.0.0.1:3306/ [--n 20000] [--top 25]

Sides, each one process with one worker draining N no-op jobs put server-side, the order
reversed every other round: `notifyq consume --exit-when-empty` (one worker), the seed's loop
(_seed.py drain: its own table and claim), and the fewest statements on notifyq's own table
(_floor.py drain, the two-step claim notifyq uses). Reported per job: the process's CPU (µs,
median over the rounds, from the first handled job to the last: start-up left out), its voluntary context
switches (a reply waited for), and the server's statements (Questions; the whole server's: on a shared server, others' too). With
--callgrind N, each side's instructions per job in the thread that runs the jobs (drains of N
jobs and of none under valgrind): they do not move with the machine's load. Then one more notifyq run under cProfile (the worker's thread, where
the per-job work is): function calls per job, which do not depend on the machine's load, and
with --top the heaviest entries. One process alone, so claims never contend: what differs
from bench.py's drain of four is only the contention, and the per-job costs are the same.
It creates and drops a database of its own (nq_drain_profile).
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
import tempfile
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))
sys.path.append(str(REPO / "tests"))  # number_rows, as bench.py

import MySQLdb  # noqa: E402

import _seed  # noqa: E402
import _statements  # noqa: E402
from number_rows import numbers  # noqa: E402

from notifyq.config.dsn import DSN  # noqa: E402

DATABASE = "nq_drain_profile"
QUEUE = "bench"
SIDES = ("notifyq", "seed", "floor")
BATCH = 100
FILL = ("INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload) "
        "SELECT %s, 0, 0, NOW(6), 5, CONCAT('{\"user_id\":', seq, ',\"event\":\"signup\","
        "\"email\":\"user', seq, '@example.com\"}') FROM ")


def fill(admin, side: str, n: int) -> None:
    cur = admin.cursor()
    for table in ("nq_job", "nq_attempt", _seed.TABLE):
        cur.execute(f"TRUNCATE TABLE {table}")
    statement = _seed.FILL if side == "seed" else FILL
    for start in range(0, n, 100_000):
        cur.execute(statement + numbers(min(n, start + 100_000), start + 1), (QUEUE,))
    cur.execute("INSERT INTO nq_signal (queue, slot, seq) VALUES (%s, 0, %s) "
                "ON DUPLICATE KEY UPDATE seq = seq + VALUES(seq)", (QUEUE, n))


def argv_of(side: str, url: str, profile_out: str | None = None) -> list[str]:
    conn = {k: v for k, v in DSN.parse(url).connect_args().items() if k != "ssl"}
    if side == "seed":
        return [sys.executable, str(HERE / "_seed.py"), "drain",
                json.dumps({"conn": conn, "queue": QUEUE, "batch": BATCH, "handler": "noop"})]
    if side == "floor":
        return [sys.executable, str(HERE / "_floor.py"), "drain",
                json.dumps({"conn": conn, "queue": QUEUE, "batch": BATCH, "handler": "noop", "two_step": True})]
    consume = ["consume", "-q", QUEUE, "--handler", "_bench_handlers:noop", "--workers", "1",
               "--batch-size", str(BATCH), "--exit-when-empty"]
    if profile_out:
        return [sys.executable, __file__, "--child", profile_out, "--", *consume]
    return [sys.executable, "-m", "notifyq", *consume]


def callgrind_per_job(side: str, url: str, admin, n: int) -> float:
    """Instructions the thread that runs the jobs executes per job (valgrind's callgrind, one
    count per thread): a drain of n jobs less a drain of none, so start-up and exit cancel. A
    count does not drift with the machine's load as CPU time does; the consumer's other threads
    (its liveness keeper, the lineup watch) are left out, since theirs grow with the wall time.
    The thread that runs the jobs: the seed's and the floor's only one, notifyq's worker (the
    busiest thread but the main one, which imports everything)."""
    counts = []
    for jobs in (n, 0):
        fill(admin, side, jobs)
        env = {**os.environ, "NOTIFYQ_DSN": url, "NOTIFYQ_CONFIG": "/dev/null", "NOTIFYQ_LOG_LEVEL": "warning",
               "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO), str(REPO / "tests")])}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        with tempfile.TemporaryDirectory() as tmp:
            done = subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes",
                                   f"--callgrind-out-file={tmp}/cg.out", *argv_of(side, url)], env=env,
                                  cwd=str(HERE), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  timeout=1800)
            if done.returncode != 0:
                raise RuntimeError(f"{side} under callgrind exited {done.returncode}: {done.stderr[-2000:]}")
            per_thread = {}  # thread number -> instructions
            for path in Path(tmp).glob("cg.out*"):
                text = path.read_text(errors="replace")
                total = [line for line in text.splitlines() if line.startswith(("summary:", "totals:"))]
                thread = int(path.name.rsplit("-", 1)[1]) if "-" in path.name else 1
                if total:
                    per_thread[thread] = int(total[-1].split()[1])
        if not per_thread:
            raise RuntimeError(f"callgrind wrote no counts: {done.stderr[-2000:]}")
        others = {t: c for t, c in per_thread.items() if t != 1}
        counts.append(per_thread[1] if side != "notifyq" or not others else max(others.values()))
    return (counts[0] - counts[1]) / n


def run_side(side: str, url: str, admin, n: int, profile_out: str | None = None) -> dict:
    fill(admin, side, n)
    env = {**os.environ, "NOTIFYQ_DSN": url, "NOTIFYQ_CONFIG": "/dev/null", "NOTIFYQ_LOG_LEVEL": "warning",
           "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO), str(REPO / "tests")])}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    before = _statements.snapshot(admin)
    with tempfile.TemporaryDirectory() as records:
        env["NQB_OUT"] = records  # _bench_handlers: the CPU and time of the first and the last job
        proc = subprocess.Popen(argv_of(side, url, profile_out), env=env, cwd=str(HERE),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        span = [json.loads(p.read_text()) for p in Path(records).glob("*.json")]
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{side} exited {proc.returncode}: {err[-2000:]}")
    counts = _statements.delta(before, _statements.snapshot(admin))
    cur = admin.cursor()
    cur.execute(f"SELECT COUNT(*) FROM {_seed.TABLE if side == 'seed' else 'nq_job'}")
    left = cur.fetchone()[0]
    if left:
        raise RuntimeError(f"{side} left {left} jobs")
    if len(span) != 1 or len(span[0]["ids"]) != n:
        raise RuntimeError(f"{side} ran {sum(len(s['ids']) for s in span)} jobs, expected {n}")
    (span,) = span
    return {"cpu_us": (span["cpu_last"] - span["cpu_first"]) / n * 1e6, "waits": usage.ru_nvcsw / n,
            "statements": counts["Questions"] / n, "jobs_s": n / (span["last"] - span["first"])}


def child(out: str, consume: list[str]) -> None:
    """`notifyq consume` with its worker's thread under cProfile: the stats to `out` at exit."""
    from notifyq.consume import worker
    from notifyq.run.cli import main

    profile = cProfile.Profile()
    run = worker.Worker.run

    def profiled(self) -> None:
        profile.enable()
        try:
            run(self)
        finally:
            profile.disable()
            profile.dump_stats(out)

    worker.Worker.run = profiled
    sys.argv = ["notifyq", *consume]
    main()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="mysql://root@127.0.0.1:3306/",
                    help="a root-like account (its database is not used)")
    ap.add_argument("--n", type=int, default=20000, help="jobs per drain")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--top", type=int, default=0, help="print cProfile's N heaviest entries")
    ap.add_argument("--callgrind", type=int, default=0, metavar="N",
                    help="instructions per job too, of drains of N jobs under valgrind (slow: 2000 takes a minute)")
    ap.add_argument("--json", dest="json_path", help="write the results here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    if "--child" in argv:  # the profiled consumer: what follows "--" is its command line
        split = argv.index("--")
        a = ap.parse_args(argv[:split])
        child(a.child, argv[split + 1:])
        return 0
    a = ap.parse_args(argv)

    args = DSN.parse(a.dsn).connect_args()
    args.pop("database", None)
    admin = MySQLdb.connect(**args, autocommit=True)
    url = urllib.parse.urlsplit(a.dsn)._replace(path="/" + DATABASE).geturl()
    from notifyq.store import schema

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "notifyq"), str(HERE)], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        schema.init(DSN.parse(url))
        admin.select_db(DATABASE)
        admin.cursor().execute(_seed.DDL)
        admin.cursor().execute("INSERT IGNORE INTO nq_queue (queue) VALUES (%s)", (QUEUE,))
        runs: dict[str, list[dict]] = {side: [] for side in SIDES}
        for rnd in range(a.rounds):
            for side in SIDES if rnd % 2 == 0 else reversed(SIDES):
                runs[side].append(run_side(side, url, admin, a.n))
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "worker.prof")
            run_side("notifyq", url, admin, a.n, profile_out=out)
            stats = pstats.Stats(out, stream=io.StringIO())
            calls = stats.total_calls / a.n
            top = ""
            if a.top:
                shown = io.StringIO()
                pstats.Stats(out, stream=shown).strip_dirs().sort_stats("tottime").print_stats(a.top)
                top = shown.getvalue()
        results = {side: {key: statistics.median(r[key] for r in runs[side]) for key in runs[side][0]}
                   for side in SIDES}
        for side in SIDES:
            results[side]["cpu_us_all"] = [round(r["cpu_us"], 1) for r in runs[side]]
        results["notifyq"]["calls_per_job"] = calls
        if a.callgrind:
            for side in SIDES:
                results[side]["k_instructions_per_job"] = callgrind_per_job(side, url, admin, a.callgrind) / 1000
        print(f"{'side':<9} {'CPU us/job':>11} {'all rounds':>22} {'waits/job':>10} {'stmts/job':>10} "
              f"{'calls/job':>10} {'k instr/job':>12} {'jobs/s':>8}")
        for side in SIDES:
            r = results[side]
            shown_calls = f"{r['calls_per_job']:.1f}" if "calls_per_job" in r else "-"
            instr = f"{r['k_instructions_per_job']:.1f}" if "k_instructions_per_job" in r else "-"
            print(f"{side:<9} {r['cpu_us']:>11.1f} {str(r['cpu_us_all']):>22} {r['waits']:>10.3f} "
                  f"{r['statements']:>10.3f} {shown_calls:>10} {instr:>12} {r['jobs_s']:>8.0f}")
        for metric, key in (("CPU", "cpu_us"), ("instructions", "k_instructions_per_job")):
            if key in results["seed"]:
                print(f"notifyq / seed {metric}: {results['notifyq'][key] / results['seed'][key]:.2f}; "
                      f"notifyq / floor: {results['notifyq'][key] / results['floor'][key]:.2f}")
        if top:
            print(f"\n--- notifyq worker thread: cProfile, heaviest by own time ---\n{top}")
        if a.json_path:
            Path(a.json_path).write_text(json.dumps(results, indent=2))
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        admin.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
