"""notifyq.AsyncProducer (issue 28, item 2): awaited puts that store what they return, and an
event loop that keeps turning while a hundred coroutines put."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import notifyq
from notifyq import errors

COROUTINES = 100
PUTS = 5


def test_every_id_an_awaited_put_returns_is_stored_with_its_payload(db):
    # Given an AsyncProducer with two sessions
    async def main() -> dict[int, str]:
        async with notifyq.AsyncProducer("aq", db.config(), sessions=2) as producer:
            # When 100 coroutines put 5 jobs each, and one put_many of three
            async def worker(c: int) -> list[tuple[int, str]]:
                out = []
                for i in range(PUTS):
                    out.append((await producer.put({"p": f"{c}-{i}"}), f"{c}-{i}"))
                return out
            results = await asyncio.gather(*(worker(c) for c in range(COROUTINES)))
            many = await producer.put_many(({"p": f"m-{i}"} for i in range(3)))
        return {**{i: p for r in results for i, p in r}, **{i: f"m-{n}" for n, i in enumerate(many)}}

    returned = asyncio.run(main())
    # Then every returned id is stored, with the payload of the put that returned it
    stored = {i: json.loads(p)["p"] for i, p in db.query("SELECT id, payload FROM nq_job WHERE queue = 'aq'")}
    assert len(returned) == COROUTINES * PUTS + 3
    assert stored == returned


def test_the_event_loop_keeps_turning_while_coroutines_put(db):
    # Given a ticker that measures how late the loop wakes it
    async def main() -> tuple[float, int]:
        lag = 0.0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal lag
            while not done.is_set():
                t0 = time.perf_counter()
                await asyncio.sleep(0.001)
                lag = max(lag, time.perf_counter() - t0 - 0.001)

        async with notifyq.AsyncProducer("lag", db.config()) as producer:
            await producer.put({"warm": 1})  # connects: not what is measured
            tick = asyncio.create_task(ticker())
            # When 100 coroutines put 5 jobs each
            await asyncio.gather(*(producer.put({"c": c, "i": i}) for c in range(COROUTINES) for i in range(PUTS)))
            done.set()
            await tick
        return lag, db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = 'lag'")

    lag, count = asyncio.run(main())
    # Then every job is stored, and the loop was never held for as long as a put takes in a row
    assert count == COROUTINES * PUTS + 1
    assert lag < 0.25, f"event loop held for {lag * 1000:.0f} ms"


def test_bad_arguments_raise_input_errors_and_a_closed_producer_refuses(db):
    async def main() -> None:
        producer = notifyq.AsyncProducer("bad", db.config())
        with pytest.raises(errors.InputError, match="payload is not JSON"):
            await producer.put({"x": object()})
        with pytest.raises(errors.InputError, match="expected a list"):
            await producer.put_many("abc")
        await producer.close()
        with pytest.raises(errors.InputError, match="closed"):
            await producer.put({"x": 1})

    asyncio.run(main())
    with pytest.raises(errors.InputError, match="invalid queue name"):
        notifyq.AsyncProducer("no spaces", db.config())
