"""The raw-SQL floor: the statements notifyq needs at minimum, in plain mysqlclient.

No notifyq import, no retry layer, no validation: a multi-row INSERT and COMMIT to enqueue; a
claim of a batch by SKIP LOCKED straight off the ready index, one UPDATE to mark it, COMMIT;
then one DELETE of the batch and COMMIT. It does the work any consumer must do (JSON in and
out, a handler call per job) and nothing else, in the same READ COMMITTED session setup.

Run as a child process by bench.py: `python _floor.py ROLE JSON-ARGS`; prints one JSON line.
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import sys
import time

import MySQLdb

import _bench_handlers
from number_rows import numbers

INSERT_ROW = "(%s, 0, 0, NOW(6), 5, %s)"
INSERT = "INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload) VALUES "
CLAIM = ("SELECT id, payload FROM nq_job FORCE INDEX (ix_state) WHERE status = 0 AND queue = %s "
         "ORDER BY prio_key, sort_at, id LIMIT %s FOR UPDATE SKIP LOCKED")
# By primary key, as notifyq does: on a small table the optimizer scans instead, and the scan
# waits on (and deadlocks with) other consumers' rows.
MARK = ("UPDATE nq_job FORCE INDEX (PRIMARY) SET status = 2, owner = %s, claim_token = %s, "
        "claimed_at = NOW(6), lease_until = NOW(6) + INTERVAL 300 SECOND, attempts = attempts + 1 "
        "WHERE id IN ({})")
DELETE = "DELETE nq_job FROM nq_job FORCE INDEX (PRIMARY) WHERE id IN ({})"

Job = collections.namedtuple("Job", "id payload")


def connect(conn_args: dict):
    conn = MySQLdb.connect(**conn_args, autocommit=False,
                           init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn, conn.cursor()


def payload(i: int) -> dict:
    return {"user_id": i, "event": "signup", "email": f"user{i}@example.com"}


def put(a: dict) -> dict:
    conn, cur = connect(a["conn"])
    sql = INSERT + INSERT_ROW
    cur.execute(sql, (a["queue"], json.dumps(payload(-1))))  # warm-up: connection, plan cache
    conn.commit()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(a["n"]):
        cur.execute(sql, (a["queue"], json.dumps(payload(i))))
        conn.commit()
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "n": a["n"]}


BUMP = ("INSERT INTO nq_signal (queue, slot, seq) VALUES (%s, %s, %s) "
        "ON DUPLICATE KEY UPDATE seq = seq + VALUES(seq)")


def put_signal(a: dict) -> dict:
    """put() plus what notifyq's wake-up design adds per commit: one nq_signal bump."""
    conn, cur = connect(a["conn"])
    sql = INSERT + INSERT_ROW
    cur.execute(sql, (a["queue"], json.dumps(payload(-1))))
    conn.commit()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(a["n"]):
        cur.execute(sql, (a["queue"], json.dumps(payload(i))))
        cur.execute(BUMP, (a["queue"], i % 16, 1))
        conn.commit()
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "n": a["n"]}


def put_many(a: dict) -> dict:
    conn, cur = connect(a["conn"])
    queue, chunk = a["queue"], a["chunk"]
    cur.execute(INSERT + INSERT_ROW, (queue, json.dumps(payload(-1))))
    conn.commit()
    t0, c0 = time.perf_counter(), time.process_time()
    for start in range(0, a["n"], chunk):
        count = min(chunk, a["n"] - start)
        params = []
        for i in range(start, start + count):
            params += (queue, json.dumps(payload(i)))
        cur.execute(INSERT + ",".join([INSERT_ROW] * count), params)
        if a.get("signal"):
            cur.execute(BUMP, (queue, start % 16, count))
        conn.commit()
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "n": a["n"]}


def _claim(conn, cur, queue: str, batch: int, owner: str) -> list[tuple]:
    cur.execute(CLAIM, (queue, batch))
    rows = cur.fetchall()
    if rows:
        marks = ",".join(["%s"] * len(rows))
        cur.execute(MARK.format(marks), (owner, secrets.randbits(63), *[r[0] for r in rows]))
    conn.commit()
    return rows


CANDIDATES = ("SELECT id FROM nq_job FORCE INDEX (ix_state) WHERE status = 0 AND queue = %s "
              "ORDER BY prio_key, sort_at, id LIMIT %s")
LOCK = ("SELECT id, payload FROM nq_job FORCE INDEX (PRIMARY) WHERE id IN ({}) AND status = 0 "
        "FOR UPDATE SKIP LOCKED")


def _claim_two_step(conn, cur, queue: str, batch: int, owner: str) -> list[tuple]:
    """notifyq's claim shape, bare: plain candidate read (3x), lock by primary key, mark."""
    cur.execute(CANDIDATES, (queue, batch * 3))
    ids = [r[0] for r in cur.fetchall()]
    rows: list[tuple] = []
    for start in range(0, len(ids), batch):
        if len(rows) >= batch:
            break
        window = ids[start:start + batch - len(rows)]
        cur.execute(LOCK.format(",".join(["%s"] * len(window))), window)
        rows += cur.fetchall()
    if rows:
        marks = ",".join(["%s"] * len(rows))
        cur.execute(MARK.format(marks), (owner, secrets.randbits(63), *[r[0] for r in rows]))
    conn.commit()
    return rows


def _ack(conn, cur, ids: list[int]) -> None:
    cur.execute(DELETE.format(",".join(["%s"] * len(ids))), ids)
    conn.commit()


def drain(a: dict) -> dict:
    """Claim, run, ack until a claim comes back empty (like --exit-when-empty)."""
    conn, cur = connect(a["conn"])
    owner = secrets.token_hex(16)
    handler = getattr(_bench_handlers, a.get("handler", "noop"))
    claim = _claim_two_step if a.get("two_step") else _claim
    n = 0
    while True:
        rows = claim(conn, cur, a["queue"], a["batch"], owner)
        if not rows:
            break
        for job_id, text in rows:
            handler(Job(job_id, json.loads(text)))
        _ack(conn, cur, [r[0] for r in rows])
        n += len(rows)
    conn.close()
    return {"n": n}


REFILL = ("INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload) "
          "SELECT %s, 0, 0, NOW(6), 5, CONCAT('{\"user_id\":', seq, '}') FROM ")


def refill(conn, cur, queue: str, n: int) -> None:
    """Put back as many jobs as a claim took (untimed): the backlog stays at its size."""
    cur.execute(REFILL + numbers(n), (queue,))
    conn.commit()


def claims(a: dict) -> dict:
    """Time single claims (and their acks) against a standing backlog."""
    conn, cur = connect(a["conn"])
    owner = secrets.token_hex(16)
    claim_s, ack_s, sizes = [], [], []
    for _ in range(a["m"]):
        t0 = time.perf_counter()
        rows = _claim(conn, cur, a["queue"], a["batch"], owner)
        t1 = time.perf_counter()
        if rows:
            _ack(conn, cur, [r[0] for r in rows])
        claim_s.append(t1 - t0)
        ack_s.append(time.perf_counter() - t1)
        sizes.append(len(rows))
        refill(conn, cur, a["queue"], a["batch"])
    return {"claim_s": claim_s, "ack_s": ack_s, "sizes": sizes}


ROLES = {"put": put, "put_signal": put_signal, "put_many": put_many, "drain": drain, "claims": claims}

if __name__ == "__main__":
    result = ROLES[sys.argv[1]](json.loads(sys.argv[2]))
    print(json.dumps({"pid": os.getpid(), **result}), flush=True)
