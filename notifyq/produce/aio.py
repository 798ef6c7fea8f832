"""AsyncProducer: `await put(...)` from asyncio code, over the thread-safe Producer.

A put runs on a small thread pool, each thread with a Producer (and so a session) of its own,
so the event loop never waits on the database: it only awaits a future. Why threads over
mysqlclient rather than an async driver: docs/asyncio.md (measured by benchmarks/async_put.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import functools
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from notifyq import errors
from notifyq.config import values
from notifyq.config import Config
from notifyq.produce.producer import Producer


class AsyncProducer:
    """The asyncio producer on one server: Producer's methods, awaited, on threads of its own.

    Users import it as `notifyq.AsyncProducer` (sharding/aio.py, which adds [shards]); its
    docstring there is the one the API reference renders, and says what this class does."""

    # Each session's producer: here the one-server Producer; notifyq.AsyncProducer (the sharding
    # layer's) puts through notifyq.Producer, which with [shards] places each job on its shard.
    producer_class: type = Producer

    def __init__(self, queue: str, config: Config, *, ring: bool = True, sessions: int = 1):
        self.queue = queue
        self.config = config
        self.sessions = values.number("sessions", sessions, lo=1, hi=64, integer=True)
        # Made now (queue name, config checked): a bad argument fails here, not in a thread later.
        self._producers = [self.producer_class(queue, config, ring=ring and i == 0) for i in range(self.sessions)]
        if ring:  # the first rings the queue's bell, and wakes the consumers after the others' puts
            for producer in self._producers[1:]:
                producer.leave_wake_to(self._producers[0])
        self._free = list(self._producers)  # producers no thread is using
        self._free_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pollers: list[Any] = []  # result()'s, one per server: made at its first wait there
        self._closed = False

    async def put(self, payload: Any, *, priority: int = 0, delay: float = 0, run_at: dt.datetime | None = None,
                  max_attempts: int | None = None, dedup_key: str | None = None, key: str | None = None,
                  dedup: str = "keep", conn: Any = None) -> int:
        """Put one job and return its id: `Producer.put`, awaited."""
        return await self._run("put", payload, priority=priority, delay=delay, run_at=run_at,
                               max_attempts=max_attempts, dedup_key=dedup_key, key=key, dedup=dedup, conn=conn)

    async def put_many(self, payloads: Iterable[Any], *, priority: int = 0, delay: float = 0,
                       run_at: dt.datetime | None = None, max_attempts: int | None = None,
                       key: str | None = None, conn: Any = None) -> list[int]:
        """Put many jobs in one transaction and return their ids: `Producer.put_many`, awaited."""
        if not isinstance(payloads, (list, tuple)):  # a generator must not be read on another thread
            if isinstance(payloads, (str, bytes, dict)) or not hasattr(payloads, "__iter__"):
                raise errors.InputError(f"payloads: expected a list of payloads, got {values.shown(payloads)}")
            payloads = list(payloads)
        return await self._run("put_many", payloads, priority=priority, delay=delay, run_at=run_at,
                               max_attempts=max_attempts, key=key, conn=conn)

    async def result(self, job_id: int, *, wait: float = 0.0) -> Any:
        """The return value of job `job_id`'s handler: `Producer.result`, awaited (same errors)."""
        return await self.result_from(self._producers[0].result_dsn(), job_id, wait=wait)

    async def result_from(self, dsn: Any, job_id: int, *, wait: float = 0.0) -> Any:
        """result(), read on the server at `dsn` (a composer's result() names the server holding
        the job through this). The wait is the event loop's: the looks at the job are the
        producer's poller's, on its own thread and session, shared by every wait of this
        producer on that server, and the coroutine awaits what it finds,
        so a long wait holds no thread and a cancelled one stops at once."""
        from notifyq.produce import results  # here: a producer that never asks need not load it

        if self._closed:
            raise errors.InputError("AsyncProducer is closed")
        poller = next((p for p in self._pollers if p.dsn == dsn), None)  # a DSN is not hashable
        if poller is None:
            poller = results.Poller(dsn, self._producers[0].retry)
            self._pollers.append(poller)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, wait)
        state: dict[str, Any] = {"looked": False, "outcome": None}
        changed = asyncio.Event()

        def on_loop(outcome: Any) -> None:
            state["looked"], state["outcome"] = True, outcome
            changed.set()

        def told(outcome: Any) -> None:  # on the poller's thread
            try:
                loop.call_soon_threadsafe(on_loop, outcome)
            except RuntimeError:  # the loop is closed: nobody awaits this any more
                pass

        looking = results.Wait(job_id, told)
        poller.add(looking)
        try:
            while state["outcome"] is None:
                left = deadline - loop.time()
                if state["looked"] and left <= 0:
                    raise errors.ResultPending(looking.pending)
                changed.clear()  # no await since the check: nothing was told meanwhile
                try:
                    # The first look comes whatever the wait
                    await asyncio.wait_for(changed.wait(), left if state["looked"] else None)
                except asyncio.TimeoutError:
                    pass
            return results.outcome_of(state["outcome"])
        finally:
            poller.remove(looking)

    async def close(self) -> None:
        """Close every session, after the puts under way (at the app's shutdown)."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.get_running_loop().run_in_executor(None, functools.partial(pool.shutdown, wait=True))
        for producer in self._producers:
            producer.close()

    async def __aenter__(self) -> "AsyncProducer":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise errors.InputError("AsyncProducer is closed")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.sessions, thread_name_prefix=f"notifyq-put-{self.queue}")
        loop = asyncio.get_running_loop()
        # In the caller's context, as asyncio.to_thread does: the put's span (notifyq.contrib.otel)
        # is then a child of the request's, and any context variable the app set is seen there.
        ctx = contextvars.copy_context()
        return await loop.run_in_executor(self._pool, ctx.run, functools.partial(self._call, method, args, kwargs))

    def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
        """On a pool thread: a free producer (there are as many as threads) does the put."""
        with self._free_lock:
            producer = self._free.pop()
        try:
            return getattr(producer, method)(*args, **kwargs)
        finally:
            with self._free_lock:
                self._free.append(producer)
