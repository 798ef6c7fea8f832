#!/usr/bin/env python3
"""Head-of-line blocking: one long job put first, then quick ones, on idle consumers. How late
does each quick job start after its put?

    .venv/bin/python benchmarks/head_of_line.py [--dsn mysql://root@host:port/] [--rounds 3]
        [--long-s 4] [--quick 8] [--quick-s 0.01] [--targets 0,0.05] [--drain] [--json out.json]

Without --dsn a private MariaDB (LocalServer) is started in a temp dir; with it, a database of
its own is created and dropped. Two set-ups of real `notifyq consume` processes (default
settings, batch_size 100): 4 workers in one process, and 2 processes of 1 worker. Per round,
once every consumer idles (the watch lock held): one put_many of the long job (--long-s) then
--quick jobs of --quick-s each, in one transaction, so the first claim sees them all; each
quick job's delay is its handler's start (wall clock, same host) minus the put's return.
Each set-up runs with every --targets value of the queues' batch_target_s: 0 is the rule off
(claims of batch_size run in order: the code before it), 0.05 the default. Target: with the
rule on, every quick job starts within 250 ms of its put.

--drain also runs bench.py's drain (20,000 quick jobs, 4 consumer processes, notifyq against
the seed floor in the same run) and reports its notifyq/seed ratio; target >= 1.0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

import MySQLdb  # noqa: E402

import notifyq  # noqa: E402
from notifyq import config as config_mod  # noqa: E402
from notifyq.config.dsn import DSN  # noqa: E402
from notifyq.store import schema  # noqa: E402
from notifyq.store.locks import QueueLocks  # noqa: E402

QUEUE = "hol"
TARGET_MS = 250.0
SETUPS = (("4 workers x 1 process", 1, 4), ("1 worker x 2 processes", 2, 1))


class Run:
    def __init__(self, dsn: DSN, workdir: Path):
        self.dsn = dsn
        self.workdir = workdir
        self.url = f"mysql://{dsn.user}@{dsn.host}:{dsn.port}/{dsn.database}"
        self.env_base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        if dsn.password:
            self.env_base["NOTIFYQ_PASSWORD"] = dsn.password
        self.cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null", **({"NOTIFYQ_PASSWORD": dsn.password}
                                                                           if dsn.password else {})},
                                   overrides={"dsn": self.url, "log": {"level": "warning"}})
        args = dsn.connect_args()
        self.admin = MySQLdb.connect(**args, autocommit=True)

    def scalar(self, sql: str, params=None):
        cur = self.admin.cursor()
        cur.execute(sql, params)
        row = cur.fetchone()
        return row[0] if row else None

    def wait(self, predicate, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")
            time.sleep(0.02)

    def start(self, procs: int, workers: int, target_s: float, out: Path) -> list[subprocess.Popen]:
        conf = out / "notifyq.toml"
        conf.write_text(f"[defaults]\nbatch_target_s = {target_s}\n[log]\nlevel = \"warning\"\n")
        env = {**self.env_base, "NOTIFYQ_DSN": self.url, "NOTIFYQ_CONFIG": str(conf), "NQB_OUT": str(out),
               "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO), self.env_base.get("PYTHONPATH", "")])}
        with open(out / "consumers.err", "ab") as err:
            return [subprocess.Popen([sys.executable, "-m", "notifyq", "consume", "-q", QUEUE, "--handler",
                                      "_hol_handler:timed", "--workers", str(workers)],
                                     env=env, cwd=str(HERE), stdout=subprocess.DEVNULL, stderr=err)
                    for _ in range(procs)]

    def idle(self, procs: int) -> bool:
        watch = QueueLocks(self.dsn.database, QUEUE).watch
        return (self.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = %s", (QUEUE,)) == 0
                and self.scalar("SELECT COUNT(*) FROM nq_consumer") == procs
                and self.scalar("SELECT IS_USED_LOCK(%s)", (watch,)) is not None)

    @staticmethod
    def starts(out: Path) -> dict[int, float]:
        found: dict[int, float] = {}
        for path in out.glob("*.log"):
            for line in path.read_text().splitlines():
                job_id, at = line.split()
                found.setdefault(int(job_id), float(at))
        return found

    def setup(self, name: str, procs: int, workers: int, target_s: float, rounds: int,
              long_s: float, quick: int, quick_s: float) -> dict:
        out = Path(tempfile.mkdtemp(prefix="hol-", dir=self.workdir))
        consumers = self.start(procs, workers, target_s, out)
        delays: list[list[float]] = []
        try:
            for _ in range(rounds):
                self.wait(lambda: self.idle(procs), 60, "idle consumers")
                with notifyq.Producer(QUEUE, self.cfg) as producer:
                    ids = producer.put_many([{"sleep_s": long_s}] + [{"sleep_s": quick_s}] * quick)
                    put_at = time.time()
                self.wait(lambda: set(ids) <= set(self.starts(out)), 60 + long_s, "every job started")
                seen = self.starts(out)
                delays.append([(seen[i] - put_at) * 1000 for i in ids[1:]])
        finally:
            for p in consumers:
                p.send_signal(signal.SIGTERM)
            for p in consumers:
                p.wait(60)
            self.admin.cursor().execute("DELETE FROM nq_job WHERE queue = %s", (QUEUE,))
        flat = [d for r in delays for d in r]
        return {"setup": name, "batch_target_s": target_s, "rounds": rounds, "quick_jobs": len(flat),
                "median_ms": round(statistics.median(flat), 1), "max_ms": round(max(flat), 1),
                "per_round_max_ms": [round(max(r), 1) for r in delays],
                "worst_round_ms": [round(d, 1) for d in max(delays, key=max)],
                "met": max(flat) <= TARGET_MS}


def drain() -> dict:
    """bench.py's drain, notifyq against the seed floor in one run."""
    with tempfile.TemporaryDirectory(prefix="hol-drain-") as tmp:
        path = Path(tmp) / "drain.json"
        subprocess.run([sys.executable, str(HERE / "bench.py"), "--only", "drain", "--json", str(path)],
                       check=True, stdout=subprocess.DEVNULL)
        data = json.loads(path.read_text())
    return data


def ratio_of(data: dict) -> dict:
    """The drain's jobs/s, notifyq and the seed floor, and their ratio (median, min, max over
    bench.py's rounds, each ratio taken within its round)."""
    drained = data["drain"]
    return {"notifyq_jobs_s": drained["sides"]["notifyq"]["jobs_s"],
            "seed_jobs_s": drained["sides"]["seed"]["jobs_s"],
            "notifyq/seed": drained["ratios"]["notifyq/seed"]["jobs_s"],
            "notifyq/seed incl. start-up": drained["ratios"]["notifyq/seed"]["jobs_s_with_startup"]}


def run(url: str, workdir: Path, a) -> list[dict]:
    root = DSN.parse(url)
    dsn = dataclasses.replace(root, database=f"nq_hol_bench_{random.randrange(1 << 30):x}")
    schema.init(dsn)
    bench = Run(dsn, workdir)
    try:
        return [bench.setup(name, procs, workers, target, a.rounds, a.long_s, a.quick, a.quick_s)
                for name, procs, workers in SETUPS for target in a.targets]
    finally:
        bench.admin.cursor().execute(f"DROP DATABASE IF EXISTS `{dsn.database}`")
        bench.admin.close()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", help="a server to use (root-like user) instead of a private LocalServer")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--long-s", type=float, default=4.0, help="the long job's duration")
    ap.add_argument("--quick", type=int, default=8, help="quick jobs put after it")
    ap.add_argument("--quick-s", type=float, default=0.01, help="each quick job's duration")
    ap.add_argument("--targets", default="0,0.05", help="batch_target_s values to run each set-up with")
    ap.add_argument("--drain", action="store_true", help="also run bench.py's drain against the seed floor")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    a.targets = [float(t) for t in a.targets.split(",")]
    with tempfile.TemporaryDirectory(prefix="nq-hol-") as tmp:
        if a.dsn:
            rows = run(a.dsn, Path(tmp), a)
        else:
            from notifyq.run.localserver import LocalServer

            with LocalServer(Path(tmp) / "server") as server:
                rows = run(server.dsn, Path(tmp), a)
    result: dict = {"head_of_line": rows}
    print(f"one {a.long_s:g} s job, then {a.quick} jobs of {a.quick_s:g} s, put together; "
          f"start delay of each quick job after the put (target <= {TARGET_MS:g} ms)")
    print(f"{'set-up':<24} {'batch_target_s':>14} {'jobs':>5} {'median':>9} {'max':>9}  {'met':<4} worst round, ms")
    for r in rows:
        print(f"{r['setup']:<24} {r['batch_target_s']:>14g} {r['quick_jobs']:>5} {r['median_ms']:>7.1f}ms "
              f"{r['max_ms']:>7.1f}ms  {'yes' if r['met'] else 'NO':<4} {r['worst_round_ms']}")
    if a.drain:
        result["drain"] = ratio_of(drain())
        for k, v in result["drain"].items():
            print(f"drain of 20,000 quick jobs, 4 processes, {k}: median {v['median']:,.2f} "
                  f"[{v['min']:,.2f}-{v['max']:,.2f}]  (target notifyq/seed >= 1.0)")
    print(json.dumps(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
