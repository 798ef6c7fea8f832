"""The Galera harness against real nodes: it starts a Synced 3-node cluster, replicates writes, and
can kill, restart, pause and resume one node, with the cluster noticing each time. Along the way
it pins the Galera facts notifyq's design has to live with (node-local advisory locks, connection
errors of a killed node's clients, an auto-increment step that changes in open sessions).

One cluster serves every cluster test (~10 s to start); the `cluster` fixture makes it whole again
before every test.
"""

from __future__ import annotations

import uuid

import MySQLdb
import pytest

from .conftest import requires_galera
from .galera import GaleraCluster
from .node import GaleraNode

pytestmark = requires_galera

DB = "nq_cluster_t"


@pytest.fixture(scope="module")
def table(galera: GaleraCluster) -> str:
    """A replicated InnoDB table, created through node 1."""
    conn = galera.node(1).connect()
    cur = conn.cursor()
    cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
    cur.execute(f"CREATE TABLE IF NOT EXISTS {DB}.t (id BIGINT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(64))")
    conn.close()
    return f"{DB}.t"


def insert(node: GaleraNode, table: str) -> str:
    """Commit one row through `node`; return its value."""
    value = uuid.uuid4().hex
    conn = node.connect(autocommit=False)
    try:
        conn.cursor().execute(f"INSERT INTO {table} (v) VALUES (%s)", (value,))
        conn.commit()
    finally:
        conn.close()
    return value


def scalar(conn, sql: str):
    cur = conn.cursor()
    cur.execute(sql)
    return cur.fetchone()[0]


def has_row(node: GaleraNode, table: str, value: str) -> bool:
    """Read through `node`. wsrep_sync_wait=1 makes the read wait until the node has applied every
    write set committed anywhere before it: without it a node may answer from slightly behind."""
    conn = node.connect()
    try:
        cur = conn.cursor()
        cur.execute("SET SESSION wsrep_sync_wait = 1")
        cur.execute(f"SELECT COUNT(*) FROM {table} WHERE v = %s", (value,))
        return cur.fetchone()[0] == 1
    finally:
        conn.close()


def test_three_nodes_start_synced_on_their_own_ports_and_datadirs(cluster):
    # Given the started cluster
    # Then every node is Synced in one primary component of three
    assert cluster.cluster_sizes() == {1: 3, 2: 3, 3: 3}
    assert all(n.is_synced_member(3) for n in cluster.nodes)
    # And each node is a private server: its own port (never 3306) and a datadir in the cluster's
    # temp directory, so the machine's own server is not involved
    ports = [n.port for n in cluster.nodes]
    assert len(set(ports)) == 3 and 3306 not in ports
    for node in cluster.nodes:
        cur = node.connect().cursor()
        cur.execute("SELECT @@port, @@datadir, @@wsrep_node_name")
        port, datadir, name = cur.fetchone()
        assert (port, name) == (node.port, f"node{node.index}")
        assert datadir.startswith(str(cluster.basedir))


def test_a_row_committed_on_node_1_is_readable_on_node_3(cluster, table):
    # When a row commits through node 1
    value = insert(cluster.node(1), table)
    # Then node 3 has it
    assert has_row(cluster.node(3), table, value)


def test_advisory_locks_are_node_local(cluster):
    # Given a session on node 1 holding a GET_LOCK lock
    holder = cluster.node(1).connect()
    assert scalar(holder, "SELECT GET_LOCK('nq_cluster_t', 0)") == 1
    # Then node 2 sees the lock as free and can take it too: nothing about it is replicated
    other = cluster.node(2).connect()
    assert scalar(other, "SELECT IS_USED_LOCK('nq_cluster_t')") is None
    assert scalar(other, "SELECT GET_LOCK('nq_cluster_t', 0)") == 1
    assert scalar(holder, "SELECT IS_USED_LOCK('nq_cluster_t')") == holder.thread_id()
    holder.close()
    other.close()


def test_a_killed_node_leaves_writes_working_and_rejoins_by_ist_when_restarted(cluster, table):
    # Given a session open on node 2, and one on node 1 whose auto-increment step is the cluster size
    client = cluster.node(2).connect()
    survivor = cluster.node(1).connect()
    assert scalar(survivor, "SELECT @@session.auto_increment_increment") == 3
    # When node 2 is SIGKILLed
    cluster.kill(2)
    # Then that session's next statement fails as a lost connection (2006 or 2013), and a new
    # connection is refused (Connector/C 3.3 says 2002 for a refused TCP connect too, not 2003)
    with pytest.raises(MySQLdb.OperationalError) as lost:
        client.cursor().execute("SELECT 1")
    assert lost.value.args[0] in (2006, 2013)
    with pytest.raises(MySQLdb.OperationalError) as refused:
        cluster.node(2).connect()
    assert refused.value.args[0] in (2002, 2003)
    # Then the survivors evict it: a primary component of two
    cluster.wait_synced([cluster.node(1), cluster.node(3)], cluster_size=2)
    assert cluster.node(2).wsrep_status() is None
    # And writes through node 1 still commit and replicate to node 3
    missed = insert(cluster.node(1), table)
    assert has_row(cluster.node(3), table, missed)
    # And the already-open session's auto-increment step followed the membership (3 -> 2): ids of
    # a multi-row INSERT cannot be computed from a step read earlier
    assert scalar(survivor, "SELECT @@session.auto_increment_increment") == 2

    # When node 2 is started again
    cluster.restart(2)
    # Then all three are Synced again; node 2 got only what it missed (IST), not a full copy
    assert cluster.cluster_sizes() == {1: 3, 2: 3, 3: 3}
    assert cluster.node(2).last_join() == "IST"
    assert has_row(cluster.node(2), table, missed)
    assert scalar(survivor, "SELECT @@session.auto_increment_increment") == 3


def test_a_paused_node_falls_out_of_the_cluster_and_comes_back_when_resumed(cluster, table):
    # When node 3 is frozen (SIGSTOP): its process lives, but it stops answering
    cluster.pause(3)
    # Then nodes 1 and 2 carry on as a cluster of two, and writes commit
    cluster.wait_synced([cluster.node(1), cluster.node(2)], cluster_size=2)
    missed = insert(cluster.node(1), table)

    # When it is resumed (SIGCONT)
    cluster.resume(3)
    # Then it is a Synced member again and has caught up by IST
    assert cluster.cluster_sizes() == {1: 3, 2: 3, 3: 3}
    assert cluster.node(3).last_join() == "IST"
    assert has_row(cluster.node(3), table, missed)
