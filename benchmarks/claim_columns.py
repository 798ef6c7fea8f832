#!/usr/bin/env python3
"""The server's CPU per locked row for ways of reading a claimed job's two times.

    .venv/bin/python benchmarks/claim_columns.py [--rows 50000] [--passes 4] [--rounds 11]

A private server (notifyq.localserver.LocalServer: its process's CPU is this benchmark's
alone), one table shaped as nq_job's claimed columns, and claim_lock's locking read (100 rows
by id, `FOR UPDATE SKIP LOCKED`, rolled back) over every row `--passes` times per variant; the
variants alternate within each round. Reported: the server process's CPU (user + system, in
clock ticks) per row, median [min-max] over the rounds. The variants: the DATETIMEs as they
are (the driver decodes each), their text as BINARY (the claim's: the Job decodes it when
read), their text as CHAR, and an integer of microseconds (TIMESTAMPDIFF).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import MySQLdb  # noqa: E402

from notifyq.run.localserver import LocalServer  # noqa: E402
from notifyq.store.driver import CONVERSIONS  # noqa: E402

HEAD = "id, payload, priority, attempts, max_attempts"
TAIL = "dedup_key, job_key, suspect, min_version"
VARIANTS = {
    "datetime": f"{HEAD}, run_at, created_at, {TAIL}",
    "binary": f"{HEAD}, CAST(run_at AS BINARY), CAST(created_at AS BINARY), {TAIL}",
    "char": f"{HEAD}, CAST(run_at AS CHAR), CAST(created_at AS CHAR), {TAIL}",
    "microseconds": (f"{HEAD}, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', run_at), "
                     f"TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at), {TAIL}"),
}
TABLE = ("CREATE TABLE j (id BIGINT PRIMARY KEY AUTO_INCREMENT, payload LONGTEXT, priority INT, "
         "attempts INT, max_attempts INT, run_at DATETIME(6) NOT NULL, "
         "created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), dedup_key VARCHAR(100), "
         "job_key VARCHAR(100), suspect TINYINT, min_version INT, status TINYINT)")


def server_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=50000)
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=11)
    a = ap.parse_args(argv)
    server = LocalServer(tempfile.mkdtemp(prefix="nq-claim-columns-"))
    server.start()
    try:
        assert server._proc is not None
        pid = server._proc.pid
        conn = MySQLdb.connect(host="127.0.0.1", port=server.port, user="root", conv=CONVERSIONS,
                               charset="utf8mb4", autocommit=False)
        cur = conn.cursor()
        cur.execute("SET time_zone = '+00:00'")
        cur.execute("CREATE DATABASE claim_columns")
        cur.execute("USE claim_columns")
        cur.execute(TABLE)
        for start in range(0, a.rows, 1000):
            n = min(1000, a.rows - start)  # (MariaDB's sequence engine: a table of 1..n)
            cur.execute("INSERT INTO j (payload, priority, attempts, max_attempts, run_at, status) "
                        f"SELECT '{{\"a\":1}}', 0, 0, 5, NOW(6), 0 FROM seq_1_to_{int(n)}")
        conn.commit()
        windows = [tuple(range(s, min(s + 100, a.rows + 1))) for s in range(1, a.rows + 1, 100)]
        per_row: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for _ in range(a.rounds):
            for name, columns in VARIANTS.items():
                sql = (f"SELECT {columns} FROM j FORCE INDEX (PRIMARY) "
                       "WHERE id IN %s AND status = 0 FOR UPDATE SKIP LOCKED")
                before = server_cpu_s(pid)
                for _ in range(a.passes):
                    for ids in windows:
                        cur.execute(sql, (ids,))
                        cur.fetchall()
                        conn.rollback()
                per_row[name].append((server_cpu_s(pid) - before) / (a.rows * a.passes) * 1e6)
        for name, values in per_row.items():
            print(f"{name:<13} server CPU µs/row {statistics.median(values):.2f} "
                  f"[{min(values):.2f}-{max(values):.2f}]")
        conn.close()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
