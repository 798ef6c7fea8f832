"""notifyq.AsyncProducer: the asyncio producer over the sharding layer's Producer.

On one server it is the one-server AsyncProducer as it is; with [shards] each of its sessions'
producers places jobs as notifyq.Producer does (a queue's shard, or dealt over a spread queue's).
"""

from __future__ import annotations

from notifyq.produce import aio
from notifyq.sharding.producer import Producer


class AsyncProducer(aio.AsyncProducer):
    __doc__ = aio.AsyncProducer.__doc__
    producer_class = Producer
