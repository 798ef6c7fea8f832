"""Sharding: several independent servers ([shards]) as one deployment, composed of the
single-server parts. Placement (placement.py) says which shard holds a queue, or that a
queue is spread over all of them; this part composes one-server producers into one that places
each job (producer.py; its asyncio face, aio.py), one-server consumers into one service
(service.py), and one-server reads into answers from every server, the down ones named
(servers.py: the one-shot commands, the status pages, the depth gauges; status.py: `notifyq
status`). The one-server modules know nothing of shards.
"""
