#!/usr/bin/env python3
"""Async put: AsyncProducer (a thread pool over mysqlclient, each thread a Producer of its own)
against sync puts and a native async driver (aiomysql), and how long each holds the event loop.

    .venv/bin/python benchmarks/async_put.py [--dsn mysql://root@host:port/] [--puts 2000] [--json out.json]

Without --dsn it starts a private throwaway MariaDB (notifyq.localserver). Every case puts the
same small payload on a fresh queue of one database; a ticker coroutine sleeps 1 ms in a loop
and records how late it wakes (the loop lag) while 100 coroutines put.

  sync             one Producer, puts one after another, no event loop (the ceiling of one session)
  sync in async    100 coroutines calling Producer.put() directly: what issue 28 measured
  AsyncProducer/N  100 coroutines awaiting AsyncProducer(sessions=N).put()
  aiomysql/N       100 coroutines over an aiomysql pool of N: the job INSERT, the signal bump
                   and COMMIT per put, i.e. a native put's statements without notifyq's checks
                   (dedup keys, packet limits, OutcomeUnknown, reconnects, rings): its floor.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import notifyq  # noqa: E402
from notifyq import config as config_mod  # noqa: E402
from notifyq.config.dsn import DSN  # noqa: E402
from notifyq.store import schema  # noqa: E402

COROUTINES = 100
PAYLOAD = {"to": "someone@example.com", "template": "welcome", "n": 0}


@dataclasses.dataclass
class Row:
    case: str
    puts: int
    seconds: float
    max_lag_ms: float | None

    @property
    def rate(self) -> float:
        return self.puts / self.seconds


async def _with_ticker(work) -> tuple[float, float]:
    """Run `work()` while a 1 ms ticker measures the loop's lag: (seconds, max lag in ms)."""
    lag = 0.0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal lag
        while not done.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lag = max(lag, time.perf_counter() - t0 - 0.001)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    t0 = time.perf_counter()
    await work()
    seconds = time.perf_counter() - t0
    done.set()
    await tick
    return seconds, lag * 1000


def _split(puts: int) -> list[int]:
    return [puts // COROUTINES + (1 if c < puts % COROUTINES else 0) for c in range(COROUTINES)]


def sync_case(cfg, puts: int) -> Row:
    with notifyq.Producer("b_sync", cfg, ring=True) as producer:
        producer.put(PAYLOAD)
        t0 = time.perf_counter()
        for _ in range(puts):
            producer.put(PAYLOAD)
        return Row("sync (one Producer, no loop)", puts, time.perf_counter() - t0, None)


def sync_in_async_case(cfg, puts: int) -> Row:
    async def main() -> Row:
        with notifyq.Producer("b_blocking", cfg, ring=True) as producer:
            producer.put(PAYLOAD)

            async def one(n: int) -> None:
                for _ in range(n):
                    producer.put(PAYLOAD)  # blocks the loop for the whole statement
                    await asyncio.sleep(0)

            async def work() -> None:
                await asyncio.gather(*(one(n) for n in _split(puts)))
            seconds, lag = await _with_ticker(work)
        return Row("sync put() in 100 coroutines", puts, seconds, lag)
    return asyncio.run(main())


def async_producer_case(cfg, puts: int, sessions: int, ring: bool = True) -> Row:
    async def main() -> Row:
        async with notifyq.AsyncProducer(f"b_async{sessions}{ring}", cfg, sessions=sessions, ring=ring) as producer:
            await asyncio.gather(*(producer.put(PAYLOAD) for _ in range(sessions * 2)))  # connect

            async def one(n: int) -> None:
                for _ in range(n):
                    await producer.put(PAYLOAD)

            async def work() -> None:
                await asyncio.gather(*(one(n) for n in _split(puts)))
            seconds, lag = await _with_ticker(work)
        return Row(f"AsyncProducer sessions={sessions}" + ("" if ring else " ring=False"), puts, seconds, lag)
    return asyncio.run(main())


def aiomysql_case(dsn: DSN, puts: int, size: int) -> Row | None:
    try:
        import aiomysql
    except ImportError:
        print("aiomysql is not installed: its rows are left out (pip install aiomysql)", file=sys.stderr)
        return None
    text = json.dumps(PAYLOAD, separators=(",", ":"))
    queue = f"b_aiomysql{size}"

    async def main() -> Row:
        args = {"user": dsn.user, "password": dsn.password or "", "db": dsn.database, "autocommit": False}
        if dsn.unix_socket:
            args["unix_socket"] = dsn.unix_socket
        else:
            args["host"], args["port"] = dsn.host, dsn.port
        pool = await aiomysql.create_pool(minsize=size, maxsize=size, **args)

        async def put() -> int:
            async with pool.acquire() as conn:
                async with conn.cursor() as cur:
                    await cur.execute(
                        "INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload, created_at) "
                        "VALUES (%s, 0, 0, UTC_TIMESTAMP(6), 5, %s, UTC_TIMESTAMP(6))", (queue, text))
                    job_id = cur.lastrowid
                    await cur.execute("INSERT INTO nq_signal (queue, slot, seq) VALUES (%s, %s, 1) "
                                      "ON DUPLICATE KEY UPDATE seq = seq + 1", (queue, random.randrange(16)))
                await conn.commit()
                return job_id

        await asyncio.gather(*(put() for _ in range(size * 2)))

        async def one(n: int) -> None:
            for _ in range(n):
                await put()

        async def work() -> None:
            await asyncio.gather(*(one(n) for n in _split(puts)))
        seconds, lag = await _with_ticker(work)
        pool.close()
        await pool.wait_closed()
        return Row(f"aiomysql pool={size} (statements only)", puts, seconds, lag)
    return asyncio.run(main())


def run(dsn_url: str, puts: int) -> list[Row]:
    root = DSN.parse(dsn_url)
    dsn = dataclasses.replace(root, database=f"nq_async_bench_{random.randrange(1 << 30):x}")
    schema.init(dsn)
    url = f"mysql://{dsn.user}@{dsn.host}:{dsn.port}/{dsn.database}" + (
        f"?unix_socket={dsn.unix_socket}" if dsn.unix_socket else "")
    env = {"NOTIFYQ_CONFIG": "/dev/null", **({"NOTIFYQ_PASSWORD": dsn.password} if dsn.password else {})}
    cfg = config_mod.load(env=env, overrides={"dsn": url})
    rows: list[Row] = []
    try:
        rows.append(sync_case(cfg, puts))
        rows.append(sync_in_async_case(cfg, puts))
        for sessions in (1, 4):
            rows.append(async_producer_case(cfg, puts, sessions))
        rows.append(async_producer_case(cfg, puts, 4, ring=False))
        for size in (1, 4):
            row = aiomysql_case(dsn, puts, size)
            if row is not None:
                rows.append(row)
    finally:
        import MySQLdb
        args = root.connect_args()
        args.pop("database", None)
        conn = MySQLdb.connect(**args)
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{dsn.database}`")
        conn.close()
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", help="a root-like account (default: a private throwaway MariaDB)")
    ap.add_argument("--puts", type=int, default=2000, help="puts per case (default 2000)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON here")
    a = ap.parse_args(argv)
    if a.dsn:
        rows = run(a.dsn, a.puts)
    else:
        from notifyq.run.localserver import LocalServer

        with tempfile.TemporaryDirectory(prefix="nq-async-bench-") as tmp, LocalServer(Path(tmp)) as server:
            rows = run(server.dsn, a.puts)
    print(f"{'case':<40} {'puts/s':>9} {'max loop lag':>13}")
    for r in rows:
        lag = "-" if r.max_lag_ms is None else f"{r.max_lag_ms:.1f} ms"
        print(f"{r.case:<40} {r.rate:>9.0f} {lag:>13}")
    doc = [{"case": r.case, "puts": r.puts, "seconds": round(r.seconds, 3), "puts_per_s": round(r.rate, 1),
            "max_loop_lag_ms": None if r.max_lag_ms is None else round(r.max_lag_ms, 2)} for r in rows]
    print(json.dumps(doc))
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
