#!/usr/bin/env python3
"""What each part of nq_job's row costs an enqueue: put()'s and put_many()'s statements, bare,
on the seed's table, on nq_job as `notifyq init` makes it, and on variants of nq_job with one
part taken away at a time (a secondary index, the generated columns, the columns a put never
writes). No notifyq code runs in the timed loops: only the statements it sends.

    .venv/bin/python benchmarks/put_row.py [--rounds 7] [--put-n 2000] [--bulk-n 20000] [--slices 10]
        [--only one,bulk] [--sides "nq_job,-ix_key,..."] [--dsn URL]

Per job (one/call), as put() sends them (inserts._insert_one): the insert_job INSERT and the
signal bump (bump_signal, a random slot of 16) as one multi-statement query, then COMMIT. Per
100 (x100), as put_many() sends them (inserts._insert_uniform): one 100-row insert_job_ready
INSERT with RETURNING id (on MySQL: the increment's read) and the bump by 100 as one query,
then COMMIT. Both from queries.sql,
the table's name changed, plus the columns a variant makes plain (their values written as the
server would compute them). The COMMIT's wake-up look (when a consumer may be watching) is left
out: it is the wake-up's, not the row's. The client's work is the same on every side (the
payload's json.dumps and escape, the statement's bytes joined).

Sides (each its own table in one database; --sides picks some, seed always runs):

  seed             the seed's table and its own statements (INSERT + COMMIT; 100-row INSERT +
                   COMMIT): the reference of bench.py's ratios (benchmarks/_seed.py)
  seed+bump        the seed's table, its INSERT and the signal bump in one query (x100: no RETURNING)
  seed+stmts       the seed's table with notifyq's statement shape: the bump (x100: and RETURNING id;
                   one/call: the same statements as seed+bump)
  nq_job           nq_job exactly as `notifyq init` makes it
  nq_job-bump      a copy of it, put's INSERT (x100: with RETURNING id) with no bump
  nq_job upd-bump  a copy of it, the bump as a plain UPDATE of its slot's row (not notifyq's: the
                   alternative, with the 16 slot rows made beforehand)
  -ix_key          without ix_key (then ix_state is the only secondary index: the claim's)
  -ix_key upd-bump that, with the UPDATE bump
  -ix_key-vcols    without ix_key and its two virtual columns (ready_key, key_prio)
  -ix_state        without ix_state (ix_key kept)
  -both            without both secondary indexes (the primary key only)
  -both upd-bump   that, with the UPDATE bump
  plain stored     prio_key and sort_at plain columns the INSERT writes (both indexes kept)
  plain virtual    ready_key and key_prio plain columns the INSERT writes (both indexes kept)
  plain all        the four generated columns plain (both indexes kept)
  -both-gen        without both indexes and the four generated columns: the rest of the row
  put cols         id and the nine columns a put writes, the primary key only
  put cols-bump    that, with no bump
  put cols+seed ix the put's columns and the seed's index (queue, status, id)
  put cols+plain ix the put's columns and an index like ix_state's on plain columns (status,
                   queue, priority, run_at)
  nq_job lit times nq_job, the row's times (run_at, created_at) one literal instead of the
                   server's clock (not notifyq's: the server's clock is its rule): their price
  put cols lit times  the put's columns, primary key only, the same literal times
  put cols+claim   the put's columns, lease_until, finished_at, prio_key, sort_at (generated)
                   and ix_state: the least row the claim's index can be kept on

In each round every side's table is emptied and warmed (untimed), then the sides take turns
in slices (--slices, 10: 200 puts or 2,000 jobs a turn by default), the order reversed every
other slice and every other round, so that the shared machine's load falls alike on each.
Per side: median jobs/s over the rounds, its ratio to `seed` in the same round (median
[min-max]) and, on the private server, the server's CPU per job (the run time of mariadbd's
threads, /proc/PID/task/*/schedstat, summed over the side's slices, median). A private MariaDB
(notifyq.run.localserver.LocalServer, 96 MB redo log, as bench.py) unless --dsn names a
root-like account; the database nq_put_row is made and dropped. Prints a table and, last, one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import MySQLdb  # noqa: E402
from MySQLdb.constants import CLIENT  # noqa: E402

import _seed  # noqa: E402

from notifyq.config.dsn import DSN  # noqa: E402
from notifyq.run.localserver import LocalServer  # noqa: E402
from notifyq.store import schema  # noqa: E402
from notifyq.store.signal import SIGNAL_SLOTS  # noqa: E402
from notifyq.store.sql import QUERIES as Q  # noqa: E402

DATABASE = "nq_put_row"
QUEUE = "bench"
CHUNK = 100
REDO_LOG_MB = 96  # bench.py's (BENCH_REDO_LOG_MB)
# The columns a put writes (insert_job); the generated ones, with the value the server gives a
# ready job without a key, priority 0 (written by the INSERT where a side makes them plain).
PUT_COLUMNS = ("id", "queue", "status", "priority", "run_at", "max_attempts", "payload", "dedup_key",
               "job_key", "created_at")
GENERATED = ("prio_key", "sort_at", "ready_key", "key_prio")
STORED, VIRTUAL = ("prio_key", "sort_at"), ("ready_key", "key_prio")
# The value each generated column would hold, for one/call's row and for x100's (insert_job's
# run_at is UTC_TIMESTAMP(6) + INTERVAL 0 MICROSECOND, insert_job_ready's UTC_TIMESTAMP(6)).
PLAIN_ONE = {"prio_key": "0", "sort_at": "UTC_TIMESTAMP(6) + INTERVAL 0 MICROSECOND", "ready_key": "NULL",
             "key_prio": "0"}
# Not notifyq's (the server's clock decides a job's times, never a producer's): the row's times as
# a literal, to price the expressions.
LITERAL_TIME = "'2026-11-30 12:00:00.000000'"
PLAIN_BULK = {"prio_key": "0", "sort_at": "UTC_TIMESTAMP(6)", "ready_key": "NULL", "key_prio": "0"}


def payload(i: int) -> dict:
    return {"user_id": i, "event": "signup", "email": f"user{i}@example.com"}  # _floor.payload


# ------------------------------------------------------------------ tables

def split_ddl(ddl: str) -> tuple[str, list[str], str]:
    """SHOW CREATE TABLE's text: (head up to the column list, its lines, the tail)."""
    head, rest = ddl.split("(\n", 1)
    body, tail = rest.rsplit("\n)", 1)
    return head, [line.strip().rstrip(",") for line in body.split("\n")], ")" + tail


def line_name(line: str) -> str | None:
    found = re.match(r"`(\w+)`", line)
    return found.group(1) if found else None


def key_columns(line: str) -> list[str]:
    return re.findall(r"`(\w+)`", line.split("(", 1)[1])


def variant_ddl(base: str, table: str, *, drop_keys: tuple[str, ...] = (), plain: tuple[str, ...] = (),
                drop_cols: tuple[str, ...] = (), keep_cols: tuple[str, ...] | None = None) -> str:
    """nq_job's DDL changed: keys dropped by name, generated columns made plain (nullable, no
    default: the INSERT writes them) or dropped, or only keep_cols kept (with the keys over them)."""
    head, lines, tail = split_ddl(base)
    out = []
    for line in lines:
        name = line_name(line)
        if name is not None:  # a column
            if name in drop_cols or (keep_cols is not None and name not in keep_cols):
                continue
            if name in plain:
                changed = re.sub(r" GENERATED ALWAYS AS \(.*\) (STORED|VIRTUAL)$", " DEFAULT NULL", line)
                assert changed != line, line
                line = changed
            out.append(line)
            continue
        keyname = re.match(r"(?:UNIQUE )?KEY `(\w+)`", line)
        if keyname and keyname.group(1) in drop_keys:
            continue
        if keep_cols is not None and not set(key_columns(line)) <= set(keep_cols):
            continue
        out.append(line)
    text = head.replace("`nq_job`", f"`{table}`") + "(\n  " + ",\n  ".join(out) + "\n" + tail
    return text


def add_key(ddl: str, key: str) -> str:
    head, tail = ddl.rsplit("\n)", 1)
    return f"{head},\n  {key}\n){tail}"


class Side:
    """A table and the statements of one/call and of x100 on it."""

    def __init__(self, name: str, table: str, ddl: str | None, *, seed: bool = False, bump: str | None = "upsert",
                 returning: bool = True, plain: tuple[str, ...] = (), literal_times: bool = False):
        self.name, self.table, self.ddl, self.seed, self.plain = name, table, ddl, seed, plain
        self.bump, self.returning, self.literal_times = bump, returning, literal_times

    def _times(self, text: str) -> str:
        """With literal_times, the row's server-clock expressions as one literal time instead."""
        if not self.literal_times:
            return text
        return text.replace("UTC_TIMESTAMP(6) + INTERVAL 0 MICROSECOND", LITERAL_TIME).replace(
            "UTC_TIMESTAMP(6)", LITERAL_TIME)

    def _statement(self, name: str, plain_values: dict[str, str]) -> tuple[str, str]:
        """notifyq's statement `name` on this side's table: (its head with the column list, its
        VALUES row), the plain columns this side writes added to both."""
        sql = Q[name].replace("INSERT INTO nq_job ", f"INSERT INTO {self.table} ")
        cols, values = sql.split("VALUES", 1)
        values = values.strip()
        if self.plain:
            cols = cols.rstrip()[:-1] + ", " + ", ".join(self.plain) + ") "
            values = values[:-1] + ", " + ", ".join(plain_values[c] for c in self.plain) + ")"
        return cols, values

    # The statements, as bytes around the payload's literal.
    def one(self) -> tuple[bytes, bytes]:
        if self.seed:
            head = f"INSERT INTO {self.table} (queue, status, payload) VALUES ('{QUEUE}', 0, "
            return head.encode(), b")"
        cols, values = self._statement("insert_job", PLAIN_ONE)
        # queue, status, priority, delay_us, max_attempts | payload | dedup_key, job_key
        row = self._times(values % (f"'{QUEUE}'", 0, 0, 0, 5, "\0", "NULL", "NULL"))
        before, after = row.split("\0")
        return (cols + "VALUES " + before).encode(), after.encode()

    def bulk(self) -> tuple[bytes, bytes, bytes]:
        """(head, a row's text before its payload, after it)."""
        if self.seed:
            return (f"INSERT INTO {self.table} (queue, status, payload) VALUES ".encode(),
                    f"('{QUEUE}', 0, ".encode(), b")")
        cols, values = self._statement("insert_job_ready", PLAIN_BULK)
        # queue, status, priority, max_attempts | payload
        row = self._times(values % (f"'{QUEUE}'", 0, 0, 5, "\0"))
        before, after = row.split("\0")
        return (cols + "VALUES ").encode(), before.encode(), after.encode()


SIDE_NAMES = ("seed", "seed+bump", "seed+stmts", "nq_job", "nq_job-bump", "nq_job upd-bump", "-ix_key",
              "-ix_key upd-bump", "-ix_key-vcols", "-ix_state", "-both", "-both upd-bump", "plain stored",
              "plain virtual", "plain all", "-both-gen", "put cols", "put cols-bump", "put cols+seed ix",
              "put cols+plain ix", "nq_job lit times", "put cols lit times", "put cols+claim")


def sides(base: str) -> list[Side]:
    put_cols = PUT_COLUMNS
    claim_cols = (*PUT_COLUMNS, "lease_until", "finished_at", "prio_key", "sort_at")
    made = [
        Side("seed", _seed.TABLE, _seed.DDL, seed=True, bump=None, returning=False),
        Side("seed+bump", "seed_bump", _seed.DDL.replace(_seed.TABLE, "seed_bump"), seed=True, returning=False),
        Side("seed+stmts", "seed_stmts", _seed.DDL.replace(_seed.TABLE, "seed_stmts"), seed=True),
        Side("nq_job", "nq_job", None),
        Side("nq_job-bump", "v_no_bump", variant_ddl(base, "v_no_bump"), bump=None),
        Side("nq_job upd-bump", "v_upd_bump", variant_ddl(base, "v_upd_bump"), bump="update"),
        Side("-ix_key", "v_no_ix_key", variant_ddl(base, "v_no_ix_key", drop_keys=("ix_key",))),
        Side("-ix_key upd-bump", "v_no_ix_key_upd", variant_ddl(base, "v_no_ix_key_upd", drop_keys=("ix_key",)),
             bump="update"),
        Side("-ix_key-vcols", "v_no_ix_key_vcols",
             variant_ddl(base, "v_no_ix_key_vcols", drop_keys=("ix_key",), drop_cols=VIRTUAL)),
        Side("-ix_state", "v_no_ix_state", variant_ddl(base, "v_no_ix_state", drop_keys=("ix_state",))),
        Side("-both", "v_pk_only", variant_ddl(base, "v_pk_only", drop_keys=("ix_state", "ix_key"))),
        Side("-both upd-bump", "v_pk_only_upd", variant_ddl(base, "v_pk_only_upd", drop_keys=("ix_state", "ix_key")),
             bump="update"),
        Side("plain stored", "v_plain_stored", variant_ddl(base, "v_plain_stored", plain=STORED), plain=STORED),
        Side("plain virtual", "v_plain_virtual", variant_ddl(base, "v_plain_virtual", plain=VIRTUAL),
             plain=VIRTUAL),
        Side("plain all", "v_plain_all", variant_ddl(base, "v_plain_all", plain=GENERATED), plain=GENERATED),
        Side("-both-gen", "v_no_gen", variant_ddl(base, "v_no_gen", drop_keys=("ix_state", "ix_key"),
                                                  drop_cols=GENERATED)),
        Side("put cols", "v_put_cols", variant_ddl(base, "v_put_cols", keep_cols=put_cols)),
        Side("put cols-bump", "v_put_cols_no_bump", variant_ddl(base, "v_put_cols_no_bump", keep_cols=put_cols),
             bump=None),
        Side("put cols+seed ix", "v_put_seed_ix", add_key(variant_ddl(base, "v_put_seed_ix", keep_cols=put_cols),
                                                          "KEY `ix_claim` (`queue`,`status`,`id`)")),
        Side("put cols+plain ix", "v_put_plain_ix", add_key(variant_ddl(base, "v_put_plain_ix", keep_cols=put_cols),
                                                            "KEY `ix_state` (`status`,`queue`,`priority`,`run_at`)")),
        Side("nq_job lit times", "v_lit_times", variant_ddl(base, "v_lit_times"), literal_times=True),
        Side("put cols lit times", "v_put_cols_lit", variant_ddl(base, "v_put_cols_lit", keep_cols=put_cols),
             literal_times=True),
        Side("put cols+claim", "v_put_claim", variant_ddl(base, "v_put_claim", keep_cols=claim_cols,
                                                          drop_keys=("ix_key",))),
    ]
    assert tuple(side.name for side in made) == SIDE_NAMES
    return made


# ------------------------------------------------------------------ timed loops

# Not notifyq's: the bump as a plain UPDATE of a slot row made beforehand (setup makes all 16),
# measured as the alternative to bump_signal's INSERT ... ON DUPLICATE KEY UPDATE.
BUMP_UPDATE = "UPDATE nq_signal SET seq = seq + %(n)s WHERE queue = %(queue)s AND slot = %(slot)s"


def bump_text(n: int, kind: str = "upsert") -> list[bytes]:
    sql = Q["bump_signal"] if kind == "upsert" else BUMP_UPDATE
    return [(sql % {"queue": f"'{QUEUE}'", "slot": slot, "n": n}).encode() for slot in range(SIGNAL_SLOTS)]


def run_one(db, side: Side, start: int, n: int) -> None:
    """n puts: INSERT (+ bump, in its round trip) then COMMIT, each."""
    head, tail = side.one()
    bumps = [tail + b";\n" + b for b in bump_text(1, side.bump)] if side.bump else None
    escape = db.string_literal
    dumps = json.dumps
    rand = random.random
    for i in range(start, start + n):
        literal = escape(dumps(payload(i)).encode())
        if bumps is not None:
            db.query(head + literal + bumps[int(rand() * SIGNAL_SLOTS)])
            job_id, stored = db.insert_id(), db.affected_rows()
            db.next_result()
            assert stored == 1 and db.affected_rows() >= 1 and job_id
        else:
            db.query(head + literal + tail)
            assert db.affected_rows() == 1
        db.commit()


def run_bulk(db, side: Side, start: int, n: int) -> None:
    """n jobs in 100-row INSERTs (+ the ids' read and the bump), each its own COMMIT. The ids as
    inserts._insert_uniform reads them: RETURNING id on MariaDB, on MySQL the increment read in
    the INSERT's query."""
    head, pre, post = side.bulk()
    between = post + b"," + pre
    bumps = bump_text(CHUNK, side.bump) if side.bump else None
    returning = side.returning and "MariaDB" in db.get_server_info()
    increment = side.returning and not returning
    escape = db.string_literal
    dumps = json.dumps
    for s in range(start, start + n, CHUNK):
        payloads = [escape(dumps(payload(i)).encode()) for i in range(s, s + CHUNK)]
        statement = head + pre + between.join(payloads) + post
        if returning:
            statement += b" RETURNING id"
        elif increment:
            statement += b";\n" + Q["auto_increment_increment"].encode()
        if bumps is not None:
            statement += b";\n" + bumps[random.randrange(SIGNAL_SLOTS)]
        db.query(statement)
        if returning:
            assert len(db.store_result().fetch_row(0)) == CHUNK
        else:
            assert db.affected_rows() == CHUNK
            if increment:
                db.next_result()
                db.store_result().fetch_row()
        if bumps is not None:
            db.next_result()
            assert db.affected_rows() >= 1
        db.commit()


def server_cpu_s(pid: int | None) -> float | None:
    """The server's CPU time so far, all its threads (schedstat's run time: nanoseconds, where
    /proc/PID/stat counts 10 ms ticks). A thread that ended takes its time with it; the
    connection threads measured live throughout."""
    if pid is None:
        return None
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / 1e9


def timed_round(db, observer, all_sides: list[Side], kind: str, n: int, slices: int, pid: int | None) -> dict:
    """One round of `kind`: every side's table emptied and warmed, then n jobs a side in `slices`
    slices, the sides taking turns slice by slice (the order reversed every other slice), so
    that the machine's load falls alike on every side. {side: jobs/s, server CPU µs a job}."""
    cur = observer.cursor()
    run = run_one if kind == "one" else run_bulk
    for side in all_sides:
        cur.execute(f"TRUNCATE TABLE {side.table}")
        run(db, side, -CHUNK, CHUNK)  # warm-up: the table's first pages, the plans
    step = n // slices
    wall = {side.name: 0.0 for side in all_sides}
    cpu = {side.name: 0.0 for side in all_sides}
    for k in range(slices):
        for side in all_sides if k % 2 == 0 else all_sides[::-1]:
            c0, t0 = server_cpu_s(pid), time.perf_counter()
            run(db, side, k * step, step)
            wall[side.name] += time.perf_counter() - t0
            if pid is not None:
                cpu[side.name] += server_cpu_s(pid) - c0
    done = step * slices
    return {name: {"jobs_s": done / wall[name], "server_us": cpu[name] / done * 1e6 if pid is not None else None}
            for name in wall}


# ------------------------------------------------------------------ main

def setup(url: str) -> tuple[dict, list[Side]]:
    dsn = DSN.parse(url.rstrip("/") + "/" + DATABASE)
    args = dsn.connect_args()
    admin = MySQLdb.connect(**{k: v for k, v in args.items() if k != "database"}, autocommit=True)
    admin.cursor().execute(f"DROP DATABASE IF EXISTS {DATABASE}")
    admin.close()
    schema.init(dsn)  # nq_job exactly as `notifyq init` makes it
    conn = MySQLdb.connect(**args, autocommit=True)
    cur = conn.cursor()
    cur.execute("SHOW CREATE TABLE nq_job")
    base = cur.fetchone()[1]
    all_sides = sides(base)
    for side in all_sides:
        if side.ddl is not None:
            cur.execute(side.ddl)
    cur.execute("INSERT INTO nq_signal (queue, slot, seq) VALUES "
                + ",".join(f"('{QUEUE}', {slot}, 0)" for slot in range(SIGNAL_SLOTS)))
    conn.close()
    return args, all_sides


def columns_and_keys(observer, table: str) -> tuple[int, int]:
    cur = observer.cursor()
    cur.execute("SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                (DATABASE, table))
    columns = cur.fetchone()[0]
    cur.execute("SELECT COUNT(DISTINCT INDEX_NAME) FROM information_schema.STATISTICS "
                "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND INDEX_NAME <> 'PRIMARY'", (DATABASE, table))
    return columns, cur.fetchone()[0]


def summarise(records: dict, names: list[str], kinds: list[str]) -> dict:
    out: dict = {}
    for name in names:
        out[name] = {}
        for kind in kinds:
            runs = records[kind][name]
            seeds = records[kind]["seed"]
            ratios = [r["jobs_s"] / s["jobs_s"] for r, s in zip(runs, seeds)]
            cpu = [r["server_us"] for r in runs if r["server_us"] is not None]
            out[name][kind] = {"jobs_s": round(statistics.median(r["jobs_s"] for r in runs)),
                               "ratio": round(statistics.median(ratios), 3),
                               "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
                               "server_us": round(statistics.median(cpu), 2) if cpu else None}
    return out


def table(summary: dict, shape: dict, kinds: list[str]) -> str:
    head = "| side | cols | sec. idx |"
    rule = "|---|---:|---:|"
    for kind in kinds:
        label = "one/call" if kind == "one" else "x100"
        head += f" {label} jobs/s | {label} / seed | {label} server µs/job |"
        rule += "---:|---:|---:|"
    lines = [head, rule]
    for name, per in summary.items():
        cols, keys = shape[name]
        line = f"| {name} | {cols} | {keys} |"
        for kind in kinds:
            r = per[kind]
            cpu = "-" if r["server_us"] is None else f"{r['server_us']:.1f}"
            line += f" {r['jobs_s']:,} | {r['ratio']:.2f} [{r['ratio_min']:.2f}-{r['ratio_max']:.2f}] | {cpu} |"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", help="a root-like account on a server to use instead of a private LocalServer")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--put-n", type=int, default=2000, help="jobs per timed one/call run")
    ap.add_argument("--bulk-n", type=int, default=20000, help="jobs per timed x100 run (a multiple of 100)")
    ap.add_argument("--slices", type=int, default=10, help="turns each side takes in a round")
    ap.add_argument("--only", default="one,bulk", help="one, bulk or both (comma-separated)")
    ap.add_argument("--sides", help="comma-separated subset of the sides (seed is always run)")
    a = ap.parse_args(argv)
    kinds = [k for k in ("one", "bulk") if k in a.only.split(",")]
    bulk_n = max(CHUNK, a.bulk_n // CHUNK * CHUNK)
    wanted = {"seed", *a.sides.split(",")} if a.sides else set(SIDE_NAMES)
    if wanted - set(SIDE_NAMES):
        raise SystemExit(f"unknown sides: {', '.join(sorted(wanted - set(SIDE_NAMES)))}; "
                         f"the sides: {', '.join(SIDE_NAMES)}")
    server = None
    tmp = tempfile.mkdtemp(prefix="nq-put-row-")
    try:
        if a.dsn:
            url, pid = a.dsn, None
        else:
            server = LocalServer(Path(tmp) / "server", redo_log_mb=REDO_LOG_MB)
            server.start()
            url, pid = server.dsn, server._proc.pid
        args, all_sides = setup(url)
        if a.sides:
            all_sides = [s for s in all_sides if s.name in wanted]
        names = [s.name for s in all_sides]
        db = MySQLdb.connect(**args, autocommit=False, client_flag=CLIENT.MULTI_STATEMENTS,
                             init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        observer = MySQLdb.connect(**args, autocommit=True)
        shape = {s.name: columns_and_keys(observer, s.table) for s in all_sides}
        cur = observer.cursor()
        cur.execute("SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@innodb_buffer_pool_size")
        version, flush, pool = cur.fetchone()
        print(f"# {version}  flush_log_at_trx_commit={flush}  buffer_pool={int(pool) >> 20}M  "
              f"cpus={os.cpu_count()}  rounds={a.rounds}  one/call n={a.put_n}  x100 n={bulk_n}", flush=True)
        records: dict = {kind: {name: [] for name in names} for kind in kinds}
        loads = [os.getloadavg()[0]]
        started = time.monotonic()
        for rnd in range(a.rounds):
            order = all_sides if rnd % 2 == 0 else all_sides[::-1]
            for kind in kinds:
                n = a.put_n if kind == "one" else bulk_n
                slices = a.slices if kind == "one" else max(1, min(a.slices, bulk_n // CHUNK))
                if kind == "bulk":
                    n = n // (slices * CHUNK) * slices * CHUNK
                for name, result in timed_round(db, observer, order, kind, n, slices, pid).items():
                    records[kind][name].append(result)
            loads.append(os.getloadavg()[0])
            print(f"# round {rnd + 1}/{a.rounds} done, {time.monotonic() - started:.0f}s, "
                  f"load {loads[-1]:.2f}", flush=True)
        summary = summarise(records, names, kinds)
        print()
        print(table(summary, shape, kinds))
        print(f"\nratios: jobs/s over seed's in the same round, median [min-max] of {a.rounds} rounds; "
              f"load (1 min) {min(loads):.2f}-{max(loads):.2f}")
        db.close()
        observer.cursor().execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        observer.close()
        print(json.dumps({"bench": "put_row", "server": version, "rounds": a.rounds, "put_n": a.put_n,
                          "bulk_n": bulk_n, "load": [round(x, 2) for x in loads],
                          "shape": shape, "sides": summary, "raw": records}))
    finally:
        if server is not None:
            server.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
