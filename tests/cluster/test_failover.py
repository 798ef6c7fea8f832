"""notifyq on a 3-node Galera cluster through a multi-host DSN: every session writes through the
first ready node, and when that node is killed, real `notifyq` producer and consumer processes
carry on through the next one, without restarting, losing nothing and reaping no live consumer.

One cluster serves every cluster test (FAST_EVICTION: a kill stalls the survivors ~3 s, not ~6 s).
"""

from __future__ import annotations

import collections
import dataclasses
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import REPO, notifyq_cmd, run_cli, wait_until
from notifyq.config.dsn import DSN
from notifyq.consume import reaper
from notifyq.consume.heartbeat import Heartbeat
from notifyq.store import advisory, liveness, locks
from notifyq.store import writer as store_writer
from notifyq.store.db import Session

from .conftest import requires_galera
from .galera import GaleraCluster

pytestmark = requires_galera

QUEUE = "t"
BATCH = 10


@pytest.fixture(autouse=True)
def fresh_writer_choice():
    """Each test starts as a new process would: no writer chosen yet."""
    store_writer.WriterChoice._choices.clear()
    yield
    store_writer.WriterChoice._choices.clear()


@pytest.fixture(scope="module")
def dsn_url(galera: GaleraCluster) -> str:
    url = galera.multi_host_dsn(database="nq_failover_t")
    result = run_cli(_env(url), "init")
    assert result.returncode == 0, result.stderr
    return url


def _env(url: str, **extra: str) -> dict[str, str]:
    import os
    return {**os.environ, "NOTIFYQ_DSN": url, "NOTIFYQ_CONFIG": "/dev/null",
            "PYTHONPATH": str(REPO / "tests" / "helpers"), **extra}


def _port_of(session: Session) -> int:
    return int(session.node.rsplit(":", 1)[1])


def test_a_multi_host_dsn_writes_through_the_first_node_and_skips_one_that_is_not_synced(cluster, dsn_url):
    dsn = DSN.parse(dsn_url)
    # When a session connects through the multi-host DSN
    first = Session(dsn, name="t")
    first.connect()
    # Then it is on node 1, and knows it is a Galera node
    assert _port_of(first) == cluster.node(1).port and first.galera
    first.close()

    # Given node 1 out of sync (desynced, as for a backup: it still answers)
    store_writer.WriterChoice._choices.clear()
    admin = cluster.node(1).connect()
    admin.cursor().execute("SET GLOBAL wsrep_desync = ON")
    try:
        # When a new process's session connects
        second = Session(dsn, name="t")
        second.connect()
        # Then it skipped node 1 for node 2
        assert _port_of(second) == cluster.node(2).port
        second.close()
    finally:
        admin.cursor().execute("SET GLOBAL wsrep_desync = OFF")
        admin.close()


def test_a_session_holding_a_liveness_lock_keeps_its_working_connection_when_the_writer_choice_moves(
        cluster, dsn_url):
    """Regression (issue 16): the consumer's home session followed its process's other sessions to
    a new writer while its own connection still worked, and so freed its liveness lock on the old
    node, where a reaper took the live consumer's jobs back."""
    dsn = DSN.parse(dsn_url)
    lock_name = locks.consumer_lock(dsn.database, uuid.uuid4().hex)
    home = Session(dsn, autocommit=True, name="home", follows_writer=False)
    work = Session(dsn, name="work")
    admin = cluster.node(1).connect()
    try:
        # Given the home session on node 1 holding a liveness lock, and the process's work session
        assert advisory.get_lock(home, lock_name, 0) == 1 and _port_of(home) == cluster.node(1).port
        held_by = home.connection_id
        work.connect()
        # When node 1 falls out of sync (desynced: it still answers) and the work session
        # reconnects, moving the process's writer choice to node 2
        admin.cursor().execute("SET GLOBAL wsrep_desync = ON")
        work.discard()
        work.connect()
        assert _port_of(work) == cluster.node(2).port
        # Then the home session's next statements stay on node 1, where its lock is still held
        assert advisory.lock_holder(home, lock_name) == held_by
        assert _port_of(home) == cluster.node(1).port and home.generation == 1
        cur = admin.cursor()
        cur.execute("SELECT IS_USED_LOCK(%s)", (lock_name,))
        assert cur.fetchone()[0] == held_by
    finally:
        admin.cursor().execute("SET GLOBAL wsrep_desync = OFF")
        admin.close()
        home.close()
        work.close()


def test_sessions_of_a_process_fail_over_together_and_do_not_fail_back(cluster, dsn_url):
    dsn = DSN.parse(dsn_url)
    a, b = Session(dsn, name="a"), Session(dsn, name="b")
    a.connect()
    b.connect()
    # When node 1, the writer, is killed
    cluster.kill(1)
    # Then a transaction on each session runs on node 2 (a reconnect inside the retry policy)
    for s in (a, b):
        assert s.run(lambda cur: cur.execute("SELECT 1") and cur.fetchone()[0], what="t") == 1
        assert _port_of(s) == cluster.node(2).port
    # And after node 1 is back, a new session of this process still goes to node 2
    cluster.restart(1)
    c = Session(dsn, name="c")
    c.connect()
    assert _port_of(c) == cluster.node(2).port
    for s in (a, b, c):
        s.close()


def _on(dsn_url: str, cluster: GaleraCluster, index: int) -> DSN:
    """The DSN of one node alone."""
    return dataclasses.replace(DSN.parse(dsn_url), hosts=(), port=cluster.node(index).port)


def test_a_reaper_judges_by_lock_only_the_consumers_whose_lock_lives_on_its_node_and_whose_heartbeat_stopped(
        cluster, dsn_url):
    database = DSN.parse(dsn_url).database
    lock2, work2, reaper1 = (Session(_on(dsn_url, cluster, 2), autocommit=True, name="lock"),
                             Session(_on(dsn_url, cluster, 2), name="work"), Session(_on(dsn_url, cluster, 1)))
    ids = {name: uuid.uuid4().hex for name in ("live on node 2", "dead on node 1", "gone with its node",
                                               "reconnecting on node 1")}
    try:
        # Given a live consumer on node 2: its liveness lock held there (free as seen from node 1)
        live = ids["live on node 2"]
        assert advisory.get_lock(lock2, locks.consumer_lock(database, live), 0) == 1
        liveness.register_consumer(work2, live, locks.consumer_lock(database, live), "h", 1, [QUEUE], "locks",
                                   node=lock2.node)
        # And one registered on node 1 whose lock is free there and whose heartbeat stopped: dead
        reaper1.connect()
        dead = ids["dead on node 1"]
        liveness.register_consumer(work2, dead, locks.consumer_lock(database, dead), "h", 2, [QUEUE], "locks",
                                   node=reaper1.node)
        work2.run(lambda cur: cur.execute("UPDATE nq_consumer SET last_seen = NOW(6) - INTERVAL %s SECOND "
                                          "WHERE id = %s", (liveness.GALERA_LOCK_GRACE_S + 1, dead)), what="t")
        # And one on node 1 whose lock is free but whose heartbeat just beat: its liveness session
        # is reconnecting (regression, issue 16: a reaper on its node took it for dead)
        back = ids["reconnecting on node 1"]
        liveness.register_consumer(work2, back, locks.consumer_lock(database, back), "h", 4, [QUEUE], "locks",
                                   node=reaper1.node)
        # And one whose lock lived on a node that is gone, and whose heartbeat stopped long ago
        gone = ids["gone with its node"]
        liveness.register_consumer(work2, gone, locks.consumer_lock(database, gone), "h", 3, [QUEUE], "locks",
                                   node="a-node-that-died:3306")
        work2.run(lambda cur: cur.execute("UPDATE nq_consumer SET last_seen = NOW(6) - INTERVAL 1 HOUR "
                                          "WHERE id = %s", (gone,)), what="t")
        # When a reaper passes on node 1
        result = reaper.reap(reaper1, database)
        # Then the dead one and the one gone with its node are taken back, the live one and the
        # reconnecting one are not
        assert result is not None and result.dead_consumers == 2

        def registered(cur):
            cur.execute("SELECT id FROM nq_consumer")
            return {r[0] for r in cur.fetchall()}

        assert work2.run(registered, what="t") == {live, back}
        # And the verdict inside the reclaim spares the reconnecting one too, however it was chosen
        assert liveness.reclaim_owner(reaper1, back, [QUEUE], lock_name=locks.consumer_lock(database, back)) is None
        advisory.release_lock(reaper1, locks.consumer_lock(database, back))
    finally:
        work2.run(lambda cur: cur.execute("DELETE FROM nq_consumer"), what="t")
        for s in (lock2, work2, reaper1):
            s.close()


def test_a_certification_conflict_reruns_the_whole_transaction_and_is_counted(cluster, dsn_url):
    one = Session(_on(dsn_url, cluster, 1), name="one")
    two = Session(_on(dsn_url, cluster, 2), name="two")
    one.run(lambda cur: cur.execute("INSERT INTO nq_queue (queue) VALUES ('conflict') "
                                    "ON DUPLICATE KEY UPDATE paused = 0"), what="t")
    attempts = []

    def pause_on_node_1(cur):
        attempts.append(1)
        cur.execute("UPDATE nq_queue SET paused = paused + 1 WHERE queue = 'conflict'")
        if len(attempts) == 1:  # meanwhile node 2 commits a write to the same row
            two.run(lambda c: c.execute("UPDATE nq_queue SET paused = paused + 10 WHERE queue = 'conflict'"),
                    what="t")

    try:
        # When node 1's transaction commits after node 2 committed a write to the same row
        one.run(pause_on_node_1, what="conflicting write")
        # Then it failed certification (1213) and ran again whole: both writes count, once each
        assert len(attempts) == 2 and one.conflicts.count == 1

        def paused(cur):
            cur.execute("SELECT paused FROM nq_queue WHERE queue = 'conflict'")
            return cur.fetchone()[0]

        assert one.run(paused, what="t") == 11
    finally:
        one.run(lambda cur: cur.execute("DELETE FROM nq_queue WHERE queue = 'conflict'"), what="t")
        one.close()
        two.close()


def _recorded(out: Path) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for path in out.glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                counts[int(parts[0])] += 1
    return counts


def test_killing_the_writer_loses_nothing_and_reaps_no_live_consumer(cluster, dsn_url, tmp_path):
    out = tmp_path / "runs"
    out.mkdir()
    config = tmp_path / "c.toml"
    config.write_text("[consumer]\nreap_interval_s = 0.5\n[wakeup]\npoll_max_s = 0.2\n")
    config.chmod(0o600)
    env = _env(dsn_url, NQ_TEST_OUT=str(out), NQ_TEST_SLEEP="0.02", NOTIFYQ_CONFIG=str(config))
    consumers = [subprocess.Popen(notifyq_cmd("consume", "-q", QUEUE, "--handler", "nqhandlers:record_slow",
                                              "--workers", "2", "--batch-size", str(BATCH)),
                                  env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / f"c{i}.err").open("w"))
                 for i in range(2)]
    producer = subprocess.Popen(notifyq_cmd("produce", "-q", QUEUE, "--print-ids"), env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=(tmp_path / "p.err").open("w"))
    try:
        # Given jobs flowing from a producer process to two consumer processes through node 1
        for i in range(200):
            producer.stdin.write(f'{{"n": {i}}}\n')
        producer.stdin.flush()
        wait_until(lambda: len(_recorded(out)) >= 100, 60, message="jobs handled before the kill")
        # When node 1 is killed mid-flow, and more jobs come after it
        cluster.kill(1)
        after = "".join(f'{{"n": {i}}}\n' for i in range(200, 400))
        ids_text, _ = producer.communicate(input=after, timeout=60)
        assert producer.returncode == 0, (tmp_path / "p.err").read_text()
        ids = [int(x) for x in ids_text.split()]
        # Then every job was enqueued once, and every one is handled: nothing lost
        assert len(ids) == 400 and len(set(ids)) == 400
        wait_until(lambda: set(_recorded(out)) >= set(ids), 60, message="every job handled")
        # And duplicates come only from batches in flight at the kill (2 consumers x 2 workers)
        runs = _recorded(out)
        duplicates = sum(n - 1 for n in runs.values())
        assert duplicates <= 2 * 2 * BATCH, duplicates
        print(f"failover: {len(ids)} jobs, {len(runs)} handled, {duplicates} duplicates")
        # And no live consumer was judged dead, and both still run, on node 2
        for i, proc in enumerate(consumers):
            err = (tmp_path / f"c{i}.err").read_text()
            assert proc.poll() is None, err
            assert "consumer died" not in err and "judged stale" not in err, err
        probe = Session(DSN.parse(dsn_url), name="probe")

        def nodes(cur):
            cur.execute("SELECT DISTINCT node FROM nq_consumer")
            return cur.fetchall()

        rows = probe.run(nodes, what="t")
        assert [r[0] for r in rows] == [probe.node] and _port_of(probe) == cluster.node(2).port
        probe.close()
    finally:
        if producer.poll() is None:
            producer.kill()
        for proc in consumers:
            proc.send_signal(signal.SIGTERM)
        for proc in consumers:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def test_a_paused_writer_is_left_within_the_bound_by_every_session_and_not_failed_back_to(cluster, dsn_url):
    """Regression: SIGSTOP keeps the writer's sockets open, so its clients saw no error, only
    silence, until a 60 s read timeout (a consumer's worker then gave up; the producer exited)."""
    dsn = DSN.parse(dsn_url)
    a, b = Session(dsn, name="a"), Session(dsn, name="b")
    for s in (a, b):
        s.connect()
        assert _port_of(s) == cluster.node(1).port
    # When node 1, the writer, is paused
    cluster.pause(1)
    paused_at = time.monotonic()
    # Then a transaction on one session runs on node 2 within the bound (its read times out,
    # the paused node's connect times out, the next ready node takes it)
    assert a.run(lambda cur: cur.execute("SELECT 1") and cur.fetchone()[0], what="t") == 1
    moved_s = time.monotonic() - paused_at
    bound_s = store_writer.FAILOVER_READ_TIMEOUT_S + store_writer.FAILOVER_CONNECT_TIMEOUT_S + 3
    assert _port_of(a) == cluster.node(2).port and moved_s < bound_s, (moved_s, bound_s)
    # And the process's other session follows at its next transaction, without its own timeout
    followed_at = time.monotonic()
    assert b.run(lambda cur: cur.execute("SELECT 2") and cur.fetchone()[0], what="t") == 2
    assert _port_of(b) == cluster.node(2).port and time.monotonic() - followed_at < 2.0
    # And once node 1 is resumed and Synced again, neither they nor a new session go back to it
    cluster.resume(1)
    c = Session(dsn, name="c")
    c.connect()
    for s in (a, b, c):
        assert s.run(lambda cur: cur.execute("SELECT 3") and cur.fetchone()[0], what="t") == 3
        assert _port_of(s) == cluster.node(2).port
        s.close()
    print(f"paused writer left after {moved_s:.2f} s (bound {bound_s} s)")


def test_a_heartbeat_lands_on_the_next_node_well_inside_the_staleness_bound_after_the_writer_pauses(
        cluster, dsn_url):
    """Regression: the heartbeat's beat waited out the 12 s read timeout on the paused writer, then
    a whole interval before its next try: it landed ~23 s after the last one (past POLLING_STALE_S,
    30 s, on a busy host), and reapers on the other nodes took a live consumer's jobs back."""
    database = DSN.parse(dsn_url).database
    consumer_id = uuid.uuid4().hex
    on2 = Session(_on(dsn_url, cluster, 2), name="observer")  # reads the row where the beat must land
    liveness.register_consumer(on2, consumer_id, locks.consumer_lock(database, consumer_id), "h", 1, [QUEUE],
                               "locks", node="node-1")
    beat = Heartbeat(DSN.parse(dsn_url), lambda: consumer_id, name="t")

    def last_seen():
        return on2.run(lambda cur: cur.execute("SELECT last_seen FROM nq_consumer WHERE id = %s",
                                               (consumer_id,)) and cur.fetchone()[0], what="t")

    try:
        beat.beat()  # on node 1, the writer
        assert _port_of(beat._session) == cluster.node(1).port
        beat.start()
        # Given a beat that just landed (the next one is due in an interval: it meets the pause)
        first = last_seen()
        landed = wait_until(lambda: (seen := last_seen()) > first and seen, 10, message="a beat")
        # When node 1, the writer, is paused
        cluster.pause(1)
        # Then the next beat lands on another node within two intervals and a connect timeout
        # (not a read timeout of 12 s and another interval), well inside POLLING_STALE_S
        bound_s = 2 * beat.interval_s + store_writer.FAILOVER_CONNECT_TIMEOUT_S + 3
        after = wait_until(lambda: (seen := last_seen()) > landed and seen, liveness.POLLING_STALE_S,
                           interval=0.2, message="a beat after the pause")
        gap_s = (after - landed).total_seconds()
        print(f"heartbeat gap across a paused writer: {gap_s:.2f} s (bound {bound_s} s)")
        assert gap_s < bound_s, (gap_s, bound_s)
        assert not beat.lost.is_set()
    finally:
        beat.stop()
        on2.run(lambda cur: cur.execute("DELETE FROM nq_consumer WHERE id = %s", (consumer_id,)), what="t")
        on2.close()


def test_ringing_producers_writing_through_two_nodes_lose_no_acknowledged_job(cluster, dsn_url):
    """Regression: a ringing producer sent its COMMIT at the head of a multi-statement query
    (with the bell's look), and on Galera that COMMIT returned OK for transactions a certification
    conflict had already rolled back: with writers on two nodes (new processes started after a
    failed writer returned), 10-15 % of acknowledged jobs were never stored."""
    import threading

    from notifyq import config as config_mod
    from notifyq.produce.producer import Producer

    acked: dict[int, list[int]] = {1: [], 2: []}

    def produce(node: int) -> None:
        node_url = f"mysql://root@127.0.0.1:{cluster.node(node).port}/{DSN.parse(dsn_url).database}"
        cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"}, overrides={"dsn": node_url})
        with Producer("split", cfg, ring=True) as producer:
            for i in range(300):
                acked[node] += producer.put_many([{"i": i}] * 3) if i % 2 else [producer.put({"i": i})]

    # Given two ringing producers, one writing through node 1 and one through node 2, whose
    # commits conflict (both bump the queue's signal row)
    threads = [threading.Thread(target=produce, args=(node,)) for node in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    # Then every job either of them was acknowledged is stored
    probe = Session(DSN.parse(dsn_url), name="probe")

    def stored(cur):
        cur.execute("SET SESSION wsrep_sync_wait = 1")
        cur.execute("SELECT id FROM nq_job WHERE queue = 'split'")
        return {r[0] for r in cur.fetchall()}

    try:
        rows = probe.run(stored, what="t")
        for node, ids in acked.items():
            assert len(ids) == 600 and not set(ids) - rows, (node, len(set(ids) - rows))
    finally:
        probe.run(lambda cur: cur.execute("DELETE FROM nq_job WHERE queue = 'split'"), what="t")
        probe.close()
