"""Wake-up benchmark: what idle consumers cost the server, and how fast they pick up a job.

    .venv/bin/python benchmarks/wakeup.py [--dsn mysql://root@host:port/] [--json out.json] [--quick]

Without --dsn (or $NOTIFYQ_DSN) it starts a private throwaway MariaDB (notifyq.localserver), so
the server's Questions counter sees nothing but this benchmark. With a DSN, the account needs
root-like rights (CREATE/DROP DATABASE, SHOW GLOBAL STATUS); other clients' traffic on that
server inflates the idle figures.

Consumers are real `notifyq consume` processes, one worker each; this file is also their
handler module (`--handler wakeup:record`, found through PYTHONPATH): the handler sends
"job_id start_time" over a Unix datagram socket, stamped with CLOCK_MONOTONIC, which is the
same clock in every process of the machine.

(a) idle cost: Questions delta per second with 1 and 10 idle consumers, minus this script's
    own SHOW STATUS statements, after the watcher's backoff has reached its cap.
(b) pick-up latency, from put() returning (COMMIT done, and for the bell its release too) to
    the handler's first line: a bell-holding producer (gaps 0-50 ms); one-shot put() (gaps
    uniform in 0..2 caps, so arrivals land both in the backoff ramp and at the cap); one-shot
    put() after >= 2.5 s of silence (the watcher polls at the cap), both with instant_wake = false,
    so that the poll is what is measured; one-shot with instant_wake = true; a second ring=True
    producer while another holds the queue's bell (one ringer per queue and server), with the
    defaults (instant_wake = "auto": it interrupts the watcher's wait), and with instant_wake = false.
    benchmarks/producers_pickup.py measures 8 producer processes on one queue.
(c) the same with the wake-up disabled: use_locks = false, every consumer polling the signal
    row at a fixed interval equal to the cap.

On a private server it also repeats the bell run with innodb_flush_log_at_trx_commit = 2: the
claim must COMMIT before its handler may start, and that COMMIT's redo-log fsync is the floor
of every pick-up; the second run shows what the protocol costs when the disk is not the limit.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
QUEUE = "bench"

_sock: socket.socket | None = None


def record(job) -> None:
    """The consumers' handler: report (job id, start time) to the benchmark."""
    global _sock
    now = time.monotonic()
    if _sock is None:
        _sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    _sock.sendto(f"{job.id} {now:.9f}".encode(), os.environ["NQ_BENCH_SOCK"])


# ---------------------------------------------------------------------------- harness


@dataclasses.dataclass
class Env:
    root_dsn: str  # mysql://root@host:port/ (no database)
    database: str
    workdir: Path

    def dsn(self) -> str:
        base, _, query = self.root_dsn.partition("?")
        return base.rstrip("/") + "/" + self.database + (f"?{query}" if query else "")


class Fleet:
    """N `notifyq consume` processes with a given [wakeup] section."""

    def __init__(self, env: Env, n: int, wakeup: dict, sock_path: str):
        self.env = env
        self.n = n
        conf = env.workdir / f"fleet-{uuid.uuid4().hex[:8]}.toml"
        lines = [f'dsn = "{env.dsn()}"', "[wakeup]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in wakeup.items()]
        lines += ["[log]", 'level = "warning"']
        conf.write_text("\n".join(lines) + "\n")
        self.proc_env = {**os.environ, "NOTIFYQ_CONFIG": str(conf), "NQ_BENCH_SOCK": sock_path,
                         "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)])}
        self.proc_env.pop("NOTIFYQ_DSN", None)
        self.log = open(env.workdir / "consumers.log", "a")
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "Fleet":
        cmd = [sys.executable, "-m", "notifyq", "consume", "-q", QUEUE, "--handler", "wakeup:record",
               "--workers", "1"]
        self.procs = [subprocess.Popen(cmd, env=self.proc_env, stdout=self.log, stderr=self.log,
                                       stdin=subprocess.DEVNULL) for _ in range(self.n)]
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.log.close()

    def check_alive(self) -> None:
        dead = [p.returncode for p in self.procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"consumer exited with {dead}; see {self.env.workdir / 'consumers.log'}")


class Admin:
    """Root connection for setup and observation; counts its own statements."""

    def __init__(self, env: Env):
        import MySQLdb

        from notifyq.config import DSN

        args = DSN.parse(env.dsn()).connect_args()
        self.conn = MySQLdb.connect(**args, autocommit=True)
        self.statements = 0

    def query(self, sql: str, params=None) -> list[tuple]:
        cur = self.conn.cursor()
        cur.execute(sql, params)
        self.statements += 1
        return list(cur.fetchall())

    def questions(self) -> int:
        return int(self.query("SHOW GLOBAL STATUS LIKE 'Questions'")[0][1])


def wait_until(pred, timeout: float, what: str, fleet: Fleet | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if fleet is not None:
            fleet.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def settled(admin: Admin, env: Env, n: int, locks: bool) -> bool:
    if locks:
        from notifyq.store.locks import QueueLocks

        watch = QueueLocks(env.database, QUEUE).watch
        holder, queued, registered = admin.query(
            "SELECT IS_USED_LOCK(%s), (SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE %s),"
            " (SELECT COUNT(*) FROM nq_consumer)", (watch, f"SELECT GET_LOCK('{watch}',%"))[0]
        return holder is not None and queued == n - 1 and registered == n
    return admin.query("SELECT COUNT(*) FROM nq_consumer")[0][0] == n


# ---------------------------------------------------------------------------- measurements


def idle_cost(env: Env, admin: Admin, n: int, wakeup: dict, seconds: float, sock: str) -> float:
    locks = wakeup.get("use_locks", True)
    with Fleet(env, n, wakeup, sock) as fleet:
        wait_until(lambda: settled(admin, env, n, locks), 60, f"{n} idle consumers", fleet)
        time.sleep(3.0)  # the first claims are done; let the 5 ms..1 s backoff ramp reach its cap
        mine = admin.statements
        before, t0 = admin.questions(), time.monotonic()
        time.sleep(seconds)
        after, t1 = admin.questions(), time.monotonic()
        fleet.check_alive()
        ours = admin.statements - mine - 1  # the first SHOW is counted before `before` is read
    return (after - before - ours) / (t1 - t0)


def latencies(env: Env, admin: Admin, wakeup: dict, producer_wakeup: dict, ring: bool | str, rounds: int,
              gap: tuple[float, float], n_consumers: int, rx: socket.socket, sock: str,
              seed: int) -> list[float]:
    from notifyq import config as config_mod
    from notifyq.produce.producer import Producer

    locks = wakeup.get("use_locks", True)
    cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"},
                          overrides={"dsn": env.dsn(), "wakeup": {**wakeup, **producer_wakeup}})
    rng = random.Random(seed)
    out: list[float] = []
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(Fleet(env, n_consumers, wakeup, sock))
        if ring == "second":
            # Another long-lived producer rings the queue's bell (one per queue and server): it
            # arms on its first put, before the measured producer's warm-up could.
            stack.enter_context(Producer(QUEUE, cfg, ring=True)).put({})
        producer = stack.enter_context(Producer(QUEUE, cfg, ring=bool(ring)))
        wait_until(lambda: settled(admin, env, n_consumers, locks), 60, "idle consumers", fleet)

        def one() -> float:
            job_id = producer.put({})
            committed = time.monotonic()
            rx.settimeout(max(10.0, 3 * cfg.wakeup.poll_max_s))
            while True:
                got_id, started = rx.recv(128).decode().split()
                if int(got_id) == job_id:
                    return float(started) - committed

        one()  # warm-up: connections, and a ringer arms on its first put
        wait_until(lambda: settled(admin, env, n_consumers, locks), 60, "idle consumers", fleet)
        for _ in range(rounds):
            time.sleep(rng.uniform(*gap))
            out.append(one())
        fleet.check_alive()
    return out


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", default=os.environ.get("NOTIFYQ_DSN"),
                    help="root DSN of a server to use (default: a private throwaway MariaDB)")
    ap.add_argument("--json", dest="json_path", help="also write the results here")
    ap.add_argument("--cap", type=float, default=1.0, help="wakeup.poll_max_s (default 1.0)")
    ap.add_argument("--idle-s", type=float, default=30.0, help="idle measurement window")
    ap.add_argument("--bell-rounds", type=int, default=400)
    ap.add_argument("--oneshot-rounds", type=int, default=60)
    ap.add_argument("--quiet-rounds", type=int, default=20)
    ap.add_argument("--consumers", type=int, default=4, help="idle consumers during latency runs")
    ap.add_argument("--quick", action="store_true", help="short windows and few rounds (a smoke run)")
    ap.add_argument("--skip-idle", action="store_true", help="latency runs only")
    args = ap.parse_args(argv)
    if args.quick:
        args.idle_s, args.bell_rounds, args.oneshot_rounds, args.quiet_rounds = 5.0, 100, 10, 3

    sys.path.insert(0, str(REPO))
    from notifyq.config import DSN
    from notifyq.run.localserver import LocalServer
    from notifyq.store import schema

    workdir = Path(tempfile.mkdtemp(prefix="nq-wakeup-bench-"))
    server = None
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, True)
        root = args.dsn
        if not root:
            server = LocalServer(workdir / "server")
            server.start()
            stack.callback(server.cleanup)
            root = server.dsn
        env = Env(root, f"nq_bench_{uuid.uuid4().hex[:10]}", workdir)
        schema.init(DSN.parse(env.dsn()))
        admin = Admin(env)

        def drop() -> None:
            admin.query(f"DROP DATABASE IF EXISTS `{env.database}`")
            admin.conn.close()

        stack.callback(drop)
        sock = str(workdir / "rx.sock")
        rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        rx.bind(sock)
        stack.callback(rx.close)

        cap = args.cap
        locks = {"poll_max_s": cap}
        polling = {"use_locks": False, "poll_initial_s": cap, "poll_max_s": cap}
        version = admin.query("SELECT VERSION()")[0][0]
        print(f"server {version}; cap (wakeup.poll_max_s) = {cap:g} s; "
              f"{os.cpu_count()} CPUs; idle window {args.idle_s:g} s", flush=True)

        idle = []
        for mode, wakeup in () if args.skip_idle else (("locks", locks), ("polling", polling)):
            for n in (1, 10):
                rate = idle_cost(env, admin, n, wakeup, args.idle_s, sock)
                idle.append({"mode": mode, "consumers": n, "queries_per_s": round(rate, 3),
                             "loadavg_1m_after": round(os.getloadavg()[0], 2)})
                print(f"  idle {mode:8s} {n:2d} consumers: {rate:6.2f} queries/s", flush=True)

        gaps_short, gaps_mixed, gaps_quiet = (0.0, 0.05), (0.0, 2 * cap), (2.5 * cap, 3.5 * cap)
        no_kill = {"instant_wake": False}  # the poll alone
        runs = [
            ("locks", "bell (ring=True)", locks, {}, True, args.bell_rounds, gaps_short),
            ("locks", "one-shot put()", locks, no_kill, False, args.oneshot_rounds, gaps_mixed),
            ("locks", "one-shot, idle >= 2.5 caps", locks, no_kill, False, args.quiet_rounds, gaps_quiet),
            ("locks", "one-shot + instant_wake", locks, {"instant_wake": True}, False, args.oneshot_rounds, gaps_mixed),
            ("locks", "ring=True, another rings", locks, {}, "second", args.oneshot_rounds, gaps_mixed),
            ("locks", "the same, instant_wake=false", locks, no_kill, "second", args.oneshot_rounds, gaps_mixed),
            ("polling", "one-shot put()", polling, {}, False, args.oneshot_rounds, gaps_mixed),
        ]
        if server is not None:
            runs.insert(1, ("locks", "bell, flush_log_at_trx_commit=2", locks, {}, True, args.bell_rounds,
                            gaps_short))
        lat = []
        for i, (mode, what, wakeup, pw, ring, rounds, gap) in enumerate(runs):
            fast = "flush_log_at_trx_commit=2" in what
            if fast:
                admin.query("SET GLOBAL innodb_flush_log_at_trx_commit = 2")
            try:
                values = latencies(env, admin, wakeup, pw, ring, rounds, gap, args.consumers, rx, sock, seed=i)
            finally:
                if fast:
                    admin.query("SET GLOBAL innodb_flush_log_at_trx_commit = 1")
            row = {"mode": mode, "producer": what, "rounds": rounds, "gap_s": list(gap),
                   "loadavg_1m_after": round(os.getloadavg()[0], 2),
                   **{f"p{p}_ms": round(pct(values, p) * 1e3, 2) for p in (50, 95, 99)},
                   "max_ms": round(max(values) * 1e3, 2)}
            lat.append(row)
            print(f"  latency {mode:8s} {what:28s} p50 {row['p50_ms']:8.2f} ms  p95 {row['p95_ms']:8.2f} ms  "
                  f"p99 {row['p99_ms']:8.2f} ms", flush=True)

    def find(mode, what):
        return next(r for r in lat if r["mode"] == mode and r["producer"] == what)

    bell, one, quiet = find("locks", "bell (ring=True)"), find("locks", "one-shot put()"), \
        find("locks", "one-shot, idle >= 2.5 caps")
    targets = {
        "idle cost <= 2 queries/s per queue (locks, 1 and 10 consumers)":
            all(r["queries_per_s"] <= 2 for r in idle if r["mode"] == "locks") if idle else None,
        "bell p50 <= 2 ms": bell["p50_ms"] <= 2,
        "bell p99 <= 20 ms": bell["p99_ms"] <= 20,
        "one-shot p50 <= cap/2 (mixed gaps)": one["p50_ms"] <= cap * 500,
        "one-shot p50 <= cap/2 (after >= 2.5 caps idle)": quiet["p50_ms"] <= cap * 500,
    }
    result = {"server": version, "cpus": os.cpu_count(), "cap_s": cap, "idle_window_s": args.idle_s,
              "consumers_during_latency": args.consumers, "idle": idle, "latency": lat, "targets": targets}

    print()
    print("| mode | consumers | idle queries/s | load 1m |")
    print("|---|---:|---:|---:|")
    for r in idle:
        print(f"| {r['mode']} | {r['consumers']} | {r['queries_per_s']:.2f} | {r['loadavg_1m_after']:.1f} |")
    print()
    print("| mode | producer | rounds | gap s | p50 ms | p95 ms | p99 ms | max ms | load 1m |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|")
    for r in lat:
        print(f"| {r['mode']} | {r['producer']} | {r['rounds']} | {r['gap_s'][0]:g}-{r['gap_s'][1]:g} | "
              f"{r['p50_ms']:.2f} | {r['p95_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.2f} | "
              f"{r['loadavg_1m_after']:.1f} |")
    print()
    for name, ok in targets.items():
        print(f"{'not measured' if ok is None else 'MET   ' if ok else 'MISSED'} {name}")
    print()
    print(json.dumps(result, indent=2))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
