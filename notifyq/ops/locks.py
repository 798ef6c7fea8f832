"""`notifyq status --locks`: notifyq's advisory locks, who holds and who waits on each, in
notifyq's own words (watcher, bell, ringer, periodic leader, liveness of consumer X).

The server's view (store/metadata_locks.py) names locks and connections; this module knows which
lock is which (their names are computed, store/locks.py, never parsed back) and names a
connection by the consumer whose liveness lock it holds: that is its home session, which also
watches the consumer's first queue (consume/presence.py). Another session of the same process is
shown by its connection and client host only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from notifyq.store import locks as names_of
from notifyq.store import metadata_locks
from notifyq.store.db import Session
from notifyq.store.metadata_locks import Reading

# A queue's locks: (kind, what the holder is, what a waiter is).
QUEUE_LOCKS = (
    ("watch", "watcher: the idle consumer that claims next", "idle consumers in line to watch"),
    ("bell0", "bell 0: held by the ringing producer", "the watcher, waiting for a ring"),
    ("bell1", "bell 1: held by the ringing producer", "the watcher, waiting for a ring"),
    ("ringer", "ringer: the producer that rings this queue's bells", "producers in line to ring"),
    ("cron", "periodic leader: enqueues this queue's ticks", "consumers in line to lead"),
)


@dataclass(frozen=True)
class Lock:
    """What one lock name is: its queue (None: the database's), kind, and meaning."""

    queue: str | None
    kind: str
    held: str
    waited: str
    consumer: str | None = None  # a liveness lock's consumer id


def read(session: Session, queues: list[str], consumers: list[dict[str, Any]]) -> dict[str, Any]:
    """describe() of these queues' and consumers' locks as the server shows them now (one read of
    performance_schema; never on the hot path: `status --locks`, the consumers page on request)."""
    known = known_locks(session.dsn.database, queues, consumers)
    return describe(known, metadata_locks.read(session, list(known)), consumers)


def known_locks(database: str, queues: list[str], consumers: list[dict[str, Any]]) -> dict[str, Lock]:
    """Every lock name notifyq uses on `database` for these queues and consumers (status's
    consumer entries: id, host, pid), by name."""
    out: dict[str, Lock] = {}
    for queue in queues:
        for kind, held, waited in QUEUE_LOCKS:
            out[names_of.lock_name(database, kind, queue)] = Lock(queue, kind, held, waited)
    for c in consumers:
        out[names_of.consumer_lock(database, c["id"])] = Lock(
            None, "liveness", f"liveness of consumer {_consumer(c)}", "a reaper or the consumer, taking it",
            consumer=c["id"])
    out[names_of.reaper_lock(database)] = Lock(None, "reaper", "reaper: a pass taking back the dead's jobs",
                                                "reapers in line")
    out[names_of.migrate_lock(database)] = Lock(None, "migrate", "schema init or upgrade running",
                                                 "processes waiting for the schema")
    return out


def describe(known: dict[str, Lock], reading: Reading, consumers: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON of `status --locks`: per queue and for the database, each lock held or waited
    on, its holder and its waiters; or, when the server cannot show them, why (`unavailable`)."""
    if reading.unavailable is not None:
        return {"unavailable": reading.unavailable, "queues": {}, "database": []}
    by_id = {c["id"]: c for c in consumers}
    who: dict[int, str] = {}  # connection -> the consumer whose liveness lock it holds
    for row in reading.rows:
        lock = known.get(row.name)
        if lock and lock.consumer and row.granted and row.connection is not None:
            who[row.connection] = f"consumer {_consumer(by_id[lock.consumer])}"
    entries: dict[str, dict[str, Any]] = {}
    for row in reading.rows:
        lock = known.get(row.name)
        if lock is None:
            continue
        entry = entries.setdefault(row.name, {
            "lock": lock.kind, "name": row.name, "queue": lock.queue, "held": lock.held,
            "waited": lock.waited, "holder": None, "waiting": []})
        party = {"connection": row.connection, "user": row.user, "host": row.host, "for_s": row.for_s,
                 "who": who.get(row.connection) if row.connection is not None else None}
        if row.granted:
            entry["holder"] = party
        else:
            entry["waiting"].append(party)
    out: dict[str, Any] = {"unavailable": None, "queues": {}, "database": []}
    for entry in entries.values():
        queue = entry.pop("queue")
        (out["queues"].setdefault(queue, []) if queue is not None else out["database"]).append(entry)
    return out


def render(data: dict[str, Any]) -> list[str]:
    """The lines `notifyq status --locks` prints after the table."""
    if data["unavailable"] is not None:
        return [f"locks: not shown: {data['unavailable']}"]
    lines = ["", "locks (performance_schema.metadata_locks):"]
    if not data["queues"] and not data["database"]:
        return [*lines, "  none held or waited on"]
    for queue, entries in sorted(data["queues"].items()):
        lines.append(f"  queue {queue}:")
        lines += [line for e in entries for line in _entry(e)]
    if data["database"]:
        lines.append("  this database:")
        lines += [line for e in data["database"] for line in _entry(e)]
    return lines


def _entry(e: dict[str, Any]) -> list[str]:
    holder = _party(e["holder"], e["held"]) if e["holder"] else "free"
    lines = [f"    {e['held']}: {holder}"]
    if e["waiting"]:
        lines.append(f"      waiting ({e['waited']}): "
                     + ", ".join(_party(p, e["held"]) + (f", waited {p['for_s']}s" if p["for_s"] is not None else "")
                                 for p in e["waiting"]))
    return lines


def _party(p: dict[str, Any], held: str) -> str:
    """A connection, and the consumer it is unless the lock's meaning names it already."""
    where = f"conn {p['connection']}" + (f" {p['user']}@{p['host']}" if p["user"] else "")
    named = p["who"] and p["who"].removeprefix("consumer ") not in held
    return where + (f" = {p['who']}" if named else "")


def _consumer(c: dict[str, Any]) -> str:
    return f"{c['id'][:12]} ({c['host']}:{c['pid']})"
