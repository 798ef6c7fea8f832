"""Which node of a Galera cluster a process writes through (a multi-host DSN).

A session connects to the first node of the list that answers and is ready (Synced, in the
primary component); all sessions of a process share which node that is (WriterChoice), so they
move together when it dies and stay on the new one when the old one comes back: one writer, no
certification conflicts between our own sessions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import MySQLdb

from notifyq.store.driver import is_connection_lost

if TYPE_CHECKING:
    from notifyq.config import DSN

log = logging.getLogger("notifyq.db")

# A writer node that is paused (SIGSTOP, a frozen VM, a network that drops
# packets) keeps its sockets open and answers nothing, so a session learns of it only from its
# own timeouts. Reads give up after FAILOVER_READ_TIMEOUT_S (above innodb_lock_wait_timeout, 10 s,
# and Galera's eviction stall of ~6.5 s, the longest a healthy node keeps a statement waiting),
# and a connect after FAILOVER_CONNECT_TIMEOUT_S (a paused node accepts the TCP connection but
# never greets): a session moves to the next ready node within about the sum of the two.
FAILOVER_READ_TIMEOUT_S = 12
FAILOVER_CONNECT_TIMEOUT_S = 4


class WriterChoice:
    """Which node of a multi-host DSN this process writes through: one per process and host list.

    Shared by every session of the process (a consumer has several, a reaper opens one per pass):
    a session that finds the writer gone moves the choice, and the others follow at their next
    connect instead of each walking the list from the top. Starting from the current choice, not
    from the first host, is what keeps a process from failing back on its own to a node that
    returned: it stays where it is until that node fails in turn. A session holding a lock it
    must keep (Session.follows_writer False) does not follow while its own connection works.
    This is the one piece of process-wide state in the store; it holds only an index.
    """

    _choices: dict[tuple[tuple[str, int], ...], "WriterChoice"] = {}
    _guard = threading.Lock()

    def __init__(self) -> None:
        self.index = 0
        self.chosen = False  # a session of this process has connected through `index`
        self.lock = threading.Lock()

    @classmethod
    def of(cls, dsn: DSN) -> "WriterChoice":
        with cls._guard:
            return cls._choices.setdefault(dsn.servers, cls())

    def order(self, count: int) -> list[int]:
        """Indexes to try: the current writer, then the list from the top."""
        first = self.index
        return [first] + [i for i in range(count) if i != first]


    def open(self, servers: list[tuple[str, int]], open_server: Callable[[int], MySQLdb.connections.Connection],
             session_name: str) -> tuple[int, MySQLdb.connections.Connection]:
        """Connect to the first node, in order(), that answers and is ready: (its index, the
        connection). Moves the choice there, with a line when it moved from another node."""
        last: MySQLdb.Error | None = None
        for index in self.order(len(servers)):
            try:
                conn = open_server(index)
            except MySQLdb.Error as e:
                if not is_connection_lost(e):
                    raise
                last = e
                continue
            with self.lock:
                if self.index != index and self.chosen:
                    old = servers[self.index]
                    log.warning("database writer node changed from=%s:%d to=%s:%d session=%s",
                                old[0], old[1], servers[index][0], servers[index][1], session_name)
                elif self.index != index:
                    log.info("database writer node host=%s:%d (the ones before it in the DSN are down "
                             "or not ready)", servers[index][0], servers[index][1])
                self.index, self.chosen = index, True
            return index, conn
        assert last is not None
        raise last


def ready_for_writes(wsrep: dict[str, str]) -> bool:
    """A Galera node that may take our writes: ready, Synced, in the primary component."""
    return (wsrep.get("wsrep_ready") == "ON" and wsrep.get("wsrep_local_state_comment") == "Synced"
            and wsrep.get("wsrep_cluster_status") == "Primary")
