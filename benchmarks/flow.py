"""Flow control's benchmarks (docs/flow-control.md): what limits and fairness cost, and what they
buy. Each case fills a queue server-side, starts consumer processes (`notifyq consume`, one
worker each, a handler that records each job's start and end), and waits until every job is
gone; rates are jobs over the span from the first start to the last end.

  unkeyed   jobs without a key, this tree against --baseline's (a checkout of main) in one
            sitting, rounds alternating; each tree on a database its own `init` made (main's
            has no ix_key): what an unkeyed job pays for flow control. Target >= 0.97x.
  keyed     100 keys x N/100 jobs, limit_per_key = 2, against the same jobs without a limit,
            by turns: the ratio of the medians, and the median of each round's ratio (its two
            drains back to back). Target >= 0.8x.
  freed     one key, limit_per_key = 1, two consumer processes: from a job's end to the start
            of the next (the slot its ack freed, the hand-off's wake, the claim). Target p50
            <= 10 ms.
  fairness  50,000 jobs of key A enqueued before 10 of key B, fair = true: where B's last job
            starts in the drain's order. Target: within the first 5 %.

    .venv/bin/python benchmarks/flow.py --baseline ../main            # every case
    .venv/bin/python benchmarks/flow.py --only fairness --quick
    .venv/bin/python benchmarks/flow.py --only keyed --medium --code ../main --account

--code runs the keyed, freed and fairness cases on another checkout's code (this benchmark's
harness and handler, that tree's notifyq): old and new by turns with one script. --account adds,
for each drain, where its time went: the server's status counters per job, and a probe in each
consumer (_flow_probe.py) per claim: round trips, statements, jobs taken, claims that peers' key
locks left short, and each worker's time in claims, batch runs and idle waits.

Prints a table and, last, one JSON line. Needs a MariaDB with the sequence engine (seq_1_to_N)
at --dsn's server (root: it creates and drops its databases).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import MySQLdb

from _db import server_pid, sql_once
from _procs import proc_cpu_s

HERE = Path(__file__).resolve().parent
TREE = HERE.parent
QUEUE = "q"
FILL_CHUNK = 10_000


class Side:
    """One source tree on one database of its own."""

    def __init__(self, name: str, tree: Path, server: dict, database: str, account: bool = False):
        self.name, self.tree, self.server, self.database = name, tree, server, database
        self.account = account
        self.accounts: list[dict] = []  # --account: each drain's (account())
        self.url = (f"mysql://{server['user']}@{server['host']}:{server['port']}/{database}")

    def sql(self, statement: str, params=None) -> list[tuple]:
        return sql_once({**self.server, "database": self.database}, statement, params)

    def env(self, out: str, config: str) -> dict:
        return {**os.environ, "PYTHONPATH": f"{self.tree}{os.pathsep}{HERE}", "NOTIFYQ_DSN": self.url,
                "NOTIFYQ_CONFIG": config, "NQB_OUT": out, **({"NQB_PROBE": "1"} if self.account else {})}

    def status(self) -> dict[str, int]:
        """The server's global status counters (--account: a drain's are the difference), and its
        process's CPU seconds (server_cpu_s) when it runs on this machine."""
        out = {name: int(value) for name, value in self.sql("SHOW GLOBAL STATUS")
               if str(value).lstrip("-").isdigit()}
        cpu = proc_cpu_s(server_pid({**self.server, "database": self.database}))
        if cpu is not None:
            out["server_cpu_s"] = cpu
        return out

    def init(self) -> None:
        conn = MySQLdb.connect(**self.server, autocommit=True)
        try:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{self.database}`")
            conn.cursor().execute(f"CREATE DATABASE `{self.database}`")
        finally:
            conn.close()
        subprocess.run([sys.executable, "-m", "notifyq", "init"], env=self.env("", os.devnull), check=True,
                       cwd=self.tree, stdout=subprocess.DEVNULL)

    def drop(self) -> None:
        conn = MySQLdb.connect(**self.server, autocommit=True)
        try:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{self.database}`")
        finally:
            conn.close()

    def fill(self, groups: list[tuple[str | None, int]]) -> None:
        """Ready jobs, in this order: (key or None, how many) each; the key set where the
        schema has the column."""
        keyed = any(k is not None for k, _ in groups)
        for key, n in groups:
            for start in range(0, n, FILL_CHUNK):
                hi = min(n, start + FILL_CHUNK)
                cols = "queue, status, priority, run_at, max_attempts, payload" + (", job_key" if keyed else "")
                vals = "%s, 0, 0, NOW(6), 5, CONCAT('{\"n\":', seq, '}')" + (", %s" if keyed else "")
                self.sql(f"INSERT INTO nq_job ({cols}) SELECT {vals} FROM seq_{start + 1}_to_{hi}",
                         (QUEUE, key) if keyed else (QUEUE,))
        total = sum(n for _, n in groups)
        self.sql("INSERT INTO nq_signal (queue, slot, seq) VALUES (%s, 0, %s) "
                 "ON DUPLICATE KEY UPDATE seq = seq + VALUES(seq)", (QUEUE, total))

    def drain(self, consumers: int, queue_conf: dict, batch: int, timeout_s: float = 600,
              label: str = "") -> list[tuple]:
        """Consumer processes until the queue is empty; each job's (id, start, end)."""
        before = self.status() if self.account else None
        with tempfile.TemporaryDirectory(prefix="nqflow-") as out:
            config = Path(out) / "notifyq.toml"
            lines = [f"[queue.{QUEUE}]", f"handler = \"_flow_handlers:record\"", f"batch_size = {batch}"]
            lines += [f"{k} = {json.dumps(v)}" for k, v in queue_conf.items()]
            lines += ["[wakeup]", "poll_max_s = 1.0"]
            config.write_text("\n".join(lines) + "\n")
            procs = [subprocess.Popen([sys.executable, "-m", "notifyq", "consume", "-q", QUEUE],
                                      env=self.env(out, str(config)), cwd=self.tree,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                     for _ in range(consumers)]
            deadline = time.monotonic() + timeout_s
            try:
                # (one row's read, not a count: --account's server counters are the drain's)
                while self.sql("SELECT EXISTS (SELECT 1 FROM nq_job WHERE queue = %s)", (QUEUE,))[0][0]:
                    if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                        raise RuntimeError(f"{self.name}: drain did not finish: "
                                           + b"".join(p.stderr.read() for p in procs if p.poll() is not None)
                                           .decode()[-2000:])
                    time.sleep(0.05)  # the benchmark's own poll of its result, not a test's sync
            finally:
                for p in procs:
                    p.send_signal(signal.SIGTERM)
                for p in procs:
                    p.wait(60)
            after = self.status() if self.account else None
            rows = []
            for f in Path(out).glob("[0-9]*.json"):
                rows += [tuple(r) for r in json.loads(f.read_text())]
            if self.account:
                probes = [json.loads(f.read_text()) for f in Path(out).glob("probe-*.json")]
                self.accounts.append({"label": label, **account(rows, probes, before, after)})
        return sorted(rows, key=lambda r: r[1])


STATUS = ("Questions", "Com_select", "Com_insert", "Com_update", "Com_delete", "Com_commit", "Com_rollback",
          "Com_set_option", "Handler_read_key", "Handler_read_next", "Handler_read_rnd_next", "Handler_write",
          "Handler_update", "Handler_delete", "Innodb_row_lock_waits", "Innodb_deadlocks")


def account(rows: list[tuple], probes: list[dict], before: dict, after: dict) -> dict:
    """Where one drain's time went (--account): the server's counters per job, and the probe's
    claims (round trips, statements, sizes, short ones) and each worker's time."""
    jobs = len(rows)
    first, last = min(r[1] for r in rows), max(r[2] for r in rows)
    server = {k: (after.get(k, 0) - before.get(k, 0)) / jobs for k in STATUS}
    # CPU per job: the server's over the whole drain (consumers' start and stop included), the
    # consumers' from their first claim in the drain's span to their last
    cpu_us = {"server": 1e6 * (after.get("server_cpu_s", 0) - before.get("server_cpu_s", 0)) / jobs}
    consumer_cpu = 0.0
    for p in probes:
        inside = [c for c in p["claims"] if c["end"] >= first and c["start"] <= last]
        if inside:
            consumer_cpu += max(c["cpu_end"] for c in inside) - min(c["cpu_start"] for c in inside)
    cpu_us["consumers"] = 1e6 * consumer_cpu / jobs
    claims = [c for p in probes for c in p["claims"] if c["end"] >= first and c["start"] <= last]
    taken = [c for c in claims if c["jobs"]]
    sizes = [c["jobs"] or 0 for c in claims]
    hist = {"0": 0, "1-24": 0, "25-49": 0, "50-74": 0, "75-99": 0, "100+": 0}
    for n in sizes:
        hist["0" if n == 0 else "1-24" if n < 25 else "25-49" if n < 50 else "50-74" if n < 75
             else "75-99" if n < 100 else "100+"] += 1
    med = statistics.median
    # Each worker thread's time within the drain's span: in claims, batch runs, idle waits
    threads: dict[tuple[int, str], dict[str, float]] = {}
    for i, p in enumerate(probes):
        for c in p["claims"]:
            t = threads.setdefault((i, c["thread"]), {"claim": 0.0, "run": 0.0, "idle": 0.0})
            t["claim"] += max(0.0, min(c["end"], last) - max(c["start"], first))
        for name, what, start, end in p["spans"]:
            t = threads.setdefault((i, name), {"claim": 0.0, "run": 0.0, "idle": 0.0})
            t[what] += max(0.0, min(end, last) - max(start, first))
    span = last - first
    workers = [t for t in threads.values() if t["claim"] or t["run"]]
    # (a watcher's claim runs inside its idle wait: its time counted once, as the claim's)
    per_worker = {k: sum(t[k] for t in workers) / max(1, len(workers)) / span for k in ("claim", "run", "idle")}
    watcher_claim = sum(max(0.0, min(c["end"], last) - max(c["start"], first)) for c in claims if c["watcher"])
    per_worker["idle"] -= watcher_claim / max(1, len(workers)) / span
    return {
        "jobs": jobs, "span_s": span, "jobs_s": jobs / span, "claims": len(claims),
        "empty": sum(1 for c in claims if not c["jobs"]),
        "empty_contended": sum(1 for c in claims if not c["jobs"] and c["contended"]),
        "short_contended": sum(1 for c in claims if c["jobs"] and c["contended"]),
        "watcher_claims": sum(1 for c in claims if c["watcher"]),
        "jobs_per_claim": jobs / max(1, len(taken)), "sizes": hist,
        "sends_per_claim": med([c["sends"] for c in claims]) if claims else 0,
        "statements_per_claim": med([c["statements"] for c in claims]) if claims else 0,
        "claim_ms": med([1000 * (c["end"] - c["start"]) for c in claims]) if claims else 0,
        "claim_wait_ms": med([1000 * c["wait_s"] for c in claims]) if claims else 0,
        "skipped_keys": sum(c["skipped_keys"] or 0 for c in claims),
        "worker_share": per_worker, "server_per_job": server, "cpu_us_per_job": cpu_us,
    }


def print_accounts(accounts: list[dict]) -> None:
    for a in accounts:
        w, s = a["worker_share"], a["server_per_job"]
        print(f"  {a['label']:<16} {a['jobs']} jobs in {a['span_s']:.3f} s ({a['jobs_s']:.0f}/s): "
              f"{a['claims']} claims ({a['empty']} empty, {a['empty_contended']} of them and "
              f"{a['short_contended']} others left jobs to peers' key locks, {a['watcher_claims']} a watcher's), "
              f"{a['jobs_per_claim']:.1f} jobs a claim that took any, sizes {a['sizes']}")
        print(f"  {'':<16} a claim: {a['sends_per_claim']:.0f} sends, {a['statements_per_claim']:.0f} statements, "
              f"{a['claim_ms']:.2f} ms ({a['claim_wait_ms']:.2f} ms waiting for replies); keys skipped "
              f"{a['skipped_keys']}; a worker's time: claims {w['claim']:.0%}, runs {w['run']:.0%}, "
              f"idle {w['idle']:.0%}, else {1 - w['claim'] - w['run'] - w['idle']:.0%}")
        print(f"  {'':<16} CPU per job: server {a['cpu_us_per_job']['server']:.0f} us, consumers "
              f"{a['cpu_us_per_job']['consumers']:.0f} us; server per job: "
              + ", ".join(f"{k} {v:.2f}" for k, v in s.items() if v))


def rate(rows: list[tuple]) -> float:
    return len(rows) / max(1e-9, max(r[2] for r in rows) - min(r[1] for r in rows))


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def case_unkeyed(this: Side, base: Side | None, size: dict) -> dict:
    n, rounds = size["drain_n"], size["rounds"]
    sides = [s for s in (base, this) if s is not None]
    rates: dict[str, list[float]] = {s.name: [] for s in sides}
    for _ in range(rounds):
        for side in sides:
            side.fill([(None, n)])
            rates[side.name].append(rate(side.drain(size["consumers"], {}, 100)))
    out = {name: {"median_jobs_s": statistics.median(r), "runs": r} for name, r in rates.items()}
    if base is not None:
        out["ratio"] = out[this.name]["median_jobs_s"] / out[base.name]["median_jobs_s"]
    return out


def case_keyed(this: Side, size: dict) -> dict:
    n, rounds = size["drain_n"], size["rounds"]
    groups = [(f"k{i:03d}", n // 100) for i in range(100)]
    rates: dict[str, list[float]] = {"unlimited": [], "limit_per_key_2": []}
    for _ in range(rounds):
        for name, conf in (("unlimited", {}), ("limit_per_key_2", {"limit_per_key": 2})):
            # Keys interleaved as producers would put them: one job of each key in turn
            for key, count in groups:
                this.fill([(key, count)])
            this.sql("UPDATE nq_job SET run_at = NOW(6) - INTERVAL (id MOD %s) SECOND", (n // 100,))
            rows = this.drain(size["consumers"], conf, 100, label=name)
            rates[name].append(rate(rows))
    un, lim = statistics.median(rates["unlimited"]), statistics.median(rates["limit_per_key_2"])
    # Each round's two drains ran back to back: their ratio leaves out the machine's drift
    # between rounds (its load from other work moves both)
    paired = statistics.median(b / a for a, b in zip(rates["unlimited"], rates["limit_per_key_2"]))
    return {"unlimited_jobs_s": un, "limited_jobs_s": lim, "ratio": lim / un, "paired_ratio": paired,
            "runs": rates}


def case_freed(this: Side, size: dict) -> dict:
    this.fill([("only", size["freed_n"])])
    rows = this.drain(2, {"limit_per_key": 1}, 10)
    gaps = [(b[1] - a[2]) * 1000 for a, b in zip(rows, rows[1:])]
    overlap = sum(1 for a, b in zip(rows, rows[1:]) if b[1] < a[2])
    return {"jobs": len(rows), "p50_ms": pct(gaps, 0.5), "p90_ms": pct(gaps, 0.9), "p99_ms": pct(gaps, 0.99),
            "max_ms": max(gaps), "overlaps": overlap}


def case_fairness(this: Side, size: dict) -> dict:
    a_n = size["fair_a"]
    this.fill([("A", a_n), ("B", 10)])
    b_ids = {r[0] for r in this.sql("SELECT id FROM nq_job WHERE job_key = 'B'")}
    rows = this.drain(size["consumers"], {"fair": True}, 100)
    positions = [i for i, r in enumerate(rows) if r[0] in b_ids]
    return {"jobs": len(rows), "b_last_position": positions[-1] + 1 if positions else None,
            "b_last_fraction": (positions[-1] + 1) / len(rows) if positions else None}


# Drains long enough to measure a rate, not a start: a drain of 10,000 no-op jobs lasts 0.3-0.5 s
# here, and the keyed ratio of such drains, 3 a side, spread from 0.69 to 0.97 in one quiet
# hour (benchmarks/HISTORY.md, 2026-12-01)
SIZES = {
    "full": {"drain_n": 100_000, "rounds": 5, "consumers": 2, "freed_n": 300, "fair_a": 50_000},
    "medium": {"drain_n": 50_000, "rounds": 5, "consumers": 2, "freed_n": 200, "fair_a": 50_000},
    "quick": {"drain_n": 4_000, "rounds": 1, "consumers": 2, "freed_n": 100, "fair_a": 5_000},
}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="mysql://root@127.0.0.1:3306", help="the server (root, no password)")
    ap.add_argument("--baseline", help="a checkout of main to compare the unkeyed drain with")
    ap.add_argument("--code", help="a checkout whose code the keyed, freed and fairness cases run (default: this one)")
    ap.add_argument("--account", action="store_true", help="where each drain's time went (a probe in each consumer)")
    ap.add_argument("--only", action="append", choices=("unkeyed", "keyed", "freed", "fairness"))
    ap.add_argument("--work-ms", type=float, default=0,
                    help="each job's handler sleeps this long (a handler waiting on I/O; default 0: no-op)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--medium", action="store_true", help="fewer jobs per drain, the full fairness case")
    ap.add_argument("--drain-n", type=int, help="jobs per drain of the unkeyed and keyed cases (a size's default "
                    "otherwise): a drain of 10,000 jobs lasts under half a second here, and its start weighs")
    ap.add_argument("--rounds", type=int, help="drains per side of the unkeyed and keyed cases")
    args = ap.parse_args(argv)
    if args.work_ms:
        os.environ["NQB_WORK_MS"] = str(args.work_ms)  # (read by _flow_handlers in each consumer)
    size = dict(SIZES["quick" if args.quick else "medium" if args.medium else "full"])
    if args.drain_n:
        if args.drain_n < 100 or args.drain_n % 100:
            ap.error("--drain-n: a multiple of 100 (100 keys)")
        size["drain_n"] = args.drain_n
    if args.rounds:
        size["rounds"] = args.rounds
    hostport = args.dsn.split("@", 1)[1].split("/", 1)[0]
    user = args.dsn.split("://", 1)[1].split("@", 1)[0]
    host, _, port = hostport.partition(":")
    server = {"host": host, "port": int(port or 3306), "user": user}
    this = Side("this", Path(args.code).resolve() if args.code else TREE, server, "nq_bench_flow", args.account)
    base = Side("main", Path(args.baseline).resolve(), server, "nq_bench_flow_main") if args.baseline else None
    cases = args.only or ["unkeyed", "keyed", "freed", "fairness"]
    res: dict = {"size": size, "work_ms": args.work_ms, "cases": {}}
    try:
        for side in (this, base):
            if side is not None:
                side.init()
        for case in cases:
            if case == "unkeyed":
                res["cases"][case] = case_unkeyed(this, base if args.baseline else None, size)
            else:
                res["cases"][case] = {"keyed": case_keyed, "freed": case_freed, "fairness": case_fairness}[case](this, size)
    finally:
        for side in (this, base):
            if side is not None:
                side.drop()
    print(f"{'case':<10} {'measure':<24} value")
    for case, r in res["cases"].items():
        for k, v in r.items():
            if k == "runs":
                continue
            if isinstance(v, dict):
                print(f"{case:<10} {k + ' median jobs/s':<24} {v['median_jobs_s']:.0f}")
            else:
                print(f"{case:<10} {k:<24} {v:.3f}" if isinstance(v, float) else f"{case:<10} {k:<24} {v}")
    if this.accounts:
        print("where the drains' time went (--account):")
        print_accounts(this.accounts)
        res["accounts"] = this.accounts
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
