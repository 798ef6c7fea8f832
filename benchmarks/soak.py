#!/usr/bin/env python3
"""notifyq soak: many jobs through consumers that keep getting SIGKILLed, across server restarts.

    .venv/bin/python benchmarks/soak.py [--jobs 200000] [--consumers 10] [--kill-every 2]
                                        [--restarts 2] [--json soak.json]

A private MariaDB/MySQL (notifyq.localserver.LocalServer) in a temp dir; `--consumers` real
`notifyq consume` processes with the default reap and wake-up settings, logged in as a
least-privilege runtime user; one long-lived producer (Producer.put_many, ringing the bell)
inside this process, paced to keep a bounded backlog so it is still producing when the server
goes down. Every ~`--kill-every` s (jittered +-50%) a random consumer is frozen (SIGSTOP), the
jobs it holds are counted (its in-flight jobs), it is SIGKILLed and a new one is started. At
evenly spaced points of progress the server is restarted: alternately a clean restart and a
crash (SIGKILL, then start).

The handler is this file's `record` (consumers import it as `soak:record`): one line per run,
"<n> <job id> <attempt>", where n is the payload's sequence number. At the end:
  lost        jobs whose put_many() returned, never run          (must be 0)
  phantom     runs of an n nobody enqueued                       (must be 0)
  duplicates  extra runs (a job run k times counts k - 1)        (at most the in-flight total)
  unknown     jobs of chunks whose put_many() raised OutcomeUnknown, and how many turned out stored
and the time each killed consumer's jobs took to be claimed again (the 5 s target).
Prints a table and one JSON document (also to --json). Exit 0 when the verdict holds.
"""

from __future__ import annotations

import os
import time

_files: dict[int, object] = {}
_WORK_S = float(os.environ.get("SOAK_WORK_MS", "0")) / 1000


def record(job) -> None:
    """The consumers' handler: "work" (a sleep), then one line; O_APPEND lines never interleave."""
    if _WORK_S:
        time.sleep(_WORK_S)
    f = _files.get(os.getpid())
    if f is None:
        path = os.path.join(os.environ["SOAK_OUT"], f"{os.getpid()}.log")
        f = _files[os.getpid()] = open(path, "a", buffering=1)
    f.write(f"{job.payload['n']} {job.id} {job.attempts}\n")


# --------------------------------------------------------------------------- the driver

import argparse  # noqa: E402
import collections  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

QUEUE = "soak"
RUNTIME_USER = "nq_soak"
RUNTIME_PASSWORD = "soak-runtime-pw"


class Root:
    """Admin queries for the driver; a fresh connection each time, so a server restart is harmless."""

    def __init__(self, dsn):
        self.dsn = dsn

    def query(self, sql: str, params=None, retries: int = 600) -> list[tuple]:
        import MySQLdb

        for _ in range(retries):
            conn = None
            try:
                conn = MySQLdb.connect(**self.dsn.connect_args(), autocommit=True, connect_timeout=5)
                cur = conn.cursor()
                cur.execute(sql, params)
                return list(cur.fetchall())
            except MySQLdb.OperationalError:
                time.sleep(0.1)  # the server is restarting: try again shortly
            finally:
                if conn is not None:
                    conn.close()
        raise RuntimeError(f"server unreachable for {retries * 0.1:.0f}s")

    def scalar(self, sql: str, params=None):
        rows = self.query(sql, params)
        return rows[0][0] if rows else None


@dataclasses.dataclass
class Crash:
    kind: str  # sigkill | restart | crash
    at_s: float  # since the start of the run
    in_flight: int  # jobs claimed and not acked: the victim's, or everyone's for the server
    downtime_s: float | None = None  # server only
    recovery_s: float | None = None  # sigkill: until every in-flight job was claimed again


class InFlightSampler(threading.Thread):
    """Counts claimed jobs on one connection, as fast as it can, until the server goes away:
    the last counts are the jobs in flight when it went down (a single query before the
    restart would miss the claims of its last milliseconds)."""

    def __init__(self, dsn):
        super().__init__(name="in-flight-sampler", daemon=True)
        import MySQLdb

        self.conn = MySQLdb.connect(**dsn.connect_args(), autocommit=True, connect_timeout=5)
        self.samples: collections.deque = collections.deque(maxlen=20)
        self.first = self._count()

    def _count(self) -> int:
        cur = self.conn.cursor()
        cur.execute("SELECT COUNT(*) FROM nq_job WHERE status = 2")
        return int(cur.fetchone()[0])

    def run(self) -> None:
        try:
            while True:
                self.samples.append(self._count())
        except Exception:  # the server went down: that was the point
            pass
        finally:
            try:
                self.conn.close()
            except Exception:
                pass

    @property
    def in_flight(self) -> int:
        return max([self.first, *self.samples])


class Feeder(threading.Thread):
    """The producer: put_many chunks, never more than max_backlog jobs ahead of the consumers."""

    def __init__(self, config, total: int, chunk: int, max_backlog: int):
        super().__init__(name="soak-producer", daemon=True)
        self.config, self.total, self.chunk, self.max_backlog = config, total, chunk, max_backlog
        self.remaining_in_db = 0  # updated by the driver loop
        self.acknowledged: list[range] = []
        self.unknown: list[range] = []
        self.produced = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        from notifyq import errors
        from notifyq.produce.producer import Producer

        try:
            with Producer(QUEUE, self.config, ring=True) as producer:
                n = 0
                while n < self.total and not self.stop.is_set():
                    if self.remaining_in_db > self.max_backlog:
                        self.stop.wait(0.02)  # pacing, not synchronisation: consumers catch up
                        continue
                    part = range(n, min(n + self.chunk, self.total))
                    try:
                        producer.put_many([{"n": i} for i in part])
                        self.acknowledged.append(part)
                    except errors.OutcomeUnknown:
                        self.unknown.append(part)
                    except errors.TransientDBError as e:  # not committed: put the chunk again
                        self.errors.append(str(e))
                        continue
                    n = part.stop
                    self.produced = n
                    self.remaining_in_db += len(part)
        except BaseException as e:
            self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            self.done.set()


class Fleet:
    def __init__(self, env: dict[str, str], logdir: Path):
        self.env, self.logdir = env, logdir
        self.procs: list[subprocess.Popen] = []
        self.started = 0

    def spawn(self) -> subprocess.Popen:
        self.started += 1
        err = (self.logdir / f"consumer{self.started}.err").open("w")
        return subprocess.Popen([sys.executable, "-m", "notifyq", "consume", "-q", QUEUE,
                                 "--handler", "soak:record"], env=self.env, stdout=subprocess.DEVNULL,
                                stderr=err, cwd=str(REPO))

    def start(self, n: int) -> None:
        self.procs = [self.spawn() for _ in range(n)]


def _setup_database(server_dsn: str):
    import MySQLdb

    from notifyq.config import DSN
    from notifyq.store import schema

    root = DSN.parse(server_dsn)
    admin = dataclasses.replace(root, database="nq_soak")
    schema.init(admin)
    conn = MySQLdb.connect(**{k: v for k, v in root.connect_args().items() if k != "database"}, autocommit=True)
    cur = conn.cursor()
    for host in ("%", "localhost"):
        cur.execute(f"CREATE USER IF NOT EXISTS '{RUNTIME_USER}'@'{host.replace('%', '%%')}' IDENTIFIED BY %s",
                    (RUNTIME_PASSWORD,))
        for grant in schema.grants("nq_soak", f"'{RUNTIME_USER}'@'{host}'"):
            cur.execute(grant)
    conn.close()
    return admin


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run(args: argparse.Namespace) -> dict:
    from notifyq import config as config_mod
    from notifyq.run.localserver import LocalServer

    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="nq-soak-"))
    out, logs = workdir / "runs", workdir / "logs"
    out.mkdir()
    logs.mkdir()
    driver_log = logging.FileHandler(logs / "producer.log")  # the in-process producer's retries
    driver_log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.getLogger("notifyq").addHandler(driver_log)
    logging.getLogger("notifyq").propagate = False
    server = LocalServer(workdir / "server")
    server.start()
    try:
        admin = _setup_database(server.dsn)
        root = Root(admin)
        cfg_path = workdir / "notifyq.toml"
        # Real defaults for reaping and wake-ups; only attempts are raised, so that a job that
        # happens to be in flight at several kills is not buried as dead (that is not the test).
        cfg_path.write_text("[defaults]\nmax_attempts = 1000\n")
        cfg_path.chmod(0o600)
        url = f"mysql://{RUNTIME_USER}@127.0.0.1:{server.port}/nq_soak"
        env = {**os.environ, "NOTIFYQ_DSN": url, "NOTIFYQ_PASSWORD": RUNTIME_PASSWORD,
               "NOTIFYQ_CONFIG": str(cfg_path), "SOAK_OUT": str(out), "SOAK_WORK_MS": str(args.work_ms),
               "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)])}
        config = config_mod.load(env={k: env[k] for k in ("NOTIFYQ_DSN", "NOTIFYQ_PASSWORD", "NOTIFYQ_CONFIG")})
        fleet = Fleet(env, logs)
        fleet.start(args.consumers)
        deadline = time.monotonic() + 60
        while root.scalar("SELECT COUNT(*) FROM nq_consumer") < args.consumers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumers did not register; see {logs}")
            time.sleep(0.1)

        feeder = Feeder(config, args.jobs, args.chunk, args.max_backlog)
        crashes: list[Crash] = []
        pending: list[tuple[Crash, float, tuple[int, ...], tuple[str, ...]]] = []
        started = time.monotonic()
        feeder.start()
        next_kill = started + args.kill_every * rng.uniform(0.5, 1.5)
        restart_marks = [args.jobs * (k + 1) / (args.restarts + 1) for k in range(args.restarts)]
        last_progress, last_remaining, handled_estimate = time.monotonic(), -1, 0
        backlog: list[int] = []  # jobs in the table at each driver turn: were consumers saturated?

        while True:
            now = time.monotonic()
            remaining = root.scalar("SELECT COUNT(*) FROM nq_job")
            feeder.remaining_in_db = remaining
            backlog.append(remaining)
            handled_estimate = feeder.produced - remaining
            if remaining != last_remaining:
                last_progress, last_remaining = now, remaining
            if now - last_progress > args.stall_s:
                raise RuntimeError(f"no progress for {args.stall_s:.0f}s ({remaining} jobs left); logs in {logs}")

            # Recovery of killed consumers' jobs: claimed again by someone, or done. Before the
            # end of the run: the last jobs to come back may be a killed consumer's, held until then.
            for item in list(pending):
                crash, t0, ids, owners = item
                left = root.scalar(
                    "SELECT COUNT(*) FROM nq_job WHERE id IN %s AND status IN (0, 1, 2) "
                    "AND (owner IS NULL OR owner IN %s)", (ids, owners))
                if left == 0:
                    crash.recovery_s = time.monotonic() - t0
                    pending.remove(item)
            if feeder.done.is_set() and remaining == 0:
                break

            if restart_marks and handled_estimate >= restart_marks[0]:
                restart_marks.pop(0)
                kind = "restart" if sum(c.kind != "sigkill" for c in crashes) % 2 == 0 else "crash"
                sampler = InFlightSampler(root.dsn)
                sampler.start()
                t0 = time.monotonic()
                if kind == "restart":
                    server.stop()
                else:
                    server.kill()
                sampler.join(30)
                server.start()
                in_flight = sampler.in_flight
                crashes.append(Crash(kind, t0 - started, in_flight, downtime_s=time.monotonic() - t0))
                print(f"  {t0 - started:7.1f}s server {kind}: {in_flight} jobs in flight, "
                      f"down {crashes[-1].downtime_s:.2f}s", flush=True)
                continue

            if now >= next_kill and (remaining > 0 or not feeder.done.is_set()):
                next_kill = now + args.kill_every * rng.uniform(0.5, 1.5)
                slot = rng.randrange(len(fleet.procs))
                victim = fleet.procs[slot]
                victim.send_signal(signal.SIGSTOP)  # its sessions stay open: what it holds stays put
                rows = root.query("SELECT j.id, j.owner FROM nq_job j JOIN nq_consumer c ON c.id = j.owner "
                                  "WHERE c.pid = %s AND j.status = 2", (victim.pid,))
                owners = tuple(r[0] for r in root.query("SELECT id FROM nq_consumer WHERE pid = %s",
                                                       (victim.pid,))) or ("-",)
                victim.send_signal(signal.SIGKILL)
                t0 = time.monotonic()
                victim.wait(30)
                crash = Crash("sigkill", t0 - started, len(rows))
                crashes.append(crash)
                if rows:
                    pending.append((crash, t0, tuple(r[0] for r in rows), owners))
                else:
                    crash.recovery_s = 0.0
                fleet.procs[slot] = fleet.spawn()
            time.sleep(0.05)  # the driver's poll interval

        wall_s = time.monotonic() - started
        # A consumer still starting up dies of SIGTERM (by design: it holds nothing yet), so
        # every live process must have registered first. By its pid: a row count would also
        # count the row of a consumer just SIGKILLed, not reaped yet, while its replacement
        # is still importing.
        deadline = time.monotonic() + 60
        live = {proc.pid for proc in fleet.procs}
        while (not live <= {r[0] for r in root.query("SELECT pid FROM nq_consumer")}
               and time.monotonic() < deadline):
            time.sleep(0.1)
        codes = []
        for proc in fleet.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in fleet.procs:
            try:
                codes.append(proc.wait(60))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append("hung")
        feeder.stop.set()
        feeder.join(10)
        dead = root.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 4")
        left = root.scalar("SELECT COUNT(*) FROM nq_job")
        return _report(args, out, feeder, crashes, codes, dead, left, wall_s, backlog)
    finally:
        if args.keep:
            server.stop()
            print(f"kept {workdir}")
        else:
            server.cleanup()
            shutil.rmtree(workdir, ignore_errors=True)


def _report(args, out: Path, feeder: Feeder, crashes: list[Crash], codes: list, dead: int, left: int,
            wall_s: float, backlog: list[int]) -> dict:
    runs: collections.Counter = collections.Counter()
    for path in out.glob("*.log"):
        with path.open() as f:
            for line in f:
                runs[int(line.split(" ", 1)[0])] += 1
    acknowledged = {n for part in feeder.acknowledged for n in part}
    unknown = {n for part in feeder.unknown for n in part}
    lost = acknowledged - runs.keys()
    phantom = runs.keys() - acknowledged - unknown
    duplicates = sum(k - 1 for k in runs.values() if k > 1)
    kills = [c for c in crashes if c.kind == "sigkill"]
    in_flight_total = sum(c.in_flight for c in crashes)
    recoveries = [c.recovery_s for c in kills if c.in_flight and c.recovery_s is not None]
    verdict = (not lost and not phantom and not dead and not left and not feeder.errors
               and duplicates <= in_flight_total and all(c == 0 for c in codes))
    result = {
        "jobs": args.jobs, "consumers": args.consumers, "kill_every_s": args.kill_every, "work_ms": args.work_ms,
        "acknowledged": len(acknowledged), "handled": len(runs), "runs": sum(runs.values()),
        "lost": len(lost), "phantom": len(phantom), "dead": dead, "left_in_queue": left,
        "duplicates": duplicates, "jobs_run_more_than_once": sum(1 for k in runs.values() if k > 1),
        "kills": len(kills), "server_restarts": sum(1 for c in crashes if c.kind != "sigkill"),
        "in_flight_total": in_flight_total,
        "in_flight_at_kills": [c.in_flight for c in kills],
        "kills_at_s": [round(c.at_s, 1) for c in kills],  # against server_events' at_s: after a restart?
        "recovery_at_kills": [None if c.recovery_s is None else round(c.recovery_s, 2) for c in kills],
        "server_events": [dataclasses.asdict(c) for c in crashes if c.kind != "sigkill"],
        "outcome_unknown_jobs": len(unknown), "outcome_unknown_stored": len(unknown & runs.keys()),
        "producer_errors": feeder.errors,
        "recovery_s": {"n": len(recoveries), "p50": _percentile(recoveries, 0.5),
                       "p95": _percentile(recoveries, 0.95), "max": max(recoveries, default=None),
                       "over_5s": sum(1 for r in recoveries if r >= 5.0),
                       "unmeasured": sum(1 for c in kills if c.in_flight and c.recovery_s is None)},
        "consumer_exit_codes": collections.Counter(map(str, codes)),
        "backlog": {"median": statistics.median(backlog) if backlog else None,
                    "zero_share": round(sum(1 for b in backlog if b == 0) / len(backlog), 3) if backlog else None},
        "wall_s": round(wall_s, 1), "jobs_per_s": round(len(runs) / wall_s, 1) if wall_s else None,
        "ok": verdict,
    }
    if lost:
        result["lost_sample"] = sorted(lost)[:20]
    _print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, default=str))
    return result


def _print_table(r: dict) -> None:
    rec = r["recovery_s"]
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    rows = [
        ("jobs (acknowledged / handled)", f"{r['jobs']} ({r['acknowledged']} / {r['handled']})"),
        ("consumers, SIGKILL every ~", f"{r['consumers']}, {r['kill_every_s']:g}s"),
        ("SIGKILLs / server restarts", f"{r['kills']} / {r['server_restarts']}"),
        ("lost / phantom / dead / left", f"{r['lost']} / {r['phantom']} / {r['dead']} / {r['left_in_queue']}"),
        ("duplicates (extra runs)", f"{r['duplicates']} ({r['jobs_run_more_than_once']} jobs)"),
        ("in flight at crashes (total)", f"{r['in_flight_total']}"),
        ("  at each SIGKILL", " ".join(map(str, r["in_flight_at_kills"])) or "-"),
        ("  at each server restart", " ".join(f"{e['kind']}:{e['in_flight']}" for e in r["server_events"]) or "-"),
        ("put_many OutcomeUnknown (stored)", f"{r['outcome_unknown_jobs']} ({r['outcome_unknown_stored']})"),
        ("back in work after SIGKILL (s)", f"p50 {fmt(rec['p50'])}  p95 {fmt(rec['p95'])}  max {fmt(rec['max'])}"
                                           f"  >=5s: {rec['over_5s']}/{rec['n']}"),
        ("consumer exit codes (SIGTERM)", ", ".join(f"{k}x{v}" for k, v in r["consumer_exit_codes"].items())),
        ("backlog median (share empty)", f"{r['backlog']['median']} ({r['backlog']['zero_share']})"),
        ("wall time / throughput", f"{r['wall_s']}s / {r['jobs_per_s']} jobs/s"),
        ("verdict", "OK" if r["ok"] else "FAILED"),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--consumers", type=int, default=10)
    ap.add_argument("--kill-every", type=float, default=2.0, help="seconds between SIGKILLs (jittered)")
    ap.add_argument("--restarts", type=int, default=2, help="server restarts (alternately clean and crash)")
    ap.add_argument("--work-ms", type=float, default=1.0, help="each job's simulated work (a sleep)")
    ap.add_argument("--chunk", type=int, default=500, help="jobs per put_many")
    ap.add_argument("--max-backlog", type=int, default=20_000, help="producer stays at most this far ahead")
    ap.add_argument("--stall-s", type=float, default=120.0, help="give up after this long without progress")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", help="also write the JSON result here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (server datadir, logs)")
    args = ap.parse_args(argv)
    print(f"soak: {args.jobs} jobs, {args.consumers} consumers, SIGKILL every ~{args.kill_every:g}s, "
          f"{args.restarts} server restarts", flush=True)
    return 0 if run(args)["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
