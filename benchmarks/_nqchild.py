"""notifyq's side of the benchmark, one role per child process (the floor's twin: _floor.py).

Run by bench.py: `python _nqchild.py ROLE JSON-ARGS`; prints one JSON line. Only the public
Producer API is used for enqueueing; the claim-latency role calls queries.claim/queries.ack, the
functions every Worker turn goes through.
"""

from __future__ import annotations

import json
import os
import sys
import time

import MySQLdb

import _floor
import _statements
from _floor import payload

from notifyq import config as config_mod
from notifyq.produce.producer import Producer
from notifyq.store import queries
from notifyq.store.db import Session


def _config(a: dict) -> config_mod.Config:
    return config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"}, overrides={"dsn": a["dsn"]})


def _observer(a: dict):
    """A root connection outside the producer's sessions, for the statement counts."""
    return MySQLdb.connect(**a["conn"], autocommit=True)


def put(a: dict) -> dict:
    """put() per job; ring=True is the mode the README recommends for a long-lived producer."""
    observer = _observer(a)
    with Producer(a["queue"], _config(a), ring=a.get("ring", False)) as producer:
        producer.put(payload(-1))  # warm-up: connection, ensure_queue, and a ringer arms here
        before = _statements.snapshot(observer)
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(a["n"]):
            producer.put(payload(i))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    counts = _statements.delta(before, _statements.snapshot(observer))
    return {"wall_s": wall, "cpu_s": cpu, "n": a["n"], "statements": counts}


def put_many(a: dict) -> dict:
    observer = _observer(a)
    with Producer(a["queue"], _config(a), ring=a.get("ring", False)) as producer:
        producer.put(payload(-1))
        chunk = a["chunk"]
        before = _statements.snapshot(observer)
        t0, c0 = time.perf_counter(), time.process_time()
        for start in range(0, a["n"], chunk):
            producer.put_many([payload(i) for i in range(start, min(a["n"], start + chunk))])
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    counts = _statements.delta(before, _statements.snapshot(observer))
    return {"wall_s": wall, "cpu_s": cpu, "n": a["n"], "statements": counts}


def paced(a: dict) -> dict:
    """Offer `rate` jobs/s for `duration_s`: put() per job, put_many() of what fell behind.

    Every id is written with the wall time its COMMIT returned: the start of its latency.
    """
    rate, duration, tick = a["rate"], a["duration_s"], a.get("tick_s", 0.0)
    ids, commits = [], []
    with Producer(a["queue"], _config(a), ring=a.get("ring", True)) as producer:
        producer.put({"warmup": True})
        ids.append(-1)  # the warm-up job is not measured
        commits.append(0.0)
        # A long-lived producer holds the queue's bell all along, so idle watchers wait on the
        # bell, not in a SLEEP of up to wakeup.poll_max_s; let the watcher get there before the
        # clock starts (pick-up from a cold SLEEP is benchmarks/wakeup.py's subject).
        time.sleep(a.get("settle_s", 0.0))
        start = time.perf_counter()
        sent = 0
        next_tick = 0.0
        while True:
            elapsed = time.perf_counter() - start
            if elapsed >= duration:
                break
            due = min(int(rate * elapsed) + 1, int(rate * duration)) - sent
            if due <= 0 or elapsed < next_tick:
                # Commit what is due once per tick (like `notifyq produce` batching its input):
                # one job -> put(), more -> put_many(); latency counts from the COMMIT either way.
                # (Until this was checked, a producer whose commit took longer than 1/rate
                # committed 1-2 jobs at a time back to back, never waiting for the tick.)
                time.sleep(max(next_tick - elapsed, (sent + 1) / rate - elapsed, 0.0005))
                continue
            next_tick = elapsed + tick
            due = min(due, 100)
            if due == 1:
                new = [producer.put(payload(sent))]
            else:
                new = producer.put_many([payload(sent + i) for i in range(due)])
            now = time.time()
            ids += new
            commits += [now] * len(new)
            sent += len(new)
    with open(a["out"], "w") as f:
        json.dump({"ids": ids[1:], "commits": commits[1:]}, f)
    return {"n": sent, "wall_s": time.perf_counter() - start}


def _handler_reads(cur) -> int:
    cur.execute("SHOW SESSION STATUS WHERE Variable_name IN ('Handler_read_next', 'Handler_read_key')")
    return sum(int(v) for _, v in cur.fetchall())


def claims(a: dict) -> dict:
    """Time queries.claim (and queries.ack) against a standing backlog, plus index reads per claim
    (Handler_read_key + Handler_read_next of the claim alone: flat means index-bound)."""
    cfg = _config(a)
    session = Session(cfg.dsn, name="bench")
    owner = "bench" + os.urandom(6).hex()
    claim_s, ack_s, sizes = [], [], []
    raw, raw_cur = _floor.connect(a["conn"])
    reads = 0
    for _ in range(a["m"]):
        reads0 = _handler_reads(session.cursor())
        t0 = time.perf_counter()
        claim = queries.claim(session, a["queue"], owner, a["batch"], 300.0)
        t1 = time.perf_counter()
        reads += _handler_reads(session.cursor()) - reads0
        queries.ack(session, [j.id for j in claim.jobs], claim.token, False)
        claim_s.append(t1 - t0)
        ack_s.append(time.perf_counter() - t1)
        sizes.append(len(claim.jobs))
        _floor.refill(raw, raw_cur, a["queue"], a["batch"])
    session.close()
    raw.close()
    return {"claim_s": claim_s, "ack_s": ack_s, "sizes": sizes, "index_reads_per_claim": reads / a["m"]}


ROLES = {"put": put, "put_many": put_many, "paced": paced, "claims": claims}

if __name__ == "__main__":
    result = ROLES[sys.argv[1]](json.loads(sys.argv[2]))
    print(json.dumps({"pid": os.getpid(), **result}), flush=True)
