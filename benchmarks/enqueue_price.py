#!/usr/bin/env python3
"""What an enqueue costs the server, in raw SQL: notifyq's schema and statements next to the
seed's, without notifyq's Python, on one connection, the sides alternating within each round.

    .venv/bin/python benchmarks/enqueue_price.py --dsn mysql://root@127.0.0.1:3306/ [--rounds 5]

Bulk (100-row INSERT + COMMIT): the seed's table, nq_job at schema version 4 (seven index
entries per row) and at the current version, and the latter with the `RETURNING id` MariaDB
names the ids with. Per job: the seed's INSERT + COMMIT, the same on nq_job, plus the signal bump
in the INSERT's round trip (every put), plus the ring's look in the COMMIT's round trip (a
ringing producer), and the bump as a plain UPDATE instead (the alternative measured). Ratios are jobs/s over the seed's, median [min-max].
It creates and drops two databases of its own (nq_price_v4, nq_price_now).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import MySQLdb
from MySQLdb.constants import CLIENT

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))  # _floor's number_rows

from _floor import payload  # noqa: E402
from _seed import DDL as SEED_DDL  # noqa: E402
from _seed import TABLE as SEED_TABLE  # noqa: E402

from notifyq.config.dsn import DSN  # noqa: E402
from notifyq.store.sql import migrations, split_statements  # noqa: E402

DATABASES = {"v4": "nq_price_v4", "now": "nq_price_now"}
JOB_ROW = "(%s, 0, 0, UTC_TIMESTAMP(6) + INTERVAL 0 MICROSECOND, 5, %s, NULL, UTC_TIMESTAMP(6))"
JOB_HEAD = "INSERT INTO {db}.nq_job (queue, status, priority, run_at, max_attempts, payload, dedup_key, created_at) VALUES "
SEED_ROW = "(%s, 0, %s)"
SEED_HEAD = "INSERT INTO {db}." + SEED_TABLE + " (queue, status, payload) VALUES "
BUMP = ("INSERT INTO {db}.nq_signal (queue, slot, seq) VALUES ('q', %s, 1) "
        "ON DUPLICATE KEY UPDATE seq = seq + 1")
# The bump as a plain UPDATE of a slot row that exists already (the alternative measured).
BUMP_UPDATE = "UPDATE {db}.nq_signal SET seq = seq + 1 WHERE queue = 'q' AND slot = %s"
LOOK = "SELECT IS_USED_LOCK('nq:price:watch'), IS_USED_LOCK('nq:price:b0'), IS_USED_LOCK('nq:price:b1')"


def setup(conn) -> None:
    cur = conn.cursor()
    for version, db in (("v4", DATABASES["v4"]), ("now", DATABASES["now"])):
        cur.execute(f"DROP DATABASE IF EXISTS {db}")
        cur.execute(f"CREATE DATABASE {db} CHARACTER SET utf8mb4")
        conn.select_db(db)
        for number, text in migrations():
            if version == "now" or number <= 4:
                for statement in split_statements(text):
                    cur.execute(statement)
    cur.execute(SEED_DDL)  # in the current version's database
    cur.execute("INSERT INTO nq_signal (queue, slot, seq) VALUES " + ",".join(f"('q', {i}, 0)" for i in range(16)))


def rows(start: int, n: int) -> list[str]:
    params: list[str] = []
    for i in range(start, start + n):
        params += ["q", json.dumps(payload(i))]
    return params


def bulk_side(conn, head: str, row: str, n: int, chunk: int = 100, tail: str = ""):
    cur = conn.cursor()

    def run() -> None:
        for start in range(0, n, chunk):
            cur.execute(head + ",".join([row] * chunk) + tail, rows(start, chunk))
            cur.fetchall()
            conn.commit()
    return run


def single_side(conn, head: str, row: str, n: int, bump: bool, look: bool, bump_update: bool = False):
    cur = conn.cursor()
    bump_sql = (BUMP_UPDATE if bump_update else BUMP).format(db=DATABASES["now"])

    def run() -> None:
        for i in range(n):
            sql = head + row + (";\n" + bump_sql if bump else "")
            cur.execute(sql, [*rows(i, 1), *([i % 16] if bump else [])])
            while cur.nextset():
                pass
            if look:
                cur.execute("COMMIT;\n" + LOOK)
                cur.nextset()
                cur.fetchone()
                while cur.nextset():
                    pass
            else:
                conn.commit()
    return run


def measure(sides: dict, n: int, rounds: int) -> dict[str, list[float]]:
    ratios: dict[str, list[float]] = {name: [] for name in sides if name != "seed"}
    for rnd in range(rounds):
        order = list(sides) if rnd % 2 == 0 else list(reversed(sides))
        rate = {}
        for name in order:
            t0 = time.perf_counter()
            sides[name]()
            rate[name] = n / (time.perf_counter() - t0)
        for name in ratios:
            ratios[name].append(rate[name] / rate["seed"])
    return ratios


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="mysql://root@127.0.0.1:3306/", help="a root-like account")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bulk-n", type=int, default=20000)
    ap.add_argument("--put-n", type=int, default=2000)
    a = ap.parse_args(argv)
    args = DSN.parse(a.dsn).connect_args()
    args.pop("database", None)
    conn = MySQLdb.connect(**args, autocommit=True, client_flag=CLIENT.MULTI_STATEMENTS)
    try:
        setup(conn)
        conn.autocommit(False)
        conn.cursor().execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        now, v4 = DATABASES["now"], DATABASES["v4"]
        bulk = {"seed": bulk_side(conn, SEED_HEAD.format(db=now), SEED_ROW, a.bulk_n),
                "nq_job v4": bulk_side(conn, JOB_HEAD.format(db=v4), JOB_ROW, a.bulk_n),
                "nq_job now": bulk_side(conn, JOB_HEAD.format(db=now), JOB_ROW, a.bulk_n),
                "+ RETURNING id": bulk_side(conn, JOB_HEAD.format(db=now), JOB_ROW, a.bulk_n,
                                            tail=" RETURNING id")}
        single = {"seed": single_side(conn, SEED_HEAD.format(db=now), SEED_ROW, a.put_n, False, False),
                  "nq_job now": single_side(conn, JOB_HEAD.format(db=now), JOB_ROW, a.put_n, False, False),
                  "+ bump": single_side(conn, JOB_HEAD.format(db=now), JOB_ROW, a.put_n, True, False),
                  "+ bump + look": single_side(conn, JOB_HEAD.format(db=now), JOB_ROW, a.put_n, True, True),
                  "+ UPDATE bump": single_side(conn, JOB_HEAD.format(db=now), JOB_ROW, a.put_n, True, False, True)}
        for title, sides, n in (("100-row INSERT + COMMIT", bulk, a.bulk_n),
                                ("INSERT + COMMIT per job", single, a.put_n)):
            for name, values in measure(sides, n, a.rounds).items():
                print(f"{title:<24} {name:<14} / seed: {statistics.median(values):.2f} "
                      f"[{min(values):.2f}-{max(values):.2f}]  ({a.rounds} rounds)")
    finally:
        conn.autocommit(True)
        for db in DATABASES.values():
            conn.cursor().execute(f"DROP DATABASE IF EXISTS {db}")
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
