#!/usr/bin/env python3
"""notifyq benchmark suite: notifyq next to two raw-SQL floors, on one server, in one run.

    .venv/bin/python benchmarks/bench.py [--quick] [--only CASES] [--json results.json] [--dsn mysql://root@host:port/]

Without --dsn a private MariaDB/MySQL server (notifyq.localserver.LocalServer) is started in a
temp dir, so the numbers are reproducible and the system database is untouched. With --dsn the
benchmark drops and recreates its own database (--database, default nq_bench) on that server.

Two floors, both plain mysqlclient, READ COMMITTED, the same handlers and JSON as notifyq:
  seed floor         _seed.py: the seed's own design on its own table (id, queue, status,
                     owner, claimed_at, payload; one index (queue, status, id)): INSERT + COMMIT
                     per job, 100-row INSERT + COMMIT in bulk; claim 3 x 100 candidates, lock by
                     SKIP LOCKED, mark, COMMIT, run, DELETE, COMMIT; poll every 0.1 s when empty.
                     notifyq / seed is the price of notifyq's code and schema together.
  same-schema floor  _floor.py: the fewest statements on notifyq's own table. notifyq / floor
                     is the price of the code alone; floor / seed the price of the schema.
Within a round every side runs once, one after the other, the order reversed every other round
(the machine drifts over minutes); a ratio is taken within each round, and reported as the
median [min-max] over the rounds. Every producer and consumer is its own process; consumers
are the real `python -m notifyq consume` command.

Cases:
  enqueue   put() per job (without the ring, and with it: the README's long-lived producer)
            and put_many() of 100, one producer process (each alone: --only enqueue_single,
            enqueue_bulk); statements per job are the server's Questions delta around the timed
            loop. "floor+signal" adds the nq_signal bump. For put() also the ring and the seed
            each with one idle consumer attached (the wake-ups happen; the consumer's
            statements count too).
  drain     N jobs inserted server-side, K consumer processes with a no-op handler, until empty;
            every job must run exactly once. Rate from the first to the last handled job and
            including start-up; consumer CPU per job from the processes' rusage; statements per
            drained job (Questions delta over the whole run); each process's first job after
            its spawn. Two same-schema floors: one SKIP LOCKED read off the ready index, and
            the same two-step shape notifyq uses.
  start     one consumer process, a batch of jobs waiting: its spawn to its first handled job.
  pickup    from idle, enqueue to handler start (_pickup.py): put() with and without the
            ring, a long-running `notifyq produce` fed one line at a time (from the write),
            and the seed (INSERT + COMMIT, consumers polling).
  sessions  database sessions of one consumer process (_sessions.py): PROCESSLIST rows of a
            user only that process uses, for 1 queue x 1 and 4 workers, 3 queues x 4 workers.
  e2e       2 long-lived producers (bell holders) committing what is due every 10 ms, 4
            consumers; offered load = a fraction of the drain rate above; latency = handler
            start - the job's COMMIT returning; the first second is reported apart.
  backlog   1k, 100k, 1M ready jobs (INSERT ... SELECT, counted by the server); single claims timed
            with the backlog topped up after each; then 4 consumers drain a slice of it.
  idle      Questions/s of the server with 10 idle consumers, per idle_wait_s window.
  wakeup    benchmarks/wakeup.py (pick-up from idle, more producer modes), on the same server.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))
sys.path.append(str(REPO / "tests"))  # number_rows: the fills the tests use too

import MySQLdb  # noqa: E402

from notifyq.config import DSN, WakeupConfig  # noqa: E402
from notifyq.run.localserver import LocalServer  # noqa: E402
from notifyq.store import schema  # noqa: E402

import _backlog  # noqa: E402  (benchmarks/ is on sys.path, as it is for the children)
import _e2e  # noqa: E402
import _pickup  # noqa: E402
import _seed  # noqa: E402
import _sessions  # noqa: E402
import _statements  # noqa: E402
from _procs import cpu_of, proc_cpu_s, wait_idle, wait_rusage  # noqa: E402
from _report import fmt, report  # noqa: E402
from _stats import alternate, compare, median, summary  # noqa: E402
from number_rows import numbers  # noqa: E402

SIZES = {
    "full": dict(
        reps=3, put_n=3000, bulk_n=50_000, chunk=100,
        drain_n=20_000, consumers=4, batch=100, start_reps=5,
        pickup_rounds=200, pickup_gap_s=(0.05, 0.25), pickup_consumers=4, pickup_settle_s=2.0,
        sessions_settle_s=5.0,
        e2e_s=8.0, e2e_warmup_s=1.0, e2e_tick_s=0.01, e2e_loads=(0.5, 0.9, 0.25), e2e_reps=3,
        producers=2,
        backlog=(1_000, 100_000, 1_000_000), claims_m=40, backlog_drain=10_000, backlog_reps=3,
        idle_consumers=10, idle_settle_s=5.0, idle_window_s=None, idle_reps=3,  # window: idle_wait_s
        wakeup_args=("--oneshot-rounds", "30", "--quiet-rounds", "8")),
    # A smoke run of every case in about a minute on a quiet 2-core machine: two rounds still
    # alternate the order; the numbers prove the plumbing, they are not a measurement.
    "quick": dict(
        reps=2, put_n=200, bulk_n=3_000, chunk=100,
        drain_n=2_000, consumers=4, batch=100, start_reps=2,
        pickup_rounds=12, pickup_gap_s=(0.05, 0.25), pickup_consumers=2, pickup_settle_s=1.0,
        sessions_settle_s=2.0,
        e2e_s=2.0, e2e_warmup_s=0.5, e2e_tick_s=0.01, e2e_loads=(0.5,), e2e_reps=1,
        producers=2,
        backlog=(1_000, 10_000), claims_m=8, backlog_drain=1_000, backlog_reps=1,
        idle_consumers=10, idle_settle_s=1.0, idle_window_s=3.0, idle_reps=1,
        wakeup_args=()),
}
QUEUE = "bench"
# The private server's redo log: MariaDB's own default, not the 16 MB of the test servers, which
# wraps every few seconds under this load and stalls every commit at each checkpoint.
BENCH_REDO_LOG_MB = 96
FILL_CHUNK = 100_000  # rows per server-side INSERT ... SELECT FROM numbers(...)


# ------------------------------------------------------------------ the bench

class Bench:
    def __init__(self, url: str, database: str, size: dict, workdir: Path, server_pid: int | None):
        parts = urllib.parse.urlsplit(url)
        self.url = urllib.parse.urlunsplit(parts._replace(path=f"/{database}"))
        self.root_url = urllib.parse.urlunsplit(parts._replace(path="/"))
        self.dsn = DSN.parse(self.url)
        self.size = size
        self.workdir = workdir
        self.server_pid = server_pid
        self.conn_args = {k: v for k, v in self.dsn.connect_args().items() if k != "ssl"}
        # Children run from compiled bytecode, as an installed package does (pip compiles it at
        # install time): under PYTHONDONTWRITEBYTECODE every process would compile notifyq anew,
        # a quarter of a second of each consumer's start-up that no deployment pays.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        self.env = {**env, "NOTIFYQ_DSN": self.url, "NOTIFYQ_CONFIG": "/dev/null",
                    "NOTIFYQ_LOG_LEVEL": "warning",
                    "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO), str(REPO / "tests"),
                                                      os.environ.get("PYTHONPATH", "")])}
        self.queue = QUEUE
        self._admin = None
        self._n = 0

    # ---------------------------------------------------------- database

    def admin(self):
        if self._admin is None:
            self._admin = MySQLdb.connect(**self.conn_args, autocommit=True)
        return self._admin

    def sql(self, statement: str, params=None) -> list[tuple]:
        cur = self.admin().cursor()
        cur.execute(statement, params)
        rows = list(cur.fetchall()) if cur.description else []
        cur.close()
        return rows

    def scalar(self, statement: str, params=None):
        rows = self.sql(statement, params)
        return rows[0][0] if rows else None

    def create(self) -> None:
        args = dict(self.conn_args)
        args.pop("database")
        conn = MySQLdb.connect(**args, autocommit=True)
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{self.dsn.database}`")
        conn.close()
        schema.init(self.dsn)
        self.sql(_seed.DDL)

    def drop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        args = dict(self.conn_args)
        args.pop("database")
        conn = MySQLdb.connect(**args, autocommit=True)
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{self.dsn.database}`")
        conn.close()

    def reset(self) -> None:
        """Every table but the schema version emptied: notifyq's as the schema has them now
        (read from the server, so a table added by a migration is emptied too) and the seed's."""
        tables = [r[0] for r in self.sql(
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
            "AND TABLE_TYPE = 'BASE TABLE' AND TABLE_NAME <> 'nq_meta'", (self.dsn.database,))]
        for table in tables:
            self.sql(f"TRUNCATE TABLE `{table}`")
        self.sql("INSERT IGNORE INTO nq_queue (queue) VALUES (%s)", (QUEUE,))

    def fill(self, n: int, table: str = "nq_job") -> None:
        """n ready jobs, inserted by the server itself, in chunks; table=seed_job fills the seed
        floor's table with the same payloads."""
        statement = _seed.FILL if table == _seed.TABLE else (
            "INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload) "
            "SELECT %s, 0, 0, NOW(6), 5, CONCAT('{\"user_id\":', seq, ',\"event\":\"signup\","
            "\"email\":\"user', seq, '@example.com\"}') FROM ")
        for start in range(0, n, FILL_CHUNK):
            self.sql(statement + numbers(min(n, start + FILL_CHUNK), start + 1), (QUEUE,))
        if table == "nq_job":
            # As a producer would: idle consumers learn of new work from the signal row only.
            self.sql("INSERT INTO nq_signal (queue, slot, seq) VALUES (%s, 0, %s) "
                     "ON DUPLICATE KEY UPDATE seq = seq + VALUES(seq)", (QUEUE, n))

    def ready_count(self) -> int:
        return int(self.scalar("SELECT COUNT(*) FROM nq_job FORCE INDEX (ix_state) "
                               "WHERE queue = %s AND status = 0", (QUEUE,)))

    def questions(self) -> int:
        return int(self.sql("SHOW GLOBAL STATUS LIKE 'Questions'")[0][1])

    def statements(self) -> dict[str, int]:
        return _statements.snapshot(self.admin())

    # ---------------------------------------------------------- children

    def compile(self) -> None:
        """The children's bytecode (__pycache__, ignored by git), written once before any timing."""
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "notifyq"), str(HERE)],
                       env=self.env, check=True, stdout=subprocess.DEVNULL)

    def outdir(self) -> Path:
        self._n += 1
        path = self.workdir / f"run{self._n:03d}"
        path.mkdir()
        return path

    def spawn(self, argv: list[str], out: Path | None = None, stdout=subprocess.DEVNULL,
              stdin=subprocess.DEVNULL, env: dict | None = None) -> subprocess.Popen:
        env = {**self.env, **(env or {})}
        if out is not None:
            env["NQB_OUT"] = str(out)
        log = open(self.workdir / "children.log", "ab")
        try:
            return subprocess.Popen(argv, env=env, cwd=str(HERE), stdin=stdin, stdout=stdout, stderr=log)
        finally:
            log.close()

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the children's stderr, for an error message: the temp dir is removed
        on exit unless --keep."""
        try:
            text = (self.workdir / "children.log").read_text(errors="replace")
        except OSError:
            return ""
        return f"; children.log ends:\n{text[-chars:]}"

    def child(self, side: str, role: str, args: dict, timeout: float = 600) -> dict:
        """Run one _floor.py / _seed.py / _nqchild.py role to completion; its JSON result plus its CPU."""
        args = {"conn": self.conn_args, "dsn": self.url, "queue": QUEUE, **args}
        script = {"floor": "_floor.py", "seed": "_seed.py"}.get(side, "_nqchild.py")
        proc = self.spawn([sys.executable, str(HERE / script), role, json.dumps(args)],
                          stdout=subprocess.PIPE)
        usage = wait_rusage(proc, timeout)
        out = proc.stdout.read().decode()
        proc.stdout.close()
        if proc.returncode != 0:
            raise RuntimeError(f"{side} {role} failed (exit {proc.returncode}){self.log_tail()}")
        return {**json.loads(out.strip().splitlines()[-1]), "proc_cpu_s": cpu_of(usage)}

    def consumer_argv(self, side: str, handler: str, *extra: str) -> list[str]:
        if side == "seed":
            args = {"conn": self.conn_args, "queue": QUEUE, "batch": self.size["batch"], "handler": handler}
            role = "drain" if "--exit-when-empty" in extra else "serve"
            return [sys.executable, str(HERE / "_seed.py"), role, json.dumps(args)]
        if side.startswith("floor"):
            args = {"conn": self.conn_args, "queue": QUEUE, "batch": self.size["batch"], "handler": handler,
                    "two_step": side == "floor_two_step"}
            return [sys.executable, str(HERE / "_floor.py"), "drain", json.dumps(args)]
        return [sys.executable, "-m", "notifyq", "consume", "-q", QUEUE, "--handler",
                f"_bench_handlers:{handler}", "--workers", "1", "--batch-size", str(self.size["batch"]),
                *extra]

    @staticmethod
    def records(out: Path) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]

    # ---------------------------------------------------------- enqueue

    def enqueue(self, role: str, n: int) -> dict:
        """notifyq without and with the ring (the README's mode for a long-lived producer), the
        seed floor, the same-schema floor, and that floor plus the nq_signal bump notifyq adds.
        For put() also the ring and the seed each with one idle consumer attached, so the
        wake-ups really happen (the statement counts then include the consumer's).
        The sides run in turn within each round, the order reversed every other round."""
        sides = {"notifyq": ("notifyq", role, {}), "notifyq_ring": ("notifyq", role, {"ring": True}),
                 "seed": ("seed", role, {}), "floor": ("floor", role, {}),
                 "floor_signal": ("floor", "put_signal", {}) if role == "put" else ("floor", role, {"signal": True})}
        if role == "put":
            sides["notifyq_ring_attached"] = ("notifyq", role, {"ring": True})
            sides["seed_attached"] = ("seed", role, {})
        rows = {side: [] for side in sides}
        orders = []
        for rnd in range(self.size["reps"]):
            orders.append(alternate(list(sides), rnd))
            for side in orders[-1]:
                script, name, extra = sides[side]
                self.reset()
                args = {"n": n, "chunk": self.size["chunk"], **extra}
                if side.endswith("_attached"):
                    with self.attached_consumer(script, n + 1):
                        srv0 = proc_cpu_s(self.server_pid)  # the attached consumer's work too
                        r = self.child(script, name, args)
                        srv1 = proc_cpu_s(self.server_pid)
                else:
                    srv0 = proc_cpu_s(self.server_pid)  # the child's start-up and warm-up too: a few ms
                    r = self.child(script, name, args)
                    srv1 = proc_cpu_s(self.server_pid)
                    table = _seed.TABLE if script == "seed" else "nq_job"
                    got = self.scalar(f"SELECT COUNT(*) FROM {table} WHERE queue = %s", (QUEUE,))
                    if got != n + 1:  # + the warm-up job
                        raise RuntimeError(f"{side} {role}: {got} rows, expected {n + 1}")
                counts = r.get("statements")
                rows[side].append({"jobs_s": n / r["wall_s"], "cpu_us_per_job": r["cpu_s"] / n * 1e6,
                                   "server_cpu_us_per_job": (srv1 - srv0) / n * 1e6 if srv0 is not None else None,
                                   "statements_per_job": counts["Questions"] / n if counts else None,
                                   "statements": _statements.per_job(counts, n) if counts else None})
        pairs = [("notifyq", "seed"), ("notifyq_ring", "seed"), ("notifyq", "floor"), ("notifyq_ring", "floor"),
                 ("notifyq", "floor_signal"), ("floor", "seed")]
        if role == "put":
            pairs.append(("notifyq_ring_attached", "seed_attached"))
        return compare(rows, orders, ("jobs_s", "cpu_us_per_job", "server_cpu_us_per_job", "statements_per_job"),
                       pairs)

    @contextlib.contextmanager
    def attached_consumer(self, side: str, expect: int, timeout_s: float = 120):
        """One consumer process of `side`, idle when the body starts; afterwards it must have
        run all `expect` jobs the body enqueued (and the sentinel that proved it was up)."""
        table = _seed.TABLE if side == "seed" else "nq_job"
        out = self.outdir()
        proc = self.spawn(self.consumer_argv(side, "noop"), out)
        try:
            self.fill(1, table)  # the sentinel: gone once the consumer is up and claiming
            self._wait_empty(table, proc, timeout_s)
            wait_idle([proc.pid])  # back to idle: watching the bell, or polling
            yield
            self._wait_empty(table, proc, timeout_s)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            wait_rusage(proc, 90)
        ran = sum(len(r["ids"]) for r in self.records(out))
        if ran != expect + 1:
            raise RuntimeError(f"attached {side} consumer ran {ran} jobs, expected {expect + 1}")

    def _wait_empty(self, table: str, proc: subprocess.Popen, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.scalar(f"SELECT COUNT(*) FROM {table}"):
            if proc.poll() is not None:
                raise RuntimeError(f"attached consumer exited with {proc.returncode}{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"attached consumer left jobs in {table} after {timeout_s:.0f} s")
            time.sleep(0.02)

    # ---------------------------------------------------------- drain

    def waiting_ids(self, table: str) -> set[int]:
        """The jobs a drain must run: those ready when it starts."""
        return {r[0] for r in self.sql(f"SELECT id FROM {table} WHERE queue = %s AND status = 0", (QUEUE,))}

    def unfinished(self, table: str, ids: list[int]) -> int:
        """How many of these jobs, all run, the drain left unfinished: still in the table."""
        return self.scalar(f"SELECT COUNT(*) FROM {table} WHERE id IN (%s)" % ",".join(map(str, ids)))

    def drain_once(self, side: str, n: int, k: int, extra: tuple[str, ...] = ("--exit-when-empty",),
                   verify_all: bool = True) -> dict:
        """K consumer processes drain the queue; every job must have run exactly once."""
        table = _seed.TABLE if side == "seed" else "nq_job"
        before = self.waiting_ids(table)
        out = self.outdir()
        stmts0 = self.statements()
        srv0 = proc_cpu_s(self.server_pid)
        t0 = time.time()
        procs, spawned = [], {}
        for _ in range(k):
            at = time.time()
            procs.append(self.spawn(self.consumer_argv(side, "noop", *extra), out))
            spawned[procs[-1].pid] = at
        usages = [wait_rusage(p, 600) for p in procs]
        t1 = time.time()
        srv1 = proc_cpu_s(self.server_pid)
        stmts = _statements.delta(stmts0, self.statements())
        bad = [p.returncode for p in procs if p.returncode != 0]
        if bad:
            raise RuntimeError(f"{side} consumers exited with {bad}{self.log_tail()}")
        recs = self.records(out)
        counts = collections.Counter(i for r in recs for i in r["ids"])
        ran = sum(counts.values())
        dupes = sum(1 for c in counts.values() if c > 1)
        stray = set(counts) - before
        if dupes or stray:
            raise RuntimeError(f"{side} drain: {dupes} jobs ran twice, {len(stray)} unknown ids")
        left = self.unfinished(table, list(counts)) if counts else 0
        if left:
            raise RuntimeError(f"{side} drain: {left} jobs ran but are not finished in the table")
        if verify_all and set(counts) != before:
            raise RuntimeError(f"{side} drain: {len(before - set(counts))} jobs never ran")
        if not verify_all and ran != n:
            raise RuntimeError(f"{side} drain: {ran} jobs ran, expected {n}")
        first = min(r["first"] for r in recs)
        last = max(r["last"] for r in recs)
        steady_cpu = sum(r["cpu_last"] - r["cpu_first"] for r in recs)
        # Each process's first handled job after its own spawn (K start together on the cores).
        firsts = [r["first"] - spawned[r["pid"]] for r in recs if r["pid"] in spawned]
        return {
            "jobs": ran, "exactly_once": True, "processes_that_ran_jobs": len(recs),
            "first_job_s": median(firsts), "first_job_fleet_s": first - t0,
            "statements_per_job": stmts["Questions"] / ran, "statements": _statements.per_job(stmts, ran),
            "jobs_s": ran / (last - first) if last > first else None,
            "jobs_s_with_startup": ran / (t1 - t0),
            "exit_after_last_s": t1 - last,  # the last handled job to the last process's exit
            "cpu_us_per_job": steady_cpu / ran * 1e6,
            "cpu_us_per_job_with_startup": sum(cpu_of(u) for u in usages) / ran * 1e6,
            "server_cpu_us_per_job": (srv1 - srv0) / ran * 1e6 if srv0 is not None else None,
        }

    def drain(self) -> dict:
        """notifyq, the seed floor (its own table and claim), and two floors on notifyq's table:
        one SKIP LOCKED read straight off the ready index, and the same two-step shape notifyq
        uses (plain candidate read, then lock by primary key)."""
        n, k = self.size["drain_n"], self.size["consumers"]
        sides = ("notifyq", "seed", "floor", "floor_two_step")
        rows = {side: [] for side in sides}
        orders = []
        for rnd in range(self.size["reps"]):
            orders.append(alternate(list(sides), rnd))
            for side in orders[-1]:
                self.reset()
                self.fill(n, _seed.TABLE if side == "seed" else "nq_job")
                rows[side].append(self.drain_once(side, n, k))
        metrics = ("jobs_s", "jobs_s_with_startup", "cpu_us_per_job", "cpu_us_per_job_with_startup",
                   "server_cpu_us_per_job", "statements_per_job", "first_job_s", "first_job_fleet_s")
        return compare(rows, orders, metrics, (("notifyq", "seed"), ("notifyq", "floor"),
                                               ("notifyq", "floor_two_step"), ("floor", "seed")))

    # ---------------------------------------------------------- first job after start

    def start(self) -> dict:
        """One consumer process (one worker) started with a batch of jobs waiting: from its
        spawn to its first handled job, from its last to its exit, and its whole CPU; notifyq
        and the seed in turn."""
        sides = ("notifyq", "seed")
        rows = {side: [] for side in sides}
        orders = []
        for rnd in range(self.size["start_reps"]):
            orders.append(alternate(list(sides), rnd))
            for side in orders[-1]:
                self.reset()
                self.fill(self.size["batch"], _seed.TABLE if side == "seed" else "nq_job")
                r = self.drain_once(side, self.size["batch"], 1)
                rows[side].append({"first_job_s": r["first_job_s"], "exit_after_last_s": r["exit_after_last_s"],
                                   "process_cpu_ms": r["cpu_us_per_job_with_startup"] * r["jobs"] / 1e3})
        result = compare(rows, orders, ("first_job_s", "exit_after_last_s", "process_cpu_ms"),
                         (("notifyq", "seed"),))
        result["instructions"] = self.instructions(sides)
        return result

    def instructions(self, sides: tuple[str, ...]) -> dict | None:
        """The same process once more per side under callgrind: the instructions it executes,
        from spawn to exit. A count does not drift with the machine's load as CPU time does
        (±30 % here), so a start-up change of a few per cent shows. None without valgrind."""
        if shutil.which("valgrind") is None:
            return None
        counts = {}
        for side in sides:
            self.reset()
            self.fill(self.size["batch"], _seed.TABLE if side == "seed" else "nq_job")
            argv = self.consumer_argv(side, "noop", "--exit-when-empty")
            counts[side] = callgrind_instructions(argv, {**self.env, "NQB_OUT": str(self.outdir())}, HERE)
            left = self.scalar(f"SELECT COUNT(*) FROM {_seed.TABLE}") if side == "seed" else self.ready_count()
            if left:
                raise RuntimeError(f"{side}: the process under callgrind left {left} jobs behind")
        interpreter = callgrind_instructions([sys.executable, "-c", "pass"], self.env, HERE)
        return {"process": counts, "interpreter": interpreter}

    # ---------------------------------------------------------- idle cost

    def idle(self) -> dict:
        """Questions/s of an idle fleet. A window spans one idle_wait_s: every queued consumer
        re-arms its GET_LOCK once per idle_wait_s, all in step (they started together), so a
        shorter window over- or under-counts those bursts depending on where it falls."""
        n = self.size["idle_consumers"]
        window = self.size["idle_window_s"] or WakeupConfig().idle_wait_s
        self.reset()
        procs = [self.spawn(self.consumer_argv("notifyq", "noop")) for _ in range(n)]
        try:
            deadline = time.monotonic() + 60
            while self.scalar("SELECT COUNT(*) FROM nq_consumer") < n:
                if time.monotonic() > deadline:
                    raise RuntimeError("idle consumers did not register within 60 s")
                time.sleep(0.1)
            time.sleep(self.size["idle_settle_s"])
            rates = []
            for _ in range(self.size["idle_reps"]):
                q0, t0 = self.questions(), time.monotonic()
                time.sleep(window)
                q1, t1 = self.questions(), time.monotonic()
                rates.append((q1 - q0 - 1) / (t1 - t0))  # -1: our own SHOW STATUS
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                wait_rusage(proc, 90)
        return {"consumers": n, "queues": 1, "window_s": window,
                "questions_s": summary(rates)}

    # ---------------------------------------------------------- pick-up from idle (a colleague's)

    def wakeup(self, quick: bool) -> dict:
        script = HERE / "wakeup.py"
        if not script.exists():
            return {"status": "not run: benchmarks/wakeup.py (pick-up latency from idle) is missing"}
        out = self.workdir / "wakeup.json"
        # Its own database on the same server; idle cost is measured above, so latency runs only.
        argv = [sys.executable, str(script), "--dsn", self.root_url, "--json", str(out), "--skip-idle",
                *(["--quick"] if quick else self.size["wakeup_args"])]
        env = {k: v for k, v in self.env.items() if not k.startswith(("NOTIFYQ_", "NQB_"))}
        proc = subprocess.run(argv, env=env, cwd=str(REPO), capture_output=True, text=True, timeout=900)
        shown = shlex.join(["python", "benchmarks/wakeup.py", *argv[2:]])
        result = {"command": shown, "exit": proc.returncode, "stdout": proc.stdout[-6000:],
                  "stderr": proc.stderr[-2000:]}
        if out.exists():
            result["result"] = json.loads(out.read_text())
        return result

    # ---------------------------------------------------------- settings

    def meta(self, argv: list[str], server: str) -> dict:
        keys = ("version", "innodb_flush_log_at_trx_commit", "innodb_buffer_pool_size", "innodb_log_file_size",
                "sync_binlog", "log_bin", "innodb_doublewrite", "max_connections")
        row = self.sql("SELECT " + ", ".join(f"@@{k}" for k in keys))[0]
        settings = dict(zip(keys, (v.decode() if isinstance(v, bytes) else v for v in row)))
        cpu_model = next((line.split(":", 1)[1].strip() for line in
                          Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "")
        try:
            rev = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                                 capture_output=True, text=True).stdout.strip()
        except OSError:
            rev = ""
        return {"command": shlex.join([sys.executable, *argv]), "server": server, "settings": settings,
                "cpu_count": os.cpu_count(), "cpu_affinity": len(os.sched_getaffinity(0)),
                "cpu_model": cpu_model, "python": platform.python_version(),
                "mysqlclient": ".".join(map(str, MySQLdb.version_info[:3])), "notifyq_rev": rev,
                "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


# ------------------------------------------------------------------ main

CASES = ("enqueue", "drain", "start", "pickup", "sessions", "e2e", "backlog", "idle", "wakeup")


@contextlib.contextmanager
def bench_server(dsn: str | None, keep: bool, prefix: str):
    """A temp dir and the server to measure on: a private LocalServer in that dir, or the one
    --dsn names. Yields (temp dir, URL, the server's pid or None, where it is, for the report);
    afterwards the private server is stopped and the dir removed (kept with --keep)."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    server = None
    try:
        if dsn:
            yield workdir, dsn, None, f"given --dsn {DSN.parse(dsn).masked()}"
        else:
            server = LocalServer(workdir / "server", redo_log_mb=BENCH_REDO_LOG_MB)
            server.start()
            yield workdir, server.dsn, server._proc.pid, f"private LocalServer in {workdir / 'server'}"
    finally:
        if server is not None:
            server.cleanup()
        if keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def callgrind_instructions(argv: list[str], env: dict, cwd: Path) -> int:
    """Instructions a process executes from start to exit (valgrind's callgrind, all threads)."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
                          env=env, cwd=str(cwd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"under callgrind, {argv[:3]} exited with {done.returncode}: {done.stderr[-2000:]}")
    for line in done.stderr.splitlines():
        if "Collected :" in line:
            return int(line.rsplit(":", 1)[1])
    raise RuntimeError(f"callgrind printed no count: {done.stderr[-2000:]}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="small sizes: a smoke run of every case (about a minute), not a measurement")
    ap.add_argument("--rounds", type=int, help="rounds of the alternating cases (enqueue, drain, start)")
    ap.add_argument("--json", dest="json_path", help="write all results (raw repetitions too) here")
    ap.add_argument("--dsn", help="use this server (root-like user) instead of a private LocalServer")
    ap.add_argument("--database", default="nq_bench", help="database to (re)create and drop")
    ap.add_argument("--only", default=",".join(CASES),
                    help=f"comma-separated subset of {','.join(CASES)} (enqueue_single, enqueue_bulk: "
                         "put() or put_many() alone)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (children.log, raw records)")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    size = dict(SIZES["quick" if args.quick else "full"])
    if args.rounds:
        size.update(reps=args.rounds, start_reps=max(args.rounds, size["start_reps"]))
    started = time.monotonic()
    with bench_server(args.dsn, args.keep, "nqbench-") as (workdir, url, server_pid, where):
        bench = Bench(url, args.database, size, workdir, server_pid)
        bench.create()
        bench.compile()
        res: dict = {"meta": bench.meta(argv=[sys.argv[0], *argv], server=where), "sizes": size}
        print(f"# {res['meta']['settings']['version']}  flush_log_at_trx_commit="
              f"{res['meta']['settings']['innodb_flush_log_at_trx_commit']}  buffer_pool="
              f"{int(res['meta']['settings']['innodb_buffer_pool_size']) >> 20}M  redo_log="
              f"{int(res['meta']['settings']['innodb_log_file_size']) >> 20}M  cpus={os.cpu_count()}  "
              f"({where})", flush=True)

        def step(name, fn):
            t = time.monotonic()
            print(f"# {name} ...", end=" ", flush=True)
            res[name] = fn()
            print(f"{time.monotonic() - t:.0f}s", flush=True)

        if only & {"enqueue", "enqueue_single"}:
            step("enqueue_single", lambda: bench.enqueue("put", size["put_n"]))
        if only & {"enqueue", "enqueue_bulk"}:
            step("enqueue_bulk", lambda: bench.enqueue("put_many", size["bulk_n"]))
        if "drain" in only or "e2e" in only:
            step("drain", bench.drain)
        if "start" in only:
            step("start", bench.start)
        if "pickup" in only:
            step("pickup", lambda: _pickup.run(bench, size["pickup_rounds"], size["pickup_gap_s"],
                                               size["pickup_consumers"], size["pickup_settle_s"]))
        if "sessions" in only:
            step("sessions", lambda: _sessions.run(bench, size["sessions_settle_s"]))
        if "e2e" in only:
            step("e2e", lambda: _e2e.e2e(bench, res["drain"]["sides"]["notifyq"]["jobs_s"]["median"]))
        if "backlog" in only:
            step("backlog", lambda: _backlog.backlog(bench))
        if "idle" in only:
            step("idle", bench.idle)
        if "wakeup" in only and (not args.quick or args.only == "wakeup"):
            step("wakeup", lambda: bench.wakeup(args.quick))
        elif "wakeup" in only:
            res["wakeup"] = {"status": "skipped in --quick: bench.py --quick --only wakeup"}
        res["meta"]["elapsed_s"] = round(time.monotonic() - started, 1)
        table, targets = report(res)
        res["targets"] = targets
        print()
        print(table)
        print()
        for t in targets:
            print(f"target {t['met']:>3}: {t['target']} (value {fmt(t['value'])})")
        print(f"\ncommand: {res['meta']['command']}\nelapsed: {res['meta']['elapsed_s']}s")
        if args.json_path:
            Path(args.json_path).write_text(json.dumps(res, indent=2, default=str))
        bench.drop()
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
