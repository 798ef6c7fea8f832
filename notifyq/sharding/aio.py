"""notifyq.AsyncProducer: the asyncio producer over the sharding layer's Producer.

On one server it is the one-server AsyncProducer as it is; with [shards] each of its sessions'
producers places jobs as notifyq.Producer does (a queue's shard, or dealt over a spread queue's).
"""

from __future__ import annotations

from typing import Any

from notifyq.produce import aio
from notifyq.sharding.producer import Producer


class AsyncProducer(aio.AsyncProducer):
    """Put jobs on `queue` from coroutines (FastAPI, aiohttp, ...): `await producer.put(...)`.

        producer = notifyq.AsyncProducer("emails", notifyq.load_config())
        job_id = await producer.put({"to": "a@example.com"})
        await producer.close()  # at shutdown

    The methods are Producer's, awaited; the database work runs on threads of the producer's
    own, so the event loop never blocks on it. `sessions` threads (and database sessions) carry
    the puts; one is enough for an app whose puts are a small part of its work, more raise the
    rate of many concurrent puts. With `ring=True` (the default) the first session's producer
    rings the queue's bell, and wakes the consumers after the others' puts. `conn=` takes a
    *synchronous* DB-API connection, used from the pool's thread: most async apps enqueue
    without it. A put cancelled while its thread runs it still completes (a statement cannot be
    taken back half-sent): the job may be stored although the awaiting coroutine never saw its
    id. With `[shards]`, each session's producer places jobs as `notifyq.Producer` does.
    """
    producer_class = Producer

    async def result(self, job_id: int, *, wait: float = 0.0, shard: str | None = None) -> Any:
        """The return value of job `job_id`'s handler: `Producer.result`, awaited (same errors).

        The wait is the event loop's: the looks at the job are the
        producer's poller's, on its own thread and session, shared by every wait of this
        producer on that server, and the coroutine awaits what it finds,
        so a long wait holds no thread and a cancelled one stops at once. `shard`: with
        [shards], the shard a spread queue's job is on (job ids are per shard)."""
        # The shard's server: the queue's, or `shard` for a spread queue's job (Producer.result_dsn:
        # no lock taken on the event loop).
        return await self.result_from(self._producers[0].result_dsn(shard), job_id, wait=wait)
