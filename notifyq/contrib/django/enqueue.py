"""Jobs enqueued in the request's transaction, consumers woken when it commits, and the
connection hygiene a handler needs in a long-lived worker."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from django.db import close_old_connections, connections, transaction

from notifyq.contrib.django.conf import database_alias, get_config
from notifyq.produce.producer import Producer

_producers: dict[tuple, Producer] = {}  # (pid, alias, database, queue) -> the process's producer
_lock = threading.Lock()


def get_producer(queue: str, using: str | None = None) -> Producer:
    """The process's Producer of `queue` for Django's database `using` (shared by its threads):
    its own sessions only ring the queue's bell; puts go through Django's connection."""
    alias = using or database_alias()
    key = (os.getpid(), alias, connections[alias].settings_dict.get("NAME"), queue)
    with _lock:
        producer = _producers.get(key)
        if producer is None:
            producer = _producers[key] = Producer(queue, get_config(alias), ring=True)
        return producer


def enqueue_on_commit(queue: str, payload: Any, *, using: str | None = None, **options: Any) -> int:
    """Put a job on Django's connection `using`, in its current transaction (atomic(), a
    savepoint, or autocommit: then at once), and wake the consumers when that transaction
    commits. The job is gone if the transaction rolls back. Returns its id; `options` are
    Producer.put's (priority, delay, run_at, max_attempts, dedup_key, key)."""
    alias = using or database_alias()
    producer = get_producer(queue, alias)
    job_id = producer.put(payload, conn=connections[alias], **options)
    transaction.on_commit(producer.wake, using=alias)
    return job_id


def enqueue_many_on_commit(queue: str, payloads: Iterable[Any], *, using: str | None = None,
                           **options: Any) -> list[int]:
    """enqueue_on_commit for many jobs: Producer.put_many in the current transaction (its
    options: priority, delay, run_at, max_attempts, key)."""
    alias = using or database_alias()
    producer = get_producer(queue, alias)
    ids = producer.put_many(payloads, conn=connections[alias], **options)
    transaction.on_commit(producer.wake, using=alias)
    return ids


@contextlib.contextmanager
def job_hygiene() -> Iterator[None]:
    """What Django does around a request, around a job: connections past CONN_MAX_AGE, or
    broken (a server that dropped an idle one: 2006), are closed before and after it; and
    before it, a connection kept open is pinged (see _close_dropped)."""
    close_old_connections()
    _close_dropped()
    try:
        yield
    finally:
        close_old_connections()


def _close_dropped() -> None:
    """close_old_connections() keeps a connection younger than CONN_MAX_AGE (None: for ever)
    without asking the server about it, so one that sat idle between jobs past the server's
    wait_timeout, which the server has closed, failed the next job's first query with 2006
    ("server has gone away"). A request is short, a consumer's idle gaps are not: ping each
    connection this thread keeps open (one round trip a job, only where connections persist;
    CONN_HEALTH_CHECKS does the same per request) and close the dead ones, so the job's first
    query opens a new one."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.in_atomic_block and not conn.is_usable():
            conn.close()
