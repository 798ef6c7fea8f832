"""Sharding: several independent servers ([shards]) as one deployment, composed of the
single-server parts. Placement (notifyq/shards.py) says which shard holds a queue, or that a
queue is spread over all of them; this part composes one-server producers into one that places
each job (producer.py). The one-server modules know nothing of shards.
"""
