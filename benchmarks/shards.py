"""Sharding: drain and enqueue throughput over 1, 2 and 3 independent MariaDB servers.

    .venv/bin/python benchmarks/shards.py [--n 20000] [--consumers 2] [--producers 2] [--rounds 2] [--json]

Starts three private servers (notifyq.run.localserver, own datadir/port/socket; the server on
3306 is not touched), puts one queue spread over the first S of them (`[queue.bench] spread =
true`), and for S = 1, 2, 3 (in alternating order per round):
  enqueue: P producer processes, each Producer.put() one job per commit, N jobs in all;
  drain:   K `notifyq consume --exit-when-empty` processes (one worker per shard each).
Rates are N / (last - first) over the children's own timestamps (process start-up excluded).
Every job is checked handled exactly once. The CPU columns say what limits it: seconds of CPU
of the clients (rusage of the children) and of the servers (/proc/PID/stat) per wall second,
out of this machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from notifyq.config import DSN  # noqa: E402
from notifyq.run.localserver import LocalServer  # noqa: E402
from notifyq.store import schema  # noqa: E402

DATABASE = "nq_shardbench"
TICKS = os.sysconf("SC_CLK_TCK")


def _produce_child(args: dict) -> None:
    """One producer process: put() its share, one commit each; prints its first/last time."""
    from notifyq import config as config_mod
    from notifyq.sharding.producer import Producer

    cfg = config_mod.load(env={"NOTIFYQ_CONFIG": args["config"]})
    with Producer(args["queue"], cfg) as producer:
        for shard in cfg.shard_names():  # connect everywhere before the clock starts
            producer._on(shard)._work_session()
        t0 = time.time()
        for n in range(args["first"], args["first"] + args["count"]):
            producer.put({"n": n})
        print(json.dumps({"first": t0, "last": time.time()}))


def _server_cpu(servers: list[LocalServer]) -> float:
    total = 0
    for srv in servers:
        fields = Path(f"/proc/{srv._proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def _machine() -> tuple[float, float]:
    """(busy, iowait) CPU seconds of the whole machine so far: the other tenants count too."""
    user, nice, system, idle, iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / TICKS, iowait / TICKS


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _config(workdir: Path, servers: list[LocalServer], queue: str, consumers_batch: int) -> Path:
    path = workdir / f"{queue}.toml"
    shards = "".join(f's{i} = "mysql://root@127.0.0.1:{srv.port}/{DATABASE}"\n' for i, srv in enumerate(servers))
    path.write_text(f"[shards]\n{shards}[queue.{queue}]\nspread = true\nhandler = \"_shard_handler:record\"\n"
                    f"batch_size = {consumers_batch}\nworkers = 1\n[log]\nlevel = \"warning\"\n")
    return path


def _phase(servers, procs_started) -> tuple[list[str], float, dict[str, float]]:
    """Run the children started by `procs_started()`: (their stdouts, wall, CPU cores used on
    average by the clients, the servers, the whole machine, and waiting for I/O)."""
    c0, s0, (m0, w0), t0 = _children_cpu(), _server_cpu(servers), _machine(), time.time()
    procs = procs_started()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        if p.returncode != 0:
            raise SystemExit(f"child failed ({p.returncode}): {err[-2000:]}")
        outs.append(out)
    wall = time.time() - t0
    (m1, w1) = _machine()
    return outs, wall, {"clients": (_children_cpu() - c0) / wall, "servers": (_server_cpu(servers) - s0) / wall,
                        "machine": (m1 - m0) / wall, "iowait": (w1 - w0) / wall}


def one_run(workdir: Path, servers: list[LocalServer], n: int, consumers: int, producers: int,
            tag: str) -> dict:
    queue = f"bench_{tag}"
    config = _config(workdir, servers, queue, 100)
    env = {**os.environ, "NOTIFYQ_CONFIG": str(config), "PYTHONPATH": f"{HERE}:{ROOT}"}
    share = [n // producers + (1 if i < n % producers else 0) for i in range(producers)]
    starts = [sum(share[:i]) for i in range(producers)]

    def start_producers():
        return [subprocess.Popen([sys.executable, __file__, "--child-produce", json.dumps(
            {"config": str(config), "queue": queue, "first": starts[i], "count": share[i]})],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(producers)]

    outs, _wall, cpu_p = _phase(servers, start_producers)
    spans = [json.loads(o) for o in outs]
    enqueue_s = max(s["last"] for s in spans) - min(s["first"] for s in spans)
    out_dir = workdir / f"{queue}.out"
    out_dir.mkdir()

    def start_consumers():
        return [subprocess.Popen([sys.executable, "-m", "notifyq", "consume", "-q", queue, "--exit-when-empty"],
                                 env={**env, "NQB_OUT": str(out_dir)}, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(consumers)]

    _outs, _wall, cpu_c = _phase(servers, start_consumers)
    handled = [json.loads(p.read_text()) for p in out_dir.glob("*.json")]
    seen = sorted(x for h in handled for x in h["seen"])
    if seen != list(range(n)):
        raise SystemExit(f"{len(servers)} shards: {len(seen)} handled, {len(set(seen))} distinct, expected {n}")
    drain_s = max(h["last"] for h in handled) - min(h["first"] for h in handled)
    return {"shards": len(servers), "enqueue_per_s": n / enqueue_s, "drain_per_s": n / drain_s,
            "enqueue_cpu": cpu_p, "drain_cpu": cpu_c}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="jobs per run")
    ap.add_argument("--consumers", type=int, default=2, help="K consumer processes")
    ap.add_argument("--producers", type=int, default=2, help="P producer processes")
    ap.add_argument("--rounds", type=int, default=2, help="runs per shard count (order alternates)")
    ap.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    ap.add_argument("--child-produce", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child_produce:
        _produce_child(json.loads(a.child_produce))
        return
    with tempfile.TemporaryDirectory(prefix="nq-shardbench-") as tmp:
        workdir = Path(tmp)
        servers = [LocalServer(workdir / f"srv{i}") for i in range(3)]
        try:
            for srv in servers:
                srv.start()
                schema.init(DSN.parse(srv.dsn + DATABASE))
            results: dict[int, list[dict]] = {1: [], 2: [], 3: []}
            for r in range(a.rounds):
                for s in ((1, 2, 3) if r % 2 == 0 else (3, 2, 1)):
                    res = one_run(workdir, servers[:s], a.n, a.consumers, a.producers, f"r{r}s{s}")
                    results[s].append(res)
                    print(f"round {r + 1} shards={s}: enqueue {res['enqueue_per_s']:.0f}/s "
                          f"drain {res['drain_per_s']:.0f}/s", file=sys.stderr)
        finally:
            for srv in servers:
                srv.cleanup()
    summary = []
    for s, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("enqueue_per_s", "drain_per_s")}
        cpu = {ph: {who: statistics.median(r[ph][who] for r in runs) for who in runs[0][ph]}
               for ph in ("enqueue_cpu", "drain_cpu")}
        summary.append({"shards": s, **med, **cpu, "runs": runs})
    if a.json:  # the JSON on stdout, the table on stderr
        print(json.dumps({"n": a.n, "consumers": a.consumers, "producers": a.producers, "rounds": a.rounds,
                          "cores": os.cpu_count(), "results": summary}, indent=2))
    _table(a, summary, sys.stderr if a.json else sys.stdout)


def _table(a: argparse.Namespace, summary: list[dict], out) -> None:
    base = summary[0]
    print(f"N={a.n} jobs, K={a.consumers} consumer processes, P={a.producers} producer processes, "
          f"{a.rounds} rounds (medians), {os.cpu_count()} cores", file=out)
    print("CPU: cores busy on average over the phase (start-up included): notifyq clients / servers /"
          " whole machine (other tenants too) / waiting for I/O", file=out)
    print("shards  enqueue/s  x1    drain/s  x1    enqueue cpu cl/srv/all/io   drain cpu cl/srv/all/io", file=out)
    for row in summary:
        e, d = row["enqueue_cpu"], row["drain_cpu"]
        print(f"{row['shards']:>6}  {row['enqueue_per_s']:>9.0f}  {row['enqueue_per_s'] / base['enqueue_per_s']:.2f}"
              f"  {row['drain_per_s']:>7.0f}  {row['drain_per_s'] / base['drain_per_s']:.2f}"
              f"  {e['clients']:.2f}/{e['servers']:.2f}/{e['machine']:.2f}/{e['iowait']:.2f}"
              f"         {d['clients']:.2f}/{d['servers']:.2f}/{d['machine']:.2f}/{d['iowait']:.2f}", file=out)


if __name__ == "__main__":
    main()
