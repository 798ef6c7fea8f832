"""The seed floor: the queue the project started from, on its own table, in plain mysqlclient.

Where _floor.py runs the fewest statements on notifyq's own table (so notifyq / _floor is the
price of the code), this runs the seed's design on the seed's table (so notifyq / seed is the
price of the code and the schema together; their quotient is the schema's share):

  table     id BIGINT AUTO_INCREMENT PRIMARY KEY, queue, status, owner, claimed_at, payload,
            and one secondary index (queue, status, id)
  enqueue   one INSERT + COMMIT per job; bulk: one 100-row INSERT + COMMIT
  consume   one process per worker: read up to 3 x batch candidate ids, lock up to a batch of
            them with SELECT ... WHERE id IN (...) FOR UPDATE SKIP LOCKED, UPDATE them to
            claimed, COMMIT, run the handler per job, DELETE ... WHERE id IN (...), COMMIT;
            when nothing was claimed, sleep 0.1 s (the seed polls)

READ COMMITTED, and the same handlers and JSON as notifyq's run (_bench_handlers, json.loads of
the stored text). The payload column has notifyq's type, so the JSON is stored alike.

Run as a child process by bench.py: `python _seed.py ROLE JSON-ARGS`; prints one JSON line.
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import signal
import sys
import time

import MySQLdb

import _bench_handlers
import _statements

TABLE = "seed_job"
DDL = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    id         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    queue      VARCHAR(64)  NOT NULL,
    status     TINYINT      NOT NULL DEFAULT 0,
    owner      CHAR(32)     NULL,
    claimed_at DATETIME(6)  NULL,
    payload    MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    KEY ix_claim (queue, status, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"""

READY, CLAIMED = 0, 1
POLL_S = 0.1
INSERT = f"INSERT INTO {TABLE} (queue, status, payload) VALUES "
INSERT_ROW = "(%s, 0, %s)"
CANDIDATES = f"SELECT id FROM {TABLE} WHERE queue = %s AND status = 0 ORDER BY id LIMIT %s"
# By primary key: on a small table the optimizer would scan instead, and a scan waits on (and
# deadlocks with) the other consumers' rows. status = 0 drops candidates claimed meanwhile.
LOCK = (f"SELECT id, payload FROM {TABLE} FORCE INDEX (PRIMARY) WHERE id IN ({{}}) AND status = 0 "
        "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED")
# The same hint for the mark and the delete: a scan would wait on the other consumers' rows.
MARK = (f"UPDATE {TABLE} FORCE INDEX (PRIMARY) SET status = 1, owner = %s, claimed_at = NOW(6) "
        "WHERE id IN ({})")
DELETE = f"DELETE {TABLE} FROM {TABLE} FORCE INDEX (PRIMARY) WHERE id IN ({{}})"
# Server-side fill for bench.py, which appends the rows' source: the same payload text as
# notifyq's fill.
FILL = (f"INSERT INTO {TABLE} (queue, status, payload) "
        "SELECT %s, 0, CONCAT('{\"user_id\":', seq, ',\"event\":\"signup\",\"email\":\"user', seq, "
        "'@example.com\"}') FROM ")

Job = collections.namedtuple("Job", "id payload")


def connect(conn_args: dict):
    conn = MySQLdb.connect(**conn_args, autocommit=False,
                           init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn, conn.cursor()


def marks(n: int) -> str:
    return ",".join(["%s"] * n)


# ------------------------------------------------------------------ enqueue

def _enqueue(a: dict, chunk: int) -> dict:
    """`chunk` rows per INSERT + COMMIT; Questions counted around the timed loop only."""
    conn, cur = connect(a["conn"])
    observer = MySQLdb.connect(**a["conn"], autocommit=True)
    queue, n = a["queue"], a["n"]
    cur.execute(INSERT + INSERT_ROW, (queue, json.dumps(_payload(-1))))  # warm-up: connection, plans
    conn.commit()
    before = _statements.snapshot(observer)
    t0, c0 = time.perf_counter(), time.process_time()
    for start in range(0, n, chunk):
        count = min(chunk, n - start)
        params = []
        for i in range(start, start + count):
            params += (queue, json.dumps(_payload(i)))
        cur.execute(INSERT + ",".join([INSERT_ROW] * count), params)
        conn.commit()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    counts = _statements.delta(before, _statements.snapshot(observer))
    return {"wall_s": wall, "cpu_s": cpu, "n": n, "statements": counts}


def _payload(i: int) -> dict:
    return {"user_id": i, "event": "signup", "email": f"user{i}@example.com"}


def put(a: dict) -> dict:
    return _enqueue(a, 1)


def put_many(a: dict) -> dict:
    return _enqueue(a, a["chunk"])


# ------------------------------------------------------------------ consume

def claim(conn, cur, queue: str, batch: int, owner: str) -> tuple[list[tuple], int]:
    """(claimed rows, candidates seen): the seed's claim, committed."""
    cur.execute(CANDIDATES, (queue, 3 * batch))
    ids = [r[0] for r in cur.fetchall()]
    rows: list[tuple] = []
    if ids:
        cur.execute(LOCK.format(marks(len(ids))), (*ids, batch))
        rows = list(cur.fetchall())
    if rows:
        cur.execute(MARK.format(marks(len(rows))), (owner, *[r[0] for r in rows]))
    conn.commit()
    return rows, len(ids)


def ack(conn, cur, ids: list[int]) -> None:
    cur.execute(DELETE.format(marks(len(ids))), ids)
    conn.commit()


def consume(a: dict, stop=lambda: False) -> int:
    """Claim, run, ack; on an empty claim sleep POLL_S, or with exit_when_empty end once no
    candidate is left (a claim that found candidates all locked by others polls again)."""
    conn, cur = connect(a["conn"])
    owner = secrets.token_hex(16)
    handler = getattr(_bench_handlers, a.get("handler", "noop"))
    n = 0
    while not stop():
        rows, seen = claim(conn, cur, a["queue"], a["batch"], owner)
        if not rows:
            if seen == 0 and a.get("exit_when_empty"):
                break
            time.sleep(POLL_S)
            continue
        for job_id, text in rows:
            handler(Job(job_id, json.loads(text)))
        ack(conn, cur, [r[0] for r in rows])
        n += len(rows)
    conn.close()
    return n


def drain(a: dict) -> dict:
    return {"n": consume({**a, "exit_when_empty": True})}


def serve(a: dict) -> dict:
    """Consume until SIGTERM, as a seed worker process does (pick-up from idle, attached runs)."""
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    return {"n": consume(a, stop=lambda: bool(stopping))}


ROLES = {"put": put, "put_many": put_many, "drain": drain, "serve": serve}

if __name__ == "__main__":
    result = ROLES[sys.argv[1]](json.loads(sys.argv[2]))
    print(json.dumps({"pid": os.getpid(), **result}), flush=True)
