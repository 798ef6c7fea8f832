"""Advisory lock names: at most 64 characters, always including the database.

MySQL refuses names over 64 characters and compares them case-insensitively; MariaDB allows
192 bytes and is case-sensitive. Names here are lowercase ASCII and short on both, and a
database name is part of every one, so two notifyq databases on one server never collide.

A name that would be too long, or is not plain lowercase (queue `Q` and queue `q` are two
queues, but one lock on MySQL), becomes `nq:<kind>:<hash>:<database>`, cut at 64: the 96-bit
hash of (database, kind, key) keeps it unique, and the database stays readable in
`performance_schema.metadata_locks` / `information_schema.METADATA_LOCK_INFO`.
"""

from __future__ import annotations

import re

_PLAIN = re.compile(r"^[a-z0-9_.:-]+$")


def lock_name(database: str, kind: str, key: str = "") -> str:
    plain = f"nq:{database}:{kind}" + (f":{key}" if key else "")
    if len(plain) <= 64 and _PLAIN.match(plain):
        return plain
    import hashlib  # only for names that are not plain: loading it costs every process's start

    digest = hashlib.sha1(f"{database}\0{kind}\0{key}".encode()).hexdigest()[:24]
    return f"nq:{kind}:{digest}:{database}"[:64]


class QueueLocks:
    """The lock names one queue's consumers and producers share."""

    def __init__(self, database: str, queue: str):
        self.watch = lock_name(database, "watch", queue)  # held by the one idle consumer watching
        self.bells = (lock_name(database, "bell0", queue), lock_name(database, "bell1", queue))
        self.ringer = lock_name(database, "ringer", queue)  # the one producer that rings the bells
        self.periodic = lock_name(database, "cron", queue)  # the one consumer enqueuing cron ticks


def consumer_lock(database: str, consumer_id: str) -> str:
    return lock_name(database, "c", consumer_id)


def reaper_lock(database: str) -> str:
    return lock_name(database, "reaper")


def migrate_lock(database: str) -> str:
    return lock_name(database, "migrate")
