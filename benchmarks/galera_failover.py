#!/usr/bin/env python3
"""Failover time on a 3-node Galera cluster: the writer node killed, again and again, under a
real producer process and real consumer processes on one multi-host DSN.

    .venv/bin/python benchmarks/galera_failover.py [--failovers 10] [--consumers 2] [--rate 50]
        [--fault kill|pause] [--fast-eviction] [--json out.json]

Each round SIGKILLs (--fault pause: SIGSTOPs) the node the processes write through, measures the
time from the fault to the first job *enqueued after it* being handled (producer and consumers
both failed over), and restarts (SIGCONTs) the node; the processes are never restarted and never
fail back on their own, so the next round's writer is the first node of the DSN other than the
one just hit. A paused node keeps its sockets open: its clients see no error, only silence, until
their read timeout.
--fast-eviction uses the test fixture's evs settings (~3 s stall) instead of Galera's defaults.
Prints a table (per round, then p50/max) and one JSON document; exit 0 when nothing was lost
and no live consumer was reaped.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for path in (REPO, REPO / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from cluster.conftest import FAST_EVICTION  # noqa: E402
from cluster.galera import GaleraCluster  # noqa: E402

QUEUE = "failover"
HANDLER = """\
import os, time
_f = {}
def record(job):
    f = _f.get(os.getpid())
    if f is None:
        f = _f[os.getpid()] = open(os.path.join(os.environ["NQ_OUT"], f"{os.getpid()}.log"), "a", buffering=1)
    f.write(f"{job.id} {job.payload['t']!r} {time.time()!r}\\n")
"""


def notifyq(*args: str) -> list[str]:
    return [sys.executable, "-m", "notifyq", *args]


class Feed:
    """Writes one job line a tick to the producer's stdin; each payload carries its wall time.
    Its printed ids are read as they come: a full stdout pipe would stop the producer."""

    def __init__(self, producer: subprocess.Popen, rate: float):
        self.producer, self.interval = producer, 1.0 / rate
        self.sent = 0
        self.ids: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        self.reader.start()

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            self.producer.stdin.write(f'{{"t": {time.time()!r}}}\n')
            self.producer.stdin.flush()
            self.sent += 1

    def _read(self) -> None:
        for line in self.producer.stdout:
            self.ids.append(line)

    def close(self) -> str:
        self.stop.set()
        self.thread.join()
        self.producer.stdin.close()
        self.producer.wait(120)
        self.reader.join(30)
        return "".join(self.ids)


def handled(out: Path) -> list[tuple[int, float, float]]:
    rows = []
    for path in out.glob("*.log"):
        for line in path.read_text().splitlines():
            job_id, enqueued, done = line.split()
            rows.append((int(job_id), float(enqueued), float(done)))
    return rows


def wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="nq-failover-"))
    out = work / "runs"
    out.mkdir()
    (work / "failover_handler.py").write_text(HANDLER)
    (work / "c.toml").write_text("[consumer]\nreap_interval_s = 1\n[wakeup]\npoll_max_s = 0.5\n")
    (work / "c.toml").chmod(0o600)
    settings = {"provider_options": FAST_EVICTION} if args.fast_eviction else {}
    with GaleraCluster(3, **settings) as cluster:
        url = cluster.multi_host_dsn(database="nq_failover")
        env = {**os.environ, "NOTIFYQ_DSN": url, "NOTIFYQ_CONFIG": str(work / "c.toml"),
               "PYTHONPATH": str(work), "NQ_OUT": str(out)}
        subprocess.run(notifyq("init"), env=env, check=True, capture_output=True)
        consumers = [subprocess.Popen(notifyq("consume", "-q", QUEUE, "--handler", "failover_handler:record",
                                              "--batch-size", "10"),
                                      env=env, stdout=subprocess.DEVNULL, stderr=(work / f"c{i}.err").open("w"))
                     for i in range(args.consumers)]
        producer = subprocess.Popen(notifyq("produce", "-q", QUEUE, "--print-ids"), env=env, text=True,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=(work / "p.err").open("w"))
        feed = Feed(producer, args.rate)
        rounds = []
        writer = 1
        try:
            wait(lambda: len(handled(out)) >= args.rate, 60, "jobs flowing")
            for r in range(args.failovers):
                killed_at = time.time()
                (cluster.pause if args.fault == "pause" else cluster.kill)(writer)
                first = wait(lambda: min((d for _, e, d in handled(out) if e > killed_at), default=None),
                             120, f"a job enqueued after kill {r + 1} handled")
                new_writer = next(n.index for n in cluster.nodes if n.index != writer and n.is_running()
                                  and not n.paused)
                rounds.append({"round": r + 1, "killed": writer, "new_writer": new_writer,
                               "failover_s": round(first - killed_at, 2)})
                print(f"round {r + 1:>2}: {args.fault} node {writer}, writer now node {new_writer}, "
                      f"first new job handled after {first - killed_at:.2f} s", flush=True)
                (cluster.resume if args.fault == "pause" else cluster.restart)(writer)
                writer = new_writer
        finally:
            ids_text = feed.close()
            ids = [int(x) for x in ids_text.split()]
            try:
                wait(lambda: set(ids) <= {i for i, _, _ in handled(out)}, 120, "every job handled")
            except RuntimeError:
                pass
            for proc in consumers:
                proc.send_signal(signal.SIGTERM)
            alive = sum(proc.poll() is None for proc in consumers)
            for proc in consumers:
                proc.wait(60)
        runs = collections.Counter(i for i, _, _ in handled(out))
        lost_rows = _rows(cluster, sorted(set(ids) - set(runs)))
        errs = "".join((work / f"c{i}.err").read_text() for i in range(args.consumers))
        times = [r["failover_s"] for r in rounds]
        return {
            "failovers": len(rounds), "fault": args.fault, "eviction": "fast (fixture evs)" if args.fast_eviction else "Galera defaults",
            "rounds": rounds, "failover_p50_s": round(statistics.median(times), 2) if times else None,
            "failover_max_s": max(times) if times else None,
            "jobs_enqueued": len(ids), "jobs_sent": feed.sent, "distinct_ids": len(set(ids)),
            "lost": len(set(ids) - set(runs)), "duplicates": sum(n - 1 for n in runs.values()),
            "false_reclaims": errs.count("consumer died") + errs.count("judged stale"),
            "consumers_running_at_end": alive, "consumers": args.consumers, "lost_rows": lost_rows,
        }


def _rows(cluster: GaleraCluster, ids: list[int]) -> list[list]:
    """What the table says of jobs that were never handled (for a post-mortem), from a running node."""
    if not ids:
        return []
    node = next(n for n in cluster.nodes if n.is_running() and not n.paused)
    conn = node.connect()
    try:
        cur = conn.cursor()
        cur.execute("SELECT id, status, attempts, owner, run_at, claimed_at FROM nq_failover.nq_job "
                    "WHERE id IN %s", (ids,))
        return [[str(v) for v in row] for row in cur.fetchall()]
    finally:
        conn.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--failovers", type=int, default=10)
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--rate", type=float, default=50, help="jobs per second fed to the producer")
    p.add_argument("--fault", choices=("kill", "pause"), default="kill",
                   help="what happens to the writer node: SIGKILL, or SIGSTOP until failed over")
    p.add_argument("--fast-eviction", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()
    result = run(args)
    print(f"\n| fault | failovers | eviction | p50 s | max s | enqueued | lost | duplicates | false reclaims | "
          f"consumers running |\n|---|---|---|---|---|---|---|---|---|---|\n"
          f"| {result['fault']} | {result['failovers']} | {result['eviction']} | {result['failover_p50_s']} | "
          f"{result['failover_max_s']} | {result['jobs_enqueued']} | {result['lost']} | {result['duplicates']} | "
          f"{result['false_reclaims']} | {result['consumers_running_at_end']}/{result['consumers']} |")
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    ok = result["lost"] == 0 and result["false_reclaims"] == 0 and result["jobs_enqueued"] == result["jobs_sent"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
