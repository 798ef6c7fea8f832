"""Consumer registration and liveness: the nq_consumer rows, the polling heartbeat, and the
reaper's questions (who is dead, who is stale). Taking a dead consumer's jobs back is in
queries.py (reclaim_owner, reclaim_expired).

A consumer is judged by what it has: a lock-mode consumer by its liveness lock (its session
holds it; free means the session is gone), a polling consumer by its heartbeat (no lock was
ever taken: IS_FREE_LOCK would call it dead while it runs).

Advisory locks are local to one server. On a Galera cluster a consumer records the server its
lock lives on (`node`), a reaper judges by the lock only the consumers whose lock lives on its
own server, and the others by their heartbeat, which lock-mode consumers on a Galera node beat
as polling ones do (consume/heartbeat.py). The SQL compares `node` with the reaper session's own
CONCAT(@@hostname, ':', @@port) (db.NODE_IDENTITY_SQL), so no query needs to be told its server.
On a Galera node even the reaper that shares the consumer's node takes a free lock for death only
once the heartbeat is silent too (queries.GALERA_LOCK_GRACE_S): a node that leaves the primary
component and comes back breaks its clients' connections, and frees the locks of processes alive
and reconnecting.
"""

from __future__ import annotations

from notifyq.store import queries
from notifyq.store.db import Session
from notifyq.store.sql import QUERIES as Q


def register_consumer(session: Session, consumer_id: str, lock_name: str, host: str, pid: int,
                      queues: list[str], wakeup: str, node: str = "") -> None:
    """node: the server the liveness lock lives on (the lock session's Session.node)."""
    def body(cur):
        for queue in queues:
            queries.ensure_queue(cur, queue)
        cur.execute(Q["register_consumer"], {
            "id": consumer_id, "lock_name": lock_name, "host": host[:255], "pid": pid,
            "queues": ",".join(queues)[:1024], "wakeup": wakeup,
            "node": node[:320]})

    session.run(body, what="register consumer")


def touch_consumer(session: Session, consumer_id: str, wakeup: str) -> None:
    session.run(lambda cur: cur.execute(Q["touch_consumer"], {"id": consumer_id, "wakeup": wakeup}),
                what="touch consumer")


def unregister_consumer(session: Session, consumer_id: str) -> None:
    session.run(lambda cur: cur.execute(Q["unregister_consumer"], {"id": consumer_id}),
                what="unregister consumer")


def heartbeat(session: Session, consumer_id: str, wakeup: str) -> bool:
    """A polling consumer's beat: its row's last_seen (no lease: heartbeat.py says why). False
    when the row is gone (a reaper judged it dead): the worker must re-register."""
    def body(cur) -> bool:
        cur.execute(Q["heartbeat"], {"id": consumer_id, "wakeup": wakeup})
        if cur.rowcount == 0 and not _row_exists(cur, consumer_id):
            return False  # (rowcount is 0 as well when last_seen did not change)
        return True

    return session.run(body, what="heartbeat")


def _row_exists(cur, consumer_id: str) -> bool:
    cur.execute(Q["consumer_exists"], {"id": consumer_id})
    return cur.fetchone() is not None


def reap_needed(session: Session) -> int:
    return int(queries.one_value(session, "reap_needed", {"stale_us": queries.microseconds(queries.POLLING_STALE_S)},
                         "reap check") or 0)


def dead_consumers(session: Session, restart_grace_s: float = 0.0) -> list[tuple[str, str, list[str]]]:
    """Lock-mode consumers whose liveness lock is free: (id, lock name, queues). On a server that
    started less than restart_grace_s ago, only those that talked to it since."""
    def body(cur):
        cur.execute(Q["dead_consumers"], {"grace_us": queries.lock_grace_us(session),
                                          "up_us": queries.restarted_us(session, restart_grace_s)})
        return [(cid, lock, _queues(queues)) for cid, lock, queues in cur.fetchall()]

    return session.run(body, what="find dead consumers")


def stale_consumers(session: Session, restart_grace_s: float = 0.0) -> list[tuple[str, list[str]]]:
    """Polling consumers whose heartbeat stopped: (id, queues). restart_grace_s: as in dead_consumers."""
    def body(cur):
        cur.execute(Q["stale_consumers"], {"stale_us": queries.microseconds(queries.POLLING_STALE_S),
                                           "up_us": queries.restarted_us(session, restart_grace_s)})
        return [(cid, _queues(queues)) for cid, queues in cur.fetchall()]

    return session.run(body, what="find stale consumers")


def _queues(text: str) -> list[str]:
    return [q for q in text.split(",") if q]
