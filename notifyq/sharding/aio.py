"""notifyq.AsyncProducer: the asyncio producer over the sharding layer's Producer.

On one server it is the one-server AsyncProducer as it is; with [shards] each of its sessions'
producers places jobs as notifyq.Producer does (a queue's shard, or dealt over a spread queue's).
"""

from __future__ import annotations

from typing import Any

from notifyq import shards
from notifyq.config import Config
from notifyq.produce import aio
from notifyq.sharding.producer import Producer


class AsyncProducer(aio.AsyncProducer):
    __doc__ = aio.AsyncProducer.__doc__
    producer_class = Producer

    @staticmethod
    def first_wakes_all(queue: str, config: Config) -> bool:
        """A spread queue's puts land on every shard, the first session's bells on those it put
        on: each session's put wakes its own shard's consumers (its COMMIT's instant wake)."""
        return not shards.Placement(config).spread(queue)

    def result_dsn(self, shard: str | None) -> Any:
        """The server of the shard that holds the job: the queue's, or `shard` for a spread
        queue's job (ShardedProducer.result_dsn: no lock taken on the event loop)."""
        if not self.config.shards:
            return super().result_dsn(shard)
        return self._producers[0].result_dsn(shard)
