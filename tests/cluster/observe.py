"""What Galera does to the things notifyq relies on, measured on this machine.

Starts a private single server (notifyq.run.localserver) and a 3-node cluster (galera.py), prints
one section per observation, and removes both:

    tests/cluster/galera.sh observe [--commits 300] [--kills 3] [--latency-only]

1. INSERT+COMMIT latency: single server vs one cluster node (same table, rounds interleaved so
   that the machine's load hits both alike), innodb_flush_log_at_trx_commit=1, then 2, on all.
2. GET_LOCK on node 1: what node 2 sees (IS_USED_LOCK, IS_FREE_LOCK, GET_LOCK).
3. What the clients of a SIGKILLed node get: idle session, running statement, open transaction,
   new connection.
4. How long the survivors' commits stall after a SIGKILL of another node (and a SIGSTOP, and a
   clean SIGTERM shutdown for comparison).
5. @@auto_increment_increment/offset of an already-open session before and after a node leaves,
   and after it rejoins.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import MySQLdb

from notifyq.run.localserver import LocalServer

from .galera import GaleraCluster, wait_for
from .node import GaleraNode

TABLE_DDL = ("CREATE TABLE IF NOT EXISTS nq_observe.t "
             "(id BIGINT AUTO_INCREMENT PRIMARY KEY, payload VARCHAR(200) NOT NULL)")


def section(title: str) -> None:
    print(f"\n## {title}", flush=True)


def prepare(conn) -> None:
    cur = conn.cursor()
    cur.execute("CREATE DATABASE IF NOT EXISTS nq_observe")
    cur.execute(TABLE_DDL)


def commit_latencies_us(conn, count: int) -> list[float]:
    """`count` single-row INSERT+COMMIT round trips, each timed on its own."""
    cur = conn.cursor()
    out = []
    for i in range(count):
        t = time.perf_counter()
        cur.execute("INSERT INTO nq_observe.t (payload) VALUES (%s)", (f"job {i}",))
        conn.commit()
        out.append((time.perf_counter() - t) * 1e6)
    return out


def summary_us(values: list[float]) -> str:
    q = statistics.quantiles(values, n=10)
    return f"n={len(values)} median={statistics.median(values):.0f} p10={q[0]:.0f} p90={q[-1]:.0f} µs"


def set_flush(conns, level: int) -> None:
    for conn in conns:
        conn.cursor().execute(f"SET GLOBAL innodb_flush_log_at_trx_commit = {level}")


def observe_latency(single: LocalServer, cluster: GaleraCluster, commits: int) -> None:
    conns = {"single server": MySQLdb.connect(host="127.0.0.1", port=single.port, user="root"),
             "cluster node 1": cluster.node(1).connect(autocommit=False)}
    # Every node writes each commit (node 1 as origin, the others when applying).
    flush_targets = [conns["single server"], *(n.connect() for n in cluster.nodes)]
    for conn in conns.values():
        prepare(conn)
        conn.autocommit(False)
        commit_latencies_us(conn, 20)  # warm-up: first pages, first connection buffers
    # 1: an fsync per commit (a single server's durability); 2: none, so what remains of the
    # difference is the replication round trip and certification alone.
    for flush in (1, 2):
        section(f"1. INSERT+COMMIT latency, {commits} each, innodb_flush_log_at_trx_commit={flush} everywhere")
        set_flush(flush_targets, flush)
        results: dict[str, list[float]] = {name: [] for name in conns}
        rounds = 6
        for _ in range(rounds):  # interleaved: a burst of load elsewhere on the machine hits both
            for name, conn in conns.items():
                results[name] += commit_latencies_us(conn, commits // rounds)
        for name, values in results.items():
            print(f"{name:15} {summary_us(values)}")
        extra = statistics.median(results["cluster node 1"]) - statistics.median(results["single server"])
        print(f"cluster - single: {extra:+.0f} µs per commit (medians)", flush=True)
    set_flush(flush_targets, 1)
    for conn in [*conns.values(), *flush_targets[1:]]:
        conn.close()


def scalar(conn, sql: str, args=None):
    cur = conn.cursor()
    cur.execute(sql, args)
    return cur.fetchone()[0]


def observe_get_lock(cluster: GaleraCluster) -> None:
    section("2. GET_LOCK on node 1, seen from node 2")
    n1, n2 = cluster.node(1).connect(), cluster.node(2).connect()
    print("node 1 GET_LOCK('nq_obs', 0)      =", scalar(n1, "SELECT GET_LOCK('nq_obs', 0)"))
    print("node 1 IS_USED_LOCK('nq_obs')     =", scalar(n1, "SELECT IS_USED_LOCK('nq_obs')"),
          f"(node 1 connection id {n1.thread_id()})")
    print("node 2 IS_USED_LOCK('nq_obs')     =", scalar(n2, "SELECT IS_USED_LOCK('nq_obs')"))
    print("node 2 IS_FREE_LOCK('nq_obs')     =", scalar(n2, "SELECT IS_FREE_LOCK('nq_obs')"))
    print("node 2 GET_LOCK('nq_obs', 0)      =", scalar(n2, "SELECT GET_LOCK('nq_obs', 0)"))
    print("node 1 IS_USED_LOCK after that    =", scalar(n1, "SELECT IS_USED_LOCK('nq_obs')"))
    n1.close()
    n2.close()


def error_of(action) -> str:
    try:
        action()
    except MySQLdb.Error as e:
        return f"{type(e).__name__} {e.args[0]}: {e.args[1]}"
    return "no error"


def observe_killed_node_clients(cluster: GaleraCluster) -> None:
    section("3. Clients of a SIGKILLed node (node 3)")
    node = cluster.node(3)
    idle = node.connect()
    in_trx = node.connect(autocommit=False)
    prepare(in_trx)
    in_trx.cursor().execute("INSERT INTO nq_observe.t (payload) VALUES ('uncommitted')")
    running = node.connect()
    running_id = running.thread_id()
    outcome: dict[str, str] = {}
    sleeper = threading.Thread(target=lambda: outcome.update(
        running=error_of(lambda: running.cursor().execute("SELECT SLEEP(60)"))))
    sleeper.start()
    watcher = node.connect()
    wait_for(lambda: scalar(watcher, "SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                                     "WHERE ID = %s AND INFO LIKE 'SELECT SLEEP%%'", (running_id,)),
             time.monotonic() + 10, "the SLEEP statement running on node 3")
    watcher.close()
    cluster.kill(3)
    sleeper.join(30)
    print("session inside SELECT SLEEP(60):", outcome.get("running", "still waiting after 30 s"))
    print("idle session, next SELECT 1:    ", error_of(lambda: idle.cursor().execute("SELECT 1")))
    print("open transaction, COMMIT:       ", error_of(in_trx.commit))
    print("new connection (TCP):           ", error_of(lambda: node.connect()))
    print("new connection (unix socket):   ",
          error_of(lambda: MySQLdb.connect(unix_socket=node.socket_path, user="root")))
    cluster.restart(3)


class CommitLoop(threading.Thread):
    """INSERT+COMMIT back to back on one node, recording (start, end, error) of each."""

    def __init__(self, node: GaleraNode):
        super().__init__(daemon=True)
        self.conn = node.connect(autocommit=False)
        self.stop = threading.Event()
        self.commits: list[tuple[float, float, str | None]] = []

    def run(self) -> None:
        cur = self.conn.cursor()
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                cur.execute("INSERT INTO nq_observe.t (payload) VALUES ('stall probe')")
                self.conn.commit()
                err = None
            except MySQLdb.Error as e:
                err = f"{e.args[0]}"
            self.commits.append((t, time.monotonic(), err))

    def longest_after(self, since: float) -> tuple[float, list[str]]:
        """Longest commit that was running at or started after `since`, and any errors."""
        spans = [(end - start, err) for start, end, err in self.commits if end >= since]
        return max(d for d, _ in spans), [e for _, e in spans if e]


def observe_stall(cluster: GaleraCluster, victim: int, how: str) -> None:
    survivors = [n for n in cluster.nodes if n.index != victim]
    loops = [CommitLoop(n) for n in survivors]
    for loop in loops:
        loop.start()
    wait_for(lambda: all(len(loop.commits) > 50 for loop in loops), time.monotonic() + 30, "commits flowing")
    t0 = time.monotonic()
    take_away = {"SIGKILL": cluster.kill, "SIGSTOP": cluster.pause, "SIGTERM": lambda i: cluster.node(i).stop()}
    take_away[how](victim)
    cluster.wait_synced(survivors, cluster_size=2, timeout=60)
    evicted = time.monotonic() - t0
    # Commits flow again once the view changed; a moment more shows they keep flowing.
    wait_for(lambda: all(loop.commits[-1][0] > t0 + evicted for loop in loops), time.monotonic() + 30,
             "commits flowing after the eviction")
    for loop in loops:
        loop.stop.set()
        loop.join(30)
    parts = []
    for node, loop in zip(survivors, loops):
        longest, errors = loop.longest_after(t0)
        parts.append(f"node {node.index} longest commit {longest:.2f} s, errors {errors or 'none'}")
        loop.conn.close()
    print(f"{how} node {victim}: both survivors Synced at size 2 after {evicted:.2f} s; " + "; ".join(parts),
          flush=True)
    t = time.monotonic()
    (cluster.resume if how == "SIGSTOP" else cluster.restart)(victim)
    print(f"   node {victim} back and Synced {time.monotonic() - t:.2f} s after "
          f"{'SIGCONT' if how == 'SIGSTOP' else 'restart'} (joined by {cluster.node(victim).last_join() or '-'})")


def observe_auto_increment(cluster: GaleraCluster) -> None:
    section("5. auto_increment settings of an already-open session on node 1")
    conn = cluster.node(1).connect()
    prepare(conn)

    def show(moment: str) -> None:
        cur = conn.cursor()
        cur.execute("SELECT @@session.auto_increment_increment, @@session.auto_increment_offset, "
                    "@@global.auto_increment_increment, @@global.auto_increment_offset")
        s_inc, s_off, g_inc, g_off = cur.fetchone()
        cur.execute("INSERT INTO nq_observe.t (payload) VALUES ('a'), ('b'), ('c')")
        first = cur.lastrowid
        cur.execute("SELECT id FROM nq_observe.t WHERE id >= %s ORDER BY id LIMIT 3", (first,))
        ids = [r[0] for r in cur.fetchall()]
        print(f"{moment:28} session increment/offset {s_inc}/{s_off}, global {g_inc}/{g_off}; "
              f"3-row INSERT got ids {ids}")

    show("3 nodes")
    cluster.kill(3)
    cluster.wait_synced([cluster.node(1), cluster.node(2)], cluster_size=2)
    show("node 3 killed, size 2")
    cluster.restart(3)
    show("node 3 rejoined, size 3")
    cluster.node(2).stop()
    cluster.wait_synced([cluster.node(1), cluster.node(3)], cluster_size=2)
    show("node 2 stopped cleanly")
    cluster.restart(2)
    show("node 2 rejoined")
    conn.close()


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="nq-obs-") as tmp, LocalServer(Path(tmp) / "single") as single:
        t = time.monotonic()
        with GaleraCluster(3) as cluster:
            print(f"cluster of 3 Synced in {time.monotonic() - t:.1f} s; single server on port {single.port}")
            observe_latency(single, cluster, args.commits)
            if args.latency_only:
                return 0
            observe_get_lock(cluster)
            observe_killed_node_clients(cluster)
            section("4. Survivors' commits around the loss of a node (evs.suspect_timeout default PT5S)")
            for i in range(args.kills):
                observe_stall(cluster, victim=3 if i % 2 == 0 else 2, how="SIGKILL")
            observe_stall(cluster, victim=3, how="SIGSTOP")
            observe_stall(cluster, victim=3, how="SIGTERM")
            observe_auto_increment(cluster)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--commits", type=int, default=300, help="INSERT+COMMIT per target (section 1)")
    parser.add_argument("--kills", type=int, default=3, help="SIGKILL stall measurements (section 4)")
    parser.add_argument("--latency-only", action="store_true", help="section 1 alone")
