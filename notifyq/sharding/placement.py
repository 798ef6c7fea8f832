"""Placement: which shard holds a queue, and which shard takes a job of a spread queue.

A queue lives on the shard its config names (`[queue.X] shard = "a"`), else on the shard its
name hashes to. The hash is rendezvous hashing (highest random weight): every shard scores
the queue name and the highest score wins. It depends on the shard names only, not their order,
and adding a shard moves only the queues the new shard outscores (about 1/N of them), each to
the new shard, none between the old ones. A spread queue (`spread = true`) lives on every shard:
a job with a dedup key goes to the shard its key hashes to (so uniqueness holds per key), the
others round-robin per producer, starting at a random shard (many one-shot producers that put
one job each must not all land on the first shard).
"""

from __future__ import annotations

import random

from notifyq.config import Config

SINGLE = ""  # the one shard's name when there is no [shards]: `dsn`


def _score(shard: str, key: str) -> bytes:
    import hashlib  # here, not at the top: only [shards] hash, and loading OpenSSL's hashes is
    # a tenth of a consumer's imports (every process imports this module)

    return hashlib.blake2b(f"{shard}\0{key}".encode(), digest_size=8).digest()


def pick(names: tuple[str, ...], key: str) -> str:
    """The shard among `names` that `key` hashes to (rendezvous: the highest score wins)."""
    return max(names, key=lambda name: (_score(name, key), name))


class Placement:
    def __init__(self, config: Config):
        self.config = config
        self.names = config.shard_names()

    def spread(self, queue: str) -> bool:
        return bool(self.config.shards) and self.config.queue(queue).spread

    def home(self, queue: str) -> str:
        """The one shard of a queue that is not spread (a spread queue's periodic ticks go here too)."""
        if not self.config.shards:
            return SINGLE
        return self.config.queue(queue).shard or pick(self.names, f"queue\0{queue}")

    def shards_of(self, queue: str) -> tuple[str, ...]:
        """Every shard that may hold jobs of `queue`: where its consumers claim."""
        return self.names if self.spread(queue) else (self.home(queue),)

    def for_key(self, queue: str, key: str) -> str:
        """The shard of a job with this key (or dedup key): the same key always goes to the same
        shard."""
        return pick(self.names, f"{queue}\0{key}") if self.spread(queue) else self.home(queue)


class RoundRobin:
    """One producer's turn over the shards of a spread queue."""

    def __init__(self, names: tuple[str, ...], start: int | None = None):
        self.names = names
        self._next = random.randrange(len(names)) if start is None else start % len(names)

    def take(self, n: int, among: tuple[str, ...] | None = None) -> list[str]:
        """The shards of the next `n` jobs, in turn; `among`: only those (the others are down)."""
        names = among or self.names
        out = [names[(self._next + i) % len(names)] for i in range(n)]
        self._next = (self._next + n) % len(names)
        return out
