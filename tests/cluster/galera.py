"""A throwaway MariaDB Galera cluster on loopback, for tests and experiments.

Every node (node.py) is a private mariadbd with its own datadir, socket and log under one temp
directory and its own four loopback ports, picked free at start, so the cluster never meets the
system server on 3306 nor another engineer's cluster. Node 1 bootstraps it (--wsrep-new-cluster);
the others join by SST (rsync). Every node lists all of them in wsrep_cluster_address, so any
single node can be killed and restarted, and rejoins by IST.

Used as a pytest fixture (tests/cluster/conftest.py) and from the command line, which holds a
cluster up until Ctrl-C and prints how to reach it: tests/cluster/galera.sh up
"""

from __future__ import annotations

import shutil
import socket
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Callable

import MySQLdb

from .node import (ClusterSettings, GaleraNode, NodePorts, RecoverFailed, find_provider, hand_over,
                   missing_requirements)

_POLL_S = 0.05  # poll interval inside deadline loops, not a synchronisation sleep


def reserve_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports. All are held at once so none is handed out twice;
    another process could still take one before mariadbd binds it (acceptable for tests)."""
    held = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


class NodeExited(RuntimeError):
    """A node's mariadbd exited while it was waited for."""


def wait_for(predicate: Callable[[], object], deadline: float, what: str,
             details: Callable[[], str] = lambda: "") -> object:
    """Poll `predicate` until it returns something true; RuntimeError at the monotonic `deadline`."""
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise RuntimeError(f"timed out waiting for {what} (last: {value!r}){details()}")
        time.sleep(_POLL_S)


class GaleraCluster:
    """`size` nodes on loopback under `basedir` (a new temp directory unless given)."""

    def __init__(self, size: int = 3, basedir: str | Path | None = None, **settings):
        missing = missing_requirements()
        if missing:
            raise RuntimeError(f"cannot run a Galera cluster: install {' '.join(missing)}")
        # A short path: unix socket paths must fit in 108 bytes, pytest's tmp_path often does not.
        # destroy() removes it, given or not.
        self.basedir = Path(basedir or tempfile.mkdtemp(prefix="nq-galera-")).resolve()
        ports = reserve_ports(4 * size)
        node_ports = [NodePorts(*ports[4 * i:4 * i + 4]) for i in range(size)]
        gcomm = "gcomm://" + ",".join(f"127.0.0.1:{p.galera}" for p in node_ports)
        # A unique name: a stray node of some other cluster that reached these ports is refused.
        self.settings = ClusterSettings(cluster_name=f"nq-{uuid.uuid4().hex[:10]}", provider=find_provider(),
                                        gcomm_address=gcomm, **settings)
        self.nodes = [GaleraNode(i + 1, self.basedir / f"node{i + 1}", p, self.settings)
                      for i, p in enumerate(node_ports)]

    def multi_host_dsn(self, user: str = "root", database: str = "") -> str:
        """Every node in one DSN, node 1 first: mysql://user@127.0.0.1:p1,127.0.0.1:p2,.../database"""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"mysql://{user}@{hosts}/{database}"

    def node(self, index: int) -> GaleraNode:
        return self.nodes[index - 1]

    def __enter__(self) -> "GaleraCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    # -- waiting -------------------------------------------------------------
    def _logs(self, nodes: list[GaleraNode]) -> str:
        return "".join(f"\n--- node {n.index} log tail ---\n{n.log_tail(15)}" for n in nodes)

    def wait_synced(self, nodes: list[GaleraNode] | None = None, cluster_size: int | None = None,
                    timeout: float = 60) -> None:
        """Until every one of `nodes` (default: all running, unpaused) is Synced in a primary
        component of `cluster_size` members (default: that many nodes)."""
        nodes = nodes if nodes is not None else self.members()
        size = cluster_size if cluster_size is not None else len(nodes)

        def all_synced():
            for n in nodes:
                if not n.is_running():
                    # The summary last as well: a CI log keeps the tail of a long failure.
                    raise NodeExited(f"node {n.index} exited with {n.exit_code}:\n{n.log_tail()}\n"
                                     f"(node {n.index} exited with {n.exit_code}; its log above)")
            return all(n.is_synced_member(size) for n in nodes)

        wait_for(all_synced, time.monotonic() + timeout,
                 f"nodes {[n.index for n in nodes]} Synced in a cluster of {size}",
                 lambda: self._logs(nodes))

    def members(self) -> list[GaleraNode]:
        """The nodes that run and are not paused: the ones expected in the primary component."""
        return [n for n in self.nodes if n.is_running() and not n.paused]

    def cluster_sizes(self) -> dict[int, int | None]:
        """{node index: wsrep_cluster_size it reports} (None: it does not answer)."""
        out = {}
        for n in self.nodes:
            st = n.wsrep_status()
            out[n.index] = int(st["wsrep_cluster_size"]) if st else None
        return out

    # -- lifecycle -----------------------------------------------------------
    def start(self, timeout: float = 180) -> None:
        """Bootstrap node 1, then join the others one by one (one SST at a time: a donor serves
        one joiner, a second would wait and retry)."""
        deadline = time.monotonic() + timeout
        try:
            first = self.nodes[0]
            first.datadir.mkdir(parents=True)
            hand_over(self.basedir)
            first.initialise(timeout=max(1.0, deadline - time.monotonic()))
            first.launch(bootstrap=True)
            self.wait_synced([first], 1, timeout=deadline - time.monotonic())
            self._grant_tcp_root(first)
            for i, node in enumerate(self.nodes[1:], start=2):
                node.basedir.mkdir(parents=True)
                node.launch()
                self.wait_synced(self.nodes[:i], i, timeout=deadline - time.monotonic())
        except BaseException:
            self.destroy()
            raise

    @staticmethod
    def _grant_tcp_root(node: GaleraNode) -> None:
        # mariadb-install-db only makes root@localhost (socket); tests connect over TCP with
        # --skip-name-resolve, so 127.0.0.1 needs its own account. Replicated to every joiner.
        conn = MySQLdb.connect(unix_socket=node.socket_path, user="root", passwd="", autocommit=True)
        try:
            cur = conn.cursor()
            cur.execute("CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'")
            cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION")
        finally:
            conn.close()

    def kill(self, index: int) -> None:
        self.node(index).kill()

    def restart(self, index: int, timeout: float = 90) -> None:
        """Start a node that was killed or stopped; it rejoins (by IST when the donor's gcache still
        holds what it missed) and this returns once every member is Synced again.

        Once in CI (three test workers starting servers at once) a restarted node failed right
        after its --wsrep-recover run had logged the position (the cut log did not show which of
        the two processes died, or how): not what the tests examine (how the cluster treats a node
        that rejoins), so a node whose recovery or start dies is started once more, and only a
        second death fails, saying both."""
        node = self.node(index)
        try:
            node.launch()
            self.wait_synced(timeout=timeout)
        except (NodeExited, RecoverFailed) as first:
            said = str(first).splitlines()[-1]
            print(f"restart of node {index}: {said}; starting it once more", file=sys.stderr)
            try:
                node.launch()
                self.wait_synced(timeout=timeout)
            except (NodeExited, RecoverFailed) as second:
                raise NodeExited(f"{second}\n(and before that: {said})") from None

    def pause(self, index: int) -> None:
        self.node(index).pause()

    def resume(self, index: int, timeout: float = 90) -> None:
        """SIGCONT a paused node and wait until it is a Synced member again."""
        self.node(index).resume()
        self.wait_synced(timeout=timeout)

    def heal(self, timeout: float = 90) -> None:
        """Back to every node running and Synced: resume paused nodes, restart dead ones.

        Needs a primary component to rejoin: after two of three nodes died, the survivor is
        non-Primary (1047 to every query) and only a new bootstrap helps; start a new cluster."""
        for node in self.nodes:
            if node.paused:
                node.resume()
            elif not node.is_running():
                node.launch()
        self.wait_synced(timeout=timeout)

    def destroy(self, timeout: float = 60) -> None:
        """Stop every node (SIGTERM, SIGKILL at the deadline) and remove all their files.

        One at a time: each leaver waits until the others acknowledge its leaving, and nodes
        leaving together do not answer each other, which costs an eviction timeout (~5 s).
        A node that does not finish its clean shutdown in time is killed with a warning, not a
        failure: its files go next, and how long the server takes to shut down on a loaded
        machine is not what any test here checks (once in CI a node stalled >30 s after its
        InnoDB threads had exited, failing a fault schedule whose history had passed)."""
        for node in reversed(self.nodes):
            try:
                node.stop(timeout)
            except RuntimeError as e:  # it was killed: go on, every node must be gone before the rmtree
                warnings.warn(str(e).splitlines()[0], stacklevel=2)
        shutil.rmtree(self.basedir, ignore_errors=True)
