#!/usr/bin/env python3
"""Pick-up from idle on every enqueue path, with where the time goes: from the enqueue's return
to the handler's first line, and each phase of it.

    .venv/bin/python benchmarks/pickup.py [--dsn mysql://root@host:port/] [--jobs 200]
        [--paths ring,defaults,...] [--consumers 2] [--code CHECKOUT] [--json out.json]

Without --dsn it starts a private throwaway MariaDB. Idle `notifyq consume` processes (one
worker each, default settings) serve one queue; each path puts jobs one at a time, each waited
for, at random gaps (--gap-ms), so every job is picked up from idle. The paths:

  ring          Producer(ring=True).put(): the long-lived producer
  defaults      Producer().put(): no bell, the instant wake (KILL QUERY of the watcher's wait)
  conn_wake     put(conn=) on the caller's MySQLdb connection, its COMMIT, then Producer.wake()
  transaction   Producer(ring=True).transaction(conn): put in the block, COMMIT and wake at its end
  django        enqueue_on_commit() inside transaction.atomic() (contrib.django)
  async         `await notifyq.AsyncProducer(...).put()`
  producers8    8 processes, each a Producer(ring=True), putting at random gaps at the same time
  produce       a long-running `notifyq produce` fed one JSON line at a time on its stdin

The latency (p50, p99, max) is taken from the enqueue's return: put()'s (ring, defaults,
async, producers8), the caller's COMMIT's (conn_wake, transaction, django: the job exists from
then on), the line's write (produce: the enqueue's INSERT and COMMIT are inside it). "from
put()" is taken from put()'s return on every path but produce: on conn_wake, transaction and
django it holds the caller's own COMMIT (its fsync), which the other paths' put() runs inside;
the target column judges it. Phases, from marks the processes send (benchmarks/_phase_marks.py
wraps notifyq's functions; nothing in the package changes for it), medians:

  read          produce only: the line written -> `notifyq produce` read it
  commit        the COMMIT came back: from put()'s call (ring, defaults, async, producers8; produce:
                from the read), or the caller's COMMIT alone (conn_wake, transaction, django)
  commit->wake  the COMMIT's reply -> the ring or KILL QUERY sent ("-" when none was sent); on
                django it holds Django's own `SET autocommit=1` round trip, after which atomic()
                runs its on-commit hooks (enqueue_on_commit's wake() is one)
  wake->awake   -> the consumer's watch statement returned (its wait ended)
  awake->claim  -> its claim began (any watch statement between: an interrupted wait reads again)
  claim         the claim's round trips (queries.claim)
  claim->handler -> the handler's first line

--code runs another checkout's notifyq (its producer and consumers) under this benchmark: the
old commit and the new, measured in one sitting (`git worktree add ../base main`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from _procs import stop_all, wait_idle

HERE = Path(__file__).resolve().parent
QUEUE = "pickup"
PATHS = ("ring", "defaults", "conn_wake", "transaction", "django", "async", "producers8", "produce")
WARM = 3  # each path's first jobs arm its producer (connections, the bell): not counted
PICKUP_TIMEOUT_S = 10.0
TARGET_P50_MS, TARGET_P99_MS = 1.5, 10.0


def code_path() -> Path:
    return Path(os.environ.get("NQB_CODE") or HERE.parent)


# ---------------------------------------------------------------------------- marks


class Marks:
    """The benchmark's end of the marks socket: producer marks by (kind, pid), jobs by id."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        self.marks: dict[tuple[str, int], list[float]] = {}
        self.jobs: dict[int, tuple] = {}
        self.tags: dict[str, int] = {}  # a payload's "tag" -> its job id
        self.seen = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                parts = self.sock.recv(4096).decode().split(" ")
            except socket.timeout:
                continue
            with self.seen:
                if parts[0] == "job":
                    watches = [float(w) for w in parts[7].split(",") if w] if len(parts) > 7 else []
                    self.jobs[int(parts[1])] = (int(parts[2]), float(parts[3]), float(parts[4]),
                                                float(parts[5]), watches)
                    self.tags[parts[6]] = int(parts[1])
                    self.seen.notify_all()
                else:
                    self.marks.setdefault((parts[0], int(parts[1])), []).append(float(parts[2]))

    def handler_start(self, job_id: int, timeout_s: float = PICKUP_TIMEOUT_S) -> float:
        with self.seen:
            if not self.seen.wait_for(lambda: job_id in self.jobs, timeout_s):
                raise RuntimeError(f"job {job_id} was not picked up within {timeout_s} s")
            return self.jobs[job_id][1]

    def job_tagged(self, tag: str, timeout_s: float = PICKUP_TIMEOUT_S) -> int:
        with self.seen:
            if not self.seen.wait_for(lambda: tag in self.tags, timeout_s):
                raise RuntimeError(f"the job tagged {tag} was not picked up within {timeout_s} s")
            return self.tags[tag]

    def first(self, kind: str, pid: int, after: float, before: float) -> float | None:
        with self.seen:
            return next((t for t in self.marks.get((kind, pid), ()) if after <= t <= before), None)

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()
        os.unlink(self.path)


def phases(marks: Marks, sample: dict) -> dict:
    """One job's timeline: {"total", "from_commit", "read", "commit", "commit_wake", ...} in ms."""
    _, handler, claim_start, claim_end, watches = marks.jobs[sample["job"]]
    pid, call = sample["pid"], sample["call"]
    out = {"total": handler - sample["ref"]}
    if not sample.get("produce"):
        out["from_put"] = handler - sample.get("put_ret", sample["ref"])
    read = marks.first("read", pid, call, handler) if sample.get("produce") else None
    commit = sample.get("commit") or marks.first("commit", pid, read or call, handler)
    if read is not None:
        out["read"] = read - call
    if commit is None:
        return {k: v * 1e3 for k, v in out.items()}
    out["commit"] = commit - sample.get("commit_start", read or call)
    out["from_commit"] = handler - commit
    wake = marks.first("wake", pid, commit - 0.0005, handler)  # a KILL's mark may precede the COMMIT's by µs
    woken_from = wake if wake is not None else commit
    if wake is not None:
        out["commit_wake"] = wake - commit
    awake = next((w for w in watches if w >= woken_from and w <= claim_start), None)
    if awake is not None:
        out["wake_awake"] = awake - woken_from
        out["awake_claim"] = claim_start - awake
    out["claim"] = claim_end - claim_start
    out["claim_handler"] = handler - claim_end
    return {k: v * 1e3 for k, v in out.items()}


PHASES = ("read", "commit", "commit_wake", "wake_awake", "awake_claim", "claim", "claim_handler")


def summary(path: str, timelines: list[dict]) -> dict:
    total = sorted(t["total"] for t in timelines)
    row = {"path": path, "jobs": len(total), "p50_ms": statistics.median(total),
           "p99_ms": total[min(len(total) - 1, int(len(total) * 0.99))], "max_ms": total[-1]}
    from_commit = [t["from_commit"] for t in timelines if "from_commit" in t]
    row["from_commit_p50_ms"] = statistics.median(from_commit) if from_commit else None
    from_put = sorted(t["from_put"] for t in timelines if "from_put" in t)
    row["from_put_p50_ms"] = statistics.median(from_put) if from_put else None
    row["from_put_p99_ms"] = from_put[min(len(from_put) - 1, int(len(from_put) * 0.99))] if from_put else None
    for name in PHASES:
        values = [t[name] for t in timelines if name in t]
        row[f"{name}_p50_ms"] = statistics.median(values) if values else None
        row[f"{name}_n"] = len(values)
    return row


# ---------------------------------------------------------------------------- the paths


class Bench:
    def __init__(self, url: str, workdir: Path, args):
        self.url, self.workdir, self.args = url, workdir, args
        self.marks = Marks(workdir / "marks.sock")
        os.environ["NQB_MARKS"] = self.marks.path  # this process's own marks (its producers)
        self.rng = random.Random(args.seed)
        self.env = {**os.environ, "NOTIFYQ_CONFIG": "/dev/null", "NOTIFYQ_DSN": url,
                    "NOTIFYQ_LOG_LEVEL": "warning", "NQB_MARKS": self.marks.path,
                    "PYTHONPATH": os.pathsep.join([str(HERE), str(code_path())])}
        self.env.pop("NOTIFYQ_PASSWORD", None)
        from notifyq import config as config_mod

        self.cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"},
                                   overrides={"dsn": url, "log": {"level": "warning"}})
        self.log = open(workdir / "children.log", "a")

    def gap(self) -> None:
        lo, hi = self.args.gap_ms
        time.sleep(self.rng.uniform(lo, hi) / 1e3)

    def child(self, *argv: str, **kw) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, __file__, *argv], env=self.env, stderr=self.log, **kw)

    def one_at_a_time(self, send, jobs: int) -> list[dict]:
        """send() -> sample {"job", "pid", "call", "ref"[, "commit"]}; each job waited for."""
        out = []
        for i in range(WARM + jobs):
            self.gap()
            sample = send()
            self.marks.handler_start(sample["job"])
            if i >= WARM:
                out.append(sample)
        return out

    def put_path(self, jobs: int, ring: bool) -> list[dict]:
        from notifyq.produce.producer import Producer

        with Producer(QUEUE, self.cfg, ring=ring) as producer:
            def send() -> dict:
                call = time.monotonic()
                job = producer.put({})
                return {"job": job, "pid": os.getpid(), "call": call, "ref": time.monotonic()}

            return self.one_at_a_time(send, jobs)

    def caller_conn(self):
        import MySQLdb

        from notifyq.config import DSN

        return MySQLdb.connect(**DSN.parse(self.url).connect_args())

    def conn_wake(self, jobs: int) -> list[dict]:
        from notifyq.produce.producer import Producer

        conn = self.caller_conn()
        try:
            with Producer(QUEUE, self.cfg) as producer:
                def send() -> dict:
                    call = time.monotonic()
                    job = producer.put({}, conn=conn)
                    put_ret = time.monotonic()
                    conn.commit()
                    committed = time.monotonic()
                    producer.wake()
                    return {"job": job, "pid": os.getpid(), "call": call, "ref": committed, "commit": committed,
                            "put_ret": put_ret, "commit_start": put_ret}

                return self.one_at_a_time(send, jobs)
        finally:
            conn.close()

    def transaction(self, jobs: int) -> list[dict]:
        from notifyq.produce.producer import Producer

        conn = self.caller_conn()
        commit = conn.commit
        committed = [0.0, 0.0]  # the COMMIT's call and return

        def stamped_commit() -> None:
            committed[0] = time.monotonic()
            commit()
            committed[1] = time.monotonic()

        conn.commit = stamped_commit  # what transaction() calls at the block's end
        try:
            with Producer(QUEUE, self.cfg, ring=True) as producer:
                def send() -> dict:
                    call = time.monotonic()
                    with producer.transaction(conn) as tx:
                        job = tx.put({})
                        put_ret = time.monotonic()
                    return {"job": job, "pid": os.getpid(), "call": call, "ref": committed[1],
                            "commit": committed[1], "put_ret": put_ret, "commit_start": committed[0]}

                return self.one_at_a_time(send, jobs)
        finally:
            conn.close()

    def django(self, jobs: int) -> list[dict]:
        import django
        from django.conf import settings

        from notifyq.config import DSN

        dsn = DSN.parse(self.url)
        if not settings.configured:
            settings.configure(
                DATABASES={"default": {"ENGINE": "django.db.backends.mysql", "NAME": dsn.database,
                                       "USER": dsn.user, "PASSWORD": dsn.password or "",
                                       "HOST": dsn.unix_socket or dsn.host, "PORT": str(dsn.port or "")}},
                INSTALLED_APPS=["notifyq.contrib.django"], USE_TZ=True,
                NOTIFYQ={"CONFIG": {"log": {"level": "warning"}}})
            django.setup()
        from django.db import connection, transaction

        from notifyq.contrib.django.enqueue import enqueue_on_commit, get_producer

        commit = connection.commit
        committed = [0.0, 0.0]  # the COMMIT's call and return

        def stamped_commit() -> None:  # what atomic()'s exit calls; its on-commit hooks run later,
            committed[0] = time.monotonic()  # after Django's `SET autocommit=1` round trip
            commit()
            committed[1] = time.monotonic()

        connection.commit = stamped_commit

        def send() -> dict:
            call = time.monotonic()
            with transaction.atomic():
                job = enqueue_on_commit(QUEUE, {})
                put_ret = time.monotonic()
            return {"job": job, "pid": os.getpid(), "call": call, "ref": committed[1], "commit": committed[1],
                    "put_ret": put_ret, "commit_start": committed[0]}

        try:
            return self.one_at_a_time(send, jobs)
        finally:
            get_producer(QUEUE).close()
            connection.close()

    def async_path(self, jobs: int) -> list[dict]:
        import notifyq

        async def main() -> list[dict]:
            async with notifyq.AsyncProducer(QUEUE, self.cfg) as producer:
                out = []
                for i in range(WARM + jobs):
                    await asyncio.sleep(self.rng.uniform(*self.args.gap_ms) / 1e3)
                    call = time.monotonic()
                    job = await producer.put({})
                    sample = {"job": job, "pid": os.getpid(), "call": call, "ref": time.monotonic()}
                    await asyncio.get_running_loop().run_in_executor(None, self.marks.handler_start, job)
                    if i >= WARM:
                        out.append(sample)
                return out

        return asyncio.run(main())

    def producers8(self, jobs: int) -> list[dict]:
        n = self.args.producers
        per = max(1, jobs // n)
        procs = [self.child("--producer-child", str(per), str(self.args.seed * 100 + i), str(self.args.producers_gap_ms),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(n)]
        try:
            for p in procs:
                if p.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"a producer did not start{self.log_tail()}")
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            outputs = [p.communicate(timeout=per * (self.args.producers_gap_ms / 1e3 + 5) + 60)[0] for p in procs]
        finally:
            stop_all(procs, signal.SIGKILL)
        samples = []
        for p, out in zip(procs, outputs):
            for line in out.splitlines():
                job, call, ref = line.split()
                samples.append({"job": int(job), "pid": p.pid, "call": float(call), "ref": float(ref)})
        for s in samples:
            self.marks.handler_start(s["job"])
        return samples

    def produce(self, jobs: int) -> list[dict]:
        proc = self.child("--produce-child", stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        fd = proc.stdin.fileno()
        try:
            def send() -> dict:
                tag = uuid.uuid4().hex
                line = json.dumps({"tag": tag}) + "\n"
                call = time.monotonic()
                os.write(fd, line.encode())
                job = self.marks.job_tagged(tag)
                return {"job": job, "pid": proc.pid, "call": call, "ref": call, "produce": True}

            return self.one_at_a_time(send, jobs)
        finally:
            proc.stdin.close()  # EOF: produce commits what it has and exits
            stop_all([proc], 0, 60)

    def log_tail(self) -> str:
        self.log.flush()
        return "\n" + "".join(open(self.log.name).readlines()[-20:])


def run(url: str, workdir: Path, args) -> list[dict]:
    sys.path.insert(0, str(code_path()))
    from notifyq.config import DSN
    from notifyq.store import schema

    schema.init(DSN.parse(url))
    bench = Bench(url, workdir, args)
    import _phase_marks

    _phase_marks.install_producer()
    consumers = [bench.child("--consumer-child", stdout=bench.log) for _ in range(args.consumers)]
    rows = []
    try:
        # Up and idle: the first job reaches a handler, then the fleet settles into its watch.
        bench.put_path(1, ring=False)
        wait_idle([p.pid for p in consumers])
        for path in args.paths:
            if any(p.poll() is not None for p in consumers):
                raise RuntimeError(f"a consumer exited{bench.log_tail()}")
            run_path = {"ring": lambda n: bench.put_path(n, True), "defaults": lambda n: bench.put_path(n, False),
                        "conn_wake": bench.conn_wake, "transaction": bench.transaction, "django": bench.django,
                        "async": bench.async_path, "producers8": bench.producers8, "produce": bench.produce}[path]
            samples = run_path(args.jobs)
            row = summary(path, [phases(bench.marks, s) for s in samples])
            row["loadavg_1m"] = round(os.getloadavg()[0], 2)
            rows.append(row)
            print_row(row, flush=True)
            time.sleep(1.0)  # the producer's bell released; the watcher back to its backoff
    finally:
        stop_all(consumers)
        bench.marks.close()
        bench.log.close()
    return rows


# ---------------------------------------------------------------------------- children


def consumer_child() -> int:
    sys.path.insert(0, str(code_path()))
    import _phase_marks

    _phase_marks.install_consumer()
    from notifyq.run.cli import main

    main(["consume", "-q", QUEUE, "--handler", "_phase_marks:announce", "--workers", "1"])
    return 0


def produce_child() -> int:
    sys.path.insert(0, str(code_path()))
    import _phase_marks

    _phase_marks.install_producer()
    from notifyq.run.cli import main

    main(["produce", "-q", QUEUE])
    return 0


def producer_child(jobs: int, seed: int, max_gap_ms: float) -> int:
    """One of the producers8 processes: warm up, "ready", wait for "go", then put `jobs` jobs at
    random gaps, printing "job call return" for each."""
    sys.path.insert(0, str(code_path()))
    import _phase_marks

    _phase_marks.install_producer()
    from notifyq import config as config_mod
    from notifyq.produce.producer import Producer

    rng = random.Random(seed)
    with Producer(QUEUE, config_mod.load(), ring=True) as producer:
        producer.put({})
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(jobs):
            time.sleep(rng.uniform(0, max_gap_ms) / 1e3)
            call = time.monotonic()
            job = producer.put({})
            print(f"{job} {call:.9f} {time.monotonic():.9f}", flush=True)
    return 0


# ---------------------------------------------------------------------------- output


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


HEADER = ("| path | jobs | p50 | p99 | max | from put() p50 | from put() p99 | from COMMIT p50 | read | COMMIT "
          "| COMMIT→wake | wake→awake | awake→claim | claim | claim→handler | target |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")


def print_row(r: dict, flush: bool = False) -> None:
    # The target is from put()'s return: on the caller-COMMIT paths that holds the caller's COMMIT
    judged = "from_put_" if r["from_put_p50_ms"] is not None else ""
    ok = r[f"{judged}p50_ms"] <= TARGET_P50_MS and r[f"{judged}p99_ms"] <= TARGET_P99_MS
    print(f"| {r['path']} | {r['jobs']} | {_ms(r['p50_ms'])} | {_ms(r['p99_ms'])} | {_ms(r['max_ms'])} | "
          f"{_ms(r['from_put_p50_ms'])} | {_ms(r['from_put_p99_ms'])} | "
          f"{_ms(r['from_commit_p50_ms'])} | " + " | ".join(_ms(r[f'{p}_p50_ms']) for p in PHASES)
          + f" | {'yes' if ok else 'no'} |", flush=flush)


def git_head(checkout: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", default=os.environ.get("NOTIFYQ_DSN"),
                    help="root DSN of a server to use (default: a private throwaway MariaDB)")
    ap.add_argument("--jobs", type=int, default=200, help="jobs per path")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    ap.add_argument("--consumers", type=int, default=2, help="idle consumer processes (1 worker each)")
    ap.add_argument("--gap-ms", type=float, nargs=2, default=(10.0, 60.0), help="idle gap between jobs")
    ap.add_argument("--producers", type=int, default=8, help="processes of the producers8 path")
    ap.add_argument("--producers-gap-ms", type=float, default=400.0, help="producers8: each one's gaps, 0..this")
    ap.add_argument("--code", help="run the notifyq of this checkout instead of this one's")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--consumer-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--produce-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--producer-child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.code:
        os.environ["NQB_CODE"] = str(Path(args.code).resolve())
    if args.consumer_child:
        return consumer_child()
    if args.produce_child:
        return produce_child()
    if args.producer_child:
        jobs, seed, gap = args.producer_child
        return producer_child(int(jobs), int(seed), float(gap))
    args.paths = [p for p in args.paths.split(",") if p]
    unknown = set(args.paths) - set(PATHS)
    if unknown:
        ap.error(f"unknown paths: {', '.join(sorted(unknown))}")
    sys.path.insert(0, str(code_path()))
    import notifyq
    from notifyq.run.localserver import LocalServer

    print(f"code: {Path(notifyq.__file__).parent.parent} ({git_head(code_path())}), {args.consumers} consumers, {args.jobs} jobs per path, "
          f"load 1m {os.getloadavg()[0]:.2f}", flush=True)
    print(HEADER, flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="nq-pickup-"))
    try:
        if args.dsn:
            database = f"nq_pickup_{uuid.uuid4().hex[:10]}"
            rows = run(args.dsn.rstrip("/") + "/" + database, workdir, args)
        else:
            with LocalServer(workdir / "server") as server:
                rows = run(server.dsn + "nq_pickup", workdir, args)
    finally:
        shutil.rmtree(workdir, True)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"commit": git_head(code_path()), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
