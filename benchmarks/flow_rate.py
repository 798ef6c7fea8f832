#!/usr/bin/env python3
"""A queue's rate limit under a backlog: does it start R jobs a second, never more in any window?

    .venv/bin/python benchmarks/flow_rate.py [--dsn mysql://root@host:port/] [--rate 50]
        [--period-s 1] [--duration-s 60] [--procs 2] [--batch-size 100] [--json out.json]

Without --dsn a private MariaDB (LocalServer) is started in a temp dir; with it, a database of
its own is created and dropped. The queue gets `rate = "N/PERIOD"` (N = rate x period) and a
backlog larger than the run can drain; --procs real `notifyq consume` processes (1 worker each,
default batch settings) run it. Each job's handler start is timed (wall clock, one host). Over
--duration-s from the first start: the starts per second against R (target: within +-5 %), and
the most starts in any window of one period, sliding over every start (target: <= N). A rate
counts a start when its claim commits, at the server's time in the claim's transaction, which
the budget's log (nq_rate) keeps for at least a period: the benchmark reads the log every
period/5 and so sees every start's time as the rate counted it ("max/window"). "(handlers)" is
the same count over the handlers' own start times, for what a handler sees: a claim's jobs
begin a few ms after its time (the COMMIT, the hand-over), and a batch's jobs one after the
other, so a window may catch the tail of one claim and the head of the next. The consumers'
wake at each refill is what keeps the rate up: a poll would lose up to poll_max_s (1 s) per
period.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import os
import random
import signal
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

QUEUE = "rated"
TOLERANCE = 0.05


def most_in_any_window(starts: list[float], period_s: float) -> int:
    """The most starts in any half-open window [t, t + period_s), over every start t."""
    starts = sorted(starts)
    return max((bisect.bisect_left(starts, t + period_s) - i for i, t in enumerate(starts)), default=0)


def run(url: str, workdir: Path, a) -> dict:
    root = DSN.parse(url)
    dsn = dataclasses.replace(root, database=f"nq_rate_bench_{random.randrange(1 << 30):x}")
    schema.init(dsn)
    admin = MySQLdb.connect(**dsn.connect_args(), autocommit=True)
    admin.cursor().execute("SET time_zone = '+00:00'")  # as notifyq's sessions write the log's times
    count = round(a.rate * a.period_s)
    out = workdir / "starts"
    out.mkdir()
    url_db = f"mysql://{dsn.user}@{dsn.host}:{dsn.port}/{dsn.database}"
    conf = workdir / "notifyq.toml"
    conf.write_text(f'[queue.{QUEUE}]\nrate = "{count}/{a.period_s:g}s"\nbatch_size = {a.batch_size}\n'
                    f'[log]\nlevel = "warning"\n')
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update({"NOTIFYQ_DSN": url_db, "NOTIFYQ_CONFIG": str(conf), "NQB_OUT": str(out),
                "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")])})
    if dsn.password:
        env["NOTIFYQ_PASSWORD"] = dsn.password
    cfg = config_mod.load(env={"NOTIFYQ_CONFIG": str(conf), **({"NOTIFYQ_PASSWORD": dsn.password} if dsn.password else {})},
                          overrides={"dsn": url_db})
    backlog = int(a.rate * (a.duration_s + 2 * a.period_s) * 1.2) + count
    with notifyq.Producer(QUEUE, cfg) as producer:
        for i in range(0, backlog, 1000):
            producer.put_many([{"sleep_s": 0}] * min(1000, backlog - i))
    consumers = []
    try:
        with open(workdir / "consumers.err", "ab") as err:
            consumers = [subprocess.Popen([sys.executable, "-m", "notifyq", "consume", "-q", QUEUE, "--handler",
                                           "_rate_handler:timed", "--workers", "1"],
                                          env=env, cwd=str(HERE), stdout=subprocess.DEVNULL, stderr=err)
                         for _ in range(a.procs)]
        first = None
        deadline = time.monotonic() + 60
        while first is None:  # the first start opens the measured span
            starts = _starts(out)
            first = min(t for _, t, _ in starts) if starts else None
            if time.monotonic() > deadline:
                raise RuntimeError("no job started within 60 s: see consumers.err")
            time.sleep(0.05)
        log: set[tuple] = set()  # (slot, started_at): each start the rate counted, read before it is overwritten
        cur = admin.cursor()
        while time.time() < first + a.duration_s + a.period_s:  # the span, and a period past it
            cur.execute("SELECT slot, started_at, UNIX_TIMESTAMP(started_at) FROM nq_rate WHERE queue = %s "
                        "AND started_at > '1970-01-02'", (QUEUE,))
            log.update(cur.fetchall())
            time.sleep(a.period_s / 5)  # a slot keeps its time for a period at least
    finally:
        for p in consumers:
            p.send_signal(signal.SIGTERM)
        for p in consumers:
            p.wait(60)
        admin.cursor().execute(f"DROP DATABASE IF EXISTS `{dsn.database}`")
        admin.close()
    lines = _starts(out)
    claims = {token for _, _, token in lines}
    starts = sorted(t for _, t, _ in lines if first <= t < first + a.duration_s)
    times = sorted(float(ts) for _, _, ts in log)
    counted = [t for t in times if t < times[0] + a.duration_s]  # from the first claim's time
    per_s = len(starts) / a.duration_s
    most = most_in_any_window(counted, a.period_s)
    return {"rate": f"{count}/{a.period_s:g}s", "rate_per_s": a.rate, "duration_s": a.duration_s,
            "procs": a.procs, "batch_size": a.batch_size, "backlog": backlog, "starts": len(starts),
            "starts_per_s": round(per_s, 2), "ratio": round(per_s / a.rate, 4), "most_in_any_window": most,
            "most_in_any_window_handlers": most_in_any_window(starts, a.period_s), "claims": len(claims),
            "counted": len(counted),
            "window_limit": count, "met": abs(per_s / a.rate - 1) <= TOLERANCE and most <= count}


def _starts(out: Path) -> list[tuple[int, float, str]]:
    """(job, handler start, claim token) of every start the handlers logged."""
    found = []
    for path in out.glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                found.append((int(parts[0]), float(parts[1]), parts[2]))
    return found


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", help="a server to use (root-like user) instead of a private LocalServer")
    ap.add_argument("--rate", type=float, default=50.0, help="R: starts per second")
    ap.add_argument("--period-s", type=float, default=1.0, help="the rate's period (N = R x period)")
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--procs", type=int, default=2, help="consumer processes (1 worker each)")
    ap.add_argument("--batch-size", type=int, default=100, help="the queue's batch_size")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nq-rate-") as tmp:
        if a.dsn:
            row = run(a.dsn, Path(tmp), a)
        else:
            from notifyq.run.localserver import LocalServer

            with LocalServer(Path(tmp) / "server") as server:
                row = run(server.dsn, Path(tmp), a)
    print(f"rate {row['rate']} over {row['duration_s']:g} s, backlog {row['backlog']}, {row['procs']} consumer "
          f"processes, batch_size {row['batch_size']} (targets: starts/s within {TOLERANCE:.0%} of R, at most N "
          f"in any window of one period, each start at its claim's time)")
    print(f"{'rate':<10} {'R/s':>7} {'starts':>7} {'counted':>7} {'claims':>7} {'starts/s':>9} {'ratio':>7} "
          f"{'max/window':>11} {'(handlers)':>11} {'N':>6}  met")
    print(f"{row['rate']:<10} {row['rate_per_s']:>7g} {row['starts']:>7} {row['counted']:>7} {row['claims']:>7} {row['starts_per_s']:>9.2f} "
          f"{row['ratio']:>7.3f} {row['most_in_any_window']:>11} {row['most_in_any_window_handlers']:>11} "
          f"{row['window_limit']:>6}  {'yes' if row['met'] else 'NO'}")
    result = {"flow_rate": row}
    print(json.dumps(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
