"""The raw-SQL floor of an exact per-key limited claim, against the unlimited claim's floor.

Can any exact claim of `limit_per_key = 2` reach 0.8x the same jobs without a limit on this
machine? Measured with the fewest statements of each design in plain mysqlclient (the claimer is
_keyed_floor.py, no notifyq code), so the answer does not depend on notifyq's claim.

Setup as flow.py's keyed case: a private MariaDB (LocalServer, 96 MB redo log), the schema
`notifyq init` makes, 100 keys x 100 jobs put key by key, then run_at scrambled
(`run_at = NOW(6) - INTERVAL (id MOD 100) SECOND`: claim order interleaves the keys), 2 claimer
processes, batch 100, a no-op handler, each claim carrying the last batch's ack, READ COMMITTED.
The keys' nq_flow_key rows are made before the drain (notifyq names them by discovery: not part
of this floor), with a `running` counter column added in this benchmark's database only.

Sides, by turns in each round (see _keyed_floor.py): U, L_count, L_counter, L_trigger on the
keyed jobs; a limited side with `+aff` takes the keys of the jobs its claim acks first in its
grant (then keys with every slot free, then the rest), `L_count+aff+v` adds notifyq's count
after the mark, and a side with `+w` runs on an ix_state with the job's key in it (after its id:
claim order unchanged; L_counter's head read then index-only), U+w its unlimited floor; then U
on 10,000 unkeyed jobs without and with L_trigger's triggers installed (Uu, Uu_trig: what the
triggers cost jobs without a key), and Uu+w (what the wider index costs them). Rates are jobs over the span from the
first claim to the COMMIT that carried the last ack; CPU per job is the server process's (from
/proc) over the drain and the claimers' own.

Exactness: --check drains (untimed, before the rounds) run each limited side with a sampler
(a grouped count of the queue's status-2 rows per key, and for the counter sides each key's
counter against that count, one statement each: a committed state) and a reaper that takes
running jobs back now and then (so acks fail their fence), and fail if a key ever had more than
2 running jobs or a counter was ever off. Every timed drain of a counter side ends with every
counter at 0.

    .venv/bin/python benchmarks/keyed_floor.py --rounds 12 --statements 300
    .venv/bin/python benchmarks/keyed_floor.py --rounds 0 --check 3 --sides L_counter+aff

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import MySQLdb

from _db import server_pid, sql_once
from _procs import proc_cpu_s

HERE = Path(__file__).resolve().parent
TREE = HERE.parent
QUEUE = "q"
KEYS, PER_KEY, BATCH, CLAIMERS = 100, 100, 100, 2
DB = "keyed_floor"

TRIGGERS = [
    """CREATE TRIGGER nq_job_running_u AFTER UPDATE ON nq_job FOR EACH ROW
       BEGIN
         IF NEW.job_key IS NOT NULL AND (OLD.status = 2) <> (NEW.status = 2) THEN
           UPDATE nq_flow_key SET running = running + IF(NEW.status = 2, 1, -1)
           WHERE queue = NEW.queue AND job_key = NEW.job_key;
         END IF;
       END""",
    """CREATE TRIGGER nq_job_running_d AFTER DELETE ON nq_job FOR EACH ROW
       BEGIN
         IF OLD.status = 2 AND OLD.job_key IS NOT NULL THEN
           UPDATE nq_flow_key SET running = running - 1 WHERE queue = OLD.queue AND job_key = OLD.job_key;
         END IF;
       END""",
]


class Bench:
    def __init__(self, server: dict):
        self.server = server
        self.conn_args = {**server, "database": DB}
        self.mysqld_pid: int | None = None

    def sql(self, statement: str, params=None, db: bool = True) -> list[tuple]:
        return sql_once(self.conn_args if db else self.server, statement, params)

    def server_cpu(self) -> float:
        if self.mysqld_pid is None:
            self.mysqld_pid = server_pid(self.server)
        return proc_cpu_s(self.mysqld_pid) or 0.0

    def init(self) -> None:
        self.sql(f"DROP DATABASE IF EXISTS `{DB}`", db=False)
        self.sql(f"CREATE DATABASE `{DB}`", db=False)
        url = f"mysql://{self.server['user']}@{self.server['host']}:{self.server['port']}/{DB}"
        subprocess.run([sys.executable, "-m", "notifyq", "init"], check=True, cwd=TREE, stdout=subprocess.DEVNULL,
                       env={**os.environ, "PYTHONPATH": str(TREE), "NOTIFYQ_DSN": url, "NOTIFYQ_CONFIG": os.devnull})
        self.sql("ALTER TABLE nq_flow_key ADD COLUMN running INT NOT NULL DEFAULT 0")
        self.sql("INSERT INTO nq_flow_key (queue, job_key) SELECT %s, CONCAT('k', LPAD(seq - 1, 3, '0')) "
                 f"FROM seq_1_to_{KEYS}", (QUEUE,))

    def drop(self) -> None:
        self.sql(f"DROP DATABASE IF EXISTS `{DB}`", db=False)

    def triggers(self, on: bool) -> None:
        for name in ("nq_job_running_u", "nq_job_running_d"):
            self.sql(f"DROP TRIGGER IF EXISTS {name}")
        if on:
            for t in TRIGGERS:
                self.sql(t)

    def state_index(self, wide: bool) -> None:
        """`+w` sides: ix_state with the job's key after its id (a head read with the keys,
        index-only); the others: notifyq's. Changed on the empty table, before a fill."""
        cols = "status, queue, prio_key, sort_at" + (", id, job_key" if wide else "")
        now = self.sql("SELECT GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX SEPARATOR ', ') FROM "
                       "information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 'nq_job' "
                       "AND INDEX_NAME = 'ix_state'", (DB,))[0][0]
        if now != cols:
            self.sql("DELETE FROM nq_job")
            self.sql(f"ALTER TABLE nq_job DROP INDEX ix_state, ADD INDEX ix_state ({cols})")

    def fill(self, keyed: bool) -> None:
        self.sql("DELETE FROM nq_job")
        self.sql("UPDATE nq_flow_key SET running = 0")
        for i in range(KEYS):
            self.sql("INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload, job_key) "
                     f"SELECT %s, 0, 0, NOW(6), 5, CONCAT('{{\"n\":', seq, '}}'), %s FROM seq_1_to_{PER_KEY}",
                     (QUEUE, f"k{i:03d}" if keyed else None))
        self.sql("UPDATE nq_job SET run_at = NOW(6) - INTERVAL (id MOD %s) SECOND", (PER_KEY,))

    def drain(self, side: str, check: bool = False) -> dict:
        args = {"conn": self.conn_args, "queue": QUEUE, "batch": BATCH, "side": side.split("+")[0],
                "affinity": "+aff" in side, "verify": "+v" in side, "wide": "+w" in side}
        procs = [subprocess.Popen([sys.executable, str(HERE / "_keyed_floor.py"), json.dumps(args)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for _ in range(CLAIMERS)]
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        watch = Watch(self, side) if check else None
        load = Path("/proc/loadavg").read_text().split()[0]
        cpu0 = self.server_cpu()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [json.loads(p.stdout.readline()) for p in procs]
        for p in procs:
            p.wait(60)
        cpu1 = self.server_cpu()
        if watch:
            watch.stop()
        n = sum(o["n"] for o in outs)
        span = max(o["end"] for o in outs) - min(o["start"] for o in outs)
        left = self.sql("SELECT COUNT(*) FROM nq_job")[0][0]
        counters = self.sql("SELECT COALESCE(SUM(ABS(running)), 0) FROM nq_flow_key")[0][0]
        if left:
            raise RuntimeError(f"{side}: {left} jobs left after the drain")
        if side.split("+")[0] in ("L_counter", "L_trigger") and counters:
            raise RuntimeError(f"{side}: counters drifted: sum |running| = {counters} after the drain")
        keys = ("claims", "empty", "sends", "statements", "deadlock", "lock_wait_timeout", "fenced_acks",
                "held_under_lock", "key_skipped", "dives", "counter_rows")
        out = {"side": side, "jobs": n, "span_s": span, "jobs_s": n / span, "load": float(load),
               "server_us_per_job": 1e6 * (cpu1 - cpu0) / n,
               "clients_us_per_job": 1e6 * sum(o["cpu_s"] for o in outs) / n,
               **{k: sum(o.get(k, 0) for o in outs) for k in keys}}
        if watch:
            out["check"] = watch.result()
        return out


class Watch:
    """A check drain's sampler and reaper (threads, own connections)."""

    def __init__(self, bench: Bench, side: str):
        self.bench, self.side = bench, side
        self.stop_flag = threading.Event()
        self.samples = self.over = self.counter_off = self.max_running = 0
        self.taken_back = 0
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self.sample), threading.Thread(target=self.reap)]
        for t in self.threads:
            t.start()

    def connect(self):
        return MySQLdb.connect(**self.bench.conn_args, autocommit=True,
                               init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")

    def sample(self) -> None:
        conn = self.connect()
        cur = conn.cursor()
        counters = self.side.split("+")[0] in ("L_counter", "L_trigger")
        while not self.stop_flag.is_set():
            # one statement, one read view: the running jobs per key, and each key's counter
            cur.execute("SELECT k.job_key, k.running, COALESCE(r.n, 0) FROM nq_flow_key k LEFT JOIN "
                        "(SELECT job_key, COUNT(*) AS n FROM nq_job FORCE INDEX (ix_state) WHERE status = 2 "
                        "AND queue = %s GROUP BY job_key) r ON r.job_key = k.job_key WHERE k.queue = %s",
                        (QUEUE, QUEUE))
            rows = cur.fetchall()
            self.samples += 1
            for key, counter, running in rows:
                self.max_running = max(self.max_running, running)
                if running > 2:
                    self.over += 1
                    self.errors.append(f"{key} had {running} running")
                if counters and counter != running:
                    self.counter_off += 1
                    self.errors.append(f"{key}: counter {counter}, running {running}")
        conn.close()

    def reap(self) -> None:
        """Takes a running job back every ~5 ms (as a reaper would a dead consumer's): its
        consumer's ack then fails its fence. Keeps the counter in the same transaction."""
        conn = MySQLdb.connect(**self.bench.conn_args, autocommit=False,
                               init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        cur = conn.cursor()
        while not self.stop_flag.wait(0.005):
            try:
                cur.execute("SELECT id, job_key FROM nq_job FORCE INDEX (ix_state) WHERE status = 2 AND queue = %s "
                            "LIMIT 1 OFFSET %s", (QUEUE, random.randrange(100)))
                row = cur.fetchone()
                if row is None:
                    conn.commit()
                    continue
                job_id, key = row
                if self.side.startswith("L_counter"):
                    cur.execute("SELECT running FROM nq_flow_key WHERE queue = %s AND job_key = %s FOR UPDATE",
                                (QUEUE, key))
                cur.execute("UPDATE nq_job FORCE INDEX (PRIMARY) SET status = 0, owner = NULL, claim_token = NULL, "
                            "lease_until = NULL WHERE id = %s AND status = 2", (job_id,))
                if cur.rowcount and self.side.startswith("L_counter"):
                    cur.execute("UPDATE nq_flow_key SET running = running - 1 WHERE queue = %s AND job_key = %s",
                                (QUEUE, key))
                conn.commit()
                self.taken_back += cur.rowcount
            except MySQLdb.OperationalError as e:
                conn.rollback()
                if e.args[0] not in (1213, 1205):
                    raise
        conn.close()

    def stop(self) -> None:
        self.stop_flag.set()
        for t in self.threads:
            t.join()

    def result(self) -> dict:
        return {"samples": self.samples, "max_running": self.max_running, "over_limit": self.over,
                "counter_off": self.counter_off, "taken_back": self.taken_back, "errors": self.errors[:5]}


KEYED = ("U", "L_count", "L_counter", "L_trigger")
# +aff: the same claim, its grant taking the keys whose jobs it acks first (_keyed_floor.py)
# +w: ix_state with the key in it (state_index), L_counter's head read index-only
# +v: L_count with notifyq's count after the mark
AFFINITY = ("L_count+aff", "L_counter+aff", "L_trigger+aff", "L_count+aff+v")
UNKEYED = ("Uu", "Uu_trig")


def run_side(bench: Bench, side: str, check: bool = False) -> dict:
    base = side.split("+")[0]
    keyed = base in KEYED
    bench.triggers(base in ("L_trigger", "Uu_trig"))
    bench.state_index("+w" in side)
    bench.fill(keyed)
    r = bench.drain(side.replace("Uu_trig", "U").replace("Uu", "U"), check)
    r["side"] = side
    bench.triggers(False)
    return r


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", help="a server to use (root, no password); default: a private MariaDB")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--check", type=int, default=1, help="check drains per limited side before the rounds")
    ap.add_argument("--statements", type=int, default=0, metavar="N",
                    help="first time each claim statement alone, N times (idle server)")
    ap.add_argument("--sides", default="U,L_count,L_count+aff,L_count+aff+v,L_counter,L_counter+aff,L_trigger+aff,Uu,Uu_trig")
    args = ap.parse_args(argv)
    sides = args.sides.split(",")
    if args.dsn:
        return run(args, sides, args.dsn)
    sys.path.insert(0, str(TREE))
    from notifyq.run.localserver import LocalServer

    with tempfile.TemporaryDirectory(prefix="nq-keyed-floor-") as tmp, \
            LocalServer(Path(tmp), redo_log_mb=96) as server:
        return run(args, sides, server.dsn)


def statements(bench: Bench, reps: int) -> dict:
    """Each claim statement alone (--statements): 100 keys x 100 jobs, 2 of each key running,
    one client, `reps` times each, locking ones rolled back; wall time (round trip included)
    and the server's CPU per statement."""
    import _keyed_floor as kf
    bench.fill(True)
    bench.sql("UPDATE nq_job j JOIN (SELECT MIN(id) a, MIN(id) + 1 b FROM nq_job GROUP BY job_key) f "
              "ON j.id IN (f.a, f.b) SET j.status = 2, j.claim_token = 1, j.owner = 'x', j.claimed_at = NOW(6), "
              "j.lease_until = NOW(6) + INTERVAL 300 SECOND")
    bench.sql("UPDATE nq_flow_key SET running = 2")
    conn = MySQLdb.connect(**bench.conn_args, autocommit=False,
                           init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    cur = conn.cursor()
    cur.execute(kf.CANDIDATES, (QUEUE, 300))
    ids = [r[0] for r in cur.fetchall()][:100]
    cur.execute("SELECT job_key FROM nq_job WHERE id IN (" + kf.marks(len(ids)) + ")", ids)
    keys = sorted({r[0] for r in cur.fetchall()})[:50]
    conn.rollback()
    firsts = " UNION ALL ".join(f"({kf.FIRSTS_PART.format(off=o, keys=kf.marks(len(keys)))})" for o in range(2))
    cases = {
        "no-op (SELECT 1)": ("SELECT 1", ()),
        "U: candidates (ix_state, 300 ids)": (kf.CANDIDATES, (QUEUE, 300)),
        "lock 100 jobs by id": (kf.LOCK.format(kf.marks(len(ids))), ids),
        "mark 100 jobs": (kf.MARK.format(kf.marks(len(ids))), ("o" * 32, 5, *ids)),
        "L_count: running per key (grouped, status 2)": (kf.RUNNING, (QUEUE,)),
        "L_count: first 2 jobs of 50 keys (dives)": (firsts, (QUEUE, QUEUE, *keys) * 2),
        "L_count: lock 50 key rows": (kf.KEY_LOCK.format(kf.marks(len(keys))), (QUEUE, *keys)),
        "L_counter: counters, plain (100 rows)": (kf.COUNTERS, (QUEUE,)),
        "L_counter: head, 300 with keys": (kf.HEAD, (QUEUE, 300)),
        "L_counter: lock 50 key rows + counters": (kf.KEY_LOCK_COUNTER.format(kf.marks(len(keys))), (QUEUE, *keys)),
        "L_counter: net counter update, 2 keys": (
            kf.COUNTER_ADD.format("WHEN %s THEN %s WHEN %s THEN %s", "%s,%s"),
            (keys[0], 1, keys[1], -1, QUEUE, keys[0], keys[1])),
    }
    out = {}
    for name, (sql, params) in cases.items():
        for _ in range(20):
            cur.execute(sql, params)
            cur.fetchall()
            conn.rollback()
        walls = []
        c0 = bench.server_cpu()
        for _ in range(reps):
            t0 = time.perf_counter()
            cur.execute(sql, params)
            cur.fetchall()
            walls.append(time.perf_counter() - t0)
            conn.rollback()
        c1 = bench.server_cpu()
        out[name] = {"wall_us": 1e6 * statistics.median(walls), "server_cpu_us": 1e6 * (c1 - c0) / reps}
        print(f"  {name:<48} {out[name]['wall_us']:7.0f} us wall (median), server CPU {out[name]['server_cpu_us']:6.0f} "
              "us (each with its ROLLBACK)", flush=True)
    conn.close()
    return out


def run(args, sides: list[str], dsn: str) -> int:
    hostport = dsn.split("@", 1)[1].split("/", 1)[0]
    host, _, port = hostport.partition(":")
    bench = Bench({"host": host, "port": int(port or 3306), "user": dsn.split("://", 1)[1].split("@", 1)[0]})
    bench.init()
    res: dict = {"checks": [], "runs": []}
    try:
        if args.statements:
            sys.path.insert(0, str(HERE))
            res["statements"] = statements(bench, args.statements)
        for _ in range(args.check):
            for side in sides:
                if side.startswith("L_"):
                    c = run_side(bench, side, check=True)
                    res["checks"].append(c)
                    ch = c["check"]
                    print(f"check {side:<10} samples {ch['samples']}, max running a key {ch['max_running']}, "
                          f"over the limit {ch['over_limit']}, counters off {ch['counter_off']}, jobs taken back "
                          f"{ch['taken_back']}, fenced acks {c['fenced_acks']}, deadlocks {c['deadlock']}", flush=True)
                    if ch["over_limit"] or ch["counter_off"]:
                        raise RuntimeError(f"{side} not exact: {ch['errors']}")
        for rnd in range(args.rounds):
            for side in sides:
                r = run_side(bench, side)
                r["round"] = rnd
                res["runs"].append(r)
                print(f"round {rnd} {side:<10} {r['jobs_s']:>8.0f} jobs/s  server {r['server_us_per_job']:5.1f} "
                      f"clients {r['clients_us_per_job']:5.1f} us/job  claims {r['claims']} (empty {r['empty']}) "
                      f"sends {r['sends']} deadlocks {r['deadlock']} load {r['load']}", flush=True)
    finally:
        bench.drop()
    report(res, sides)
    print(json.dumps(res))
    return 0


def report(res: dict, sides: list[str]) -> None:
    med = statistics.median
    by = {s: [r for r in res["runs"] if r["side"] == s] for s in sides}
    rounds = sorted({r["round"] for r in res["runs"]})
    ratio = {}
    for s in sides:
        base = "Uu" if s.split("+")[0] in UNKEYED else "U"
        if "+w" in s and base + "+w" in by and s != base + "+w":
            base += "+w"
        if base in by and s != base:
            per = []
            for rnd in rounds:
                a = [r for r in by[s] if r["round"] == rnd]
                b = [r for r in by[base] if r["round"] == rnd]
                if a and b:
                    per.append(a[0]["jobs_s"] / b[0]["jobs_s"])
            ratio[s] = per
    res["summary"] = {}
    print(f"\n{'side':<10} {'jobs/s':>8} {'ratio':>6} {'server':>7} {'clients':>8} {'sends':>6} {'stmts':>6} "
          f"{'claims':>7}  ratio per round")
    for s in sides:
        rs = by[s]
        if not rs:
            continue
        row = {"jobs_s": med(r["jobs_s"] for r in rs), "ratio": med(ratio[s]) if s in ratio else None,
               "ratios": ratio.get(s), "server_us": med(r["server_us_per_job"] for r in rs),
               "clients_us": med(r["clients_us_per_job"] for r in rs),
               "sends_per_claim": med(r["sends"] / max(1, r["claims"]) for r in rs),
               "statements_per_claim": med(r["statements"] / max(1, r["claims"]) for r in rs),
               "claims": med(r["claims"] for r in rs), "load": [r["load"] for r in rs]}
        res["summary"][s] = row
        print(f"{s:<10} {row['jobs_s']:>8.0f} {row['ratio'] if row['ratio'] is not None else 1:>6.3f} "
              f"{row['server_us']:>7.1f} {row['clients_us']:>8.1f} {row['sends_per_claim']:>6.2f} "
              f"{row['statements_per_claim']:>6.2f} {row['claims']:>7.0f}  "
              + ", ".join(f"{x:.3f}" for x in (ratio.get(s) or [])))
    loads = [r["load"] for r in res["runs"]]
    if loads:
        print(f"load {min(loads)}-{max(loads)}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
