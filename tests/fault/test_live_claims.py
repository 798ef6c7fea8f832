"""A live consumer keeps what it holds (issue 26, items 4, 5, 6 and 8), with real `notifyq
consume` processes on a private server: a stalled consumer never starts a job a peer took back,
a server restart gets no busy consumer reaped, a SIGHUP that raises session_idle_s gets none
reaped either, and in polling mode a hung handler loses its job at its lease's end.
"""

from __future__ import annotations

import signal
import threading
import time

from conftest import wait_until

from notifyq.consume import reaper
from notifyq.store import advisory
from notifyq.store.db import Session
from notifyq.store.locks import QueueLocks

from .conftest import finished_counts, read_runs, recorder_env, started_by, write_config

QUEUE = "r"
# A consumer's restart grace with session_idle_s = 8: max(two keeper pings, 15 s) (Presence.reap_pass)
RESTART_GRACE_S = 15.0


def _config(tmp_path, name: str, consumer: str = "") -> str:
    text = f"[consumer]\nreap_interval_s = 0.5\n{consumer}[wakeup]\npoll_max_s = 0.2\nidle_wait_s = 2.0\n"
    return str(write_config(tmp_path / f"{name}.toml", text))


def _claimed_by(fdb, pid: int) -> int:
    return fdb.scalar("SELECT COUNT(*) FROM nq_job j JOIN nq_consumer c ON c.id = j.owner "
                      "WHERE c.pid = %s AND j.status = 2", (pid,))


def _put(fdb, n: int, **payload) -> list[int]:
    from notifyq.produce.producer import Producer

    with Producer(QUEUE, fdb.config()) as producer:
        return producer.put_many([{"n": i, **payload} for i in range(n)])


def test_a_stalled_consumer_starts_none_of_the_jobs_a_peer_took_back(server, fdb, procs, tmp_path):
    """Item 4: session_idle_s = 2, a batch of six 1 s jobs, the consumer SIGSTOPped until a peer
    has taken them back, then SIGCONT: it used to start jobs 2-6 under its reclaimed token while
    the peer ran them too."""
    out = tmp_path / "runs"
    cfg = _config(tmp_path, "nq", "session_idle_s = 2\n")
    env = {**recorder_env(fdb, out, sleep_s=1.0), "NOTIFYQ_CONFIG": cfg}
    # Given a consumer that claimed six slow jobs and started the first
    victim = procs.consumer(env, QUEUE, "--batch-size", "6")
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_consumer") == 1, 30, message="registered")
    ids = _put(fdb, 6)
    wait_until(lambda: _claimed_by(fdb, victim.pid) == 6 and started_by(read_runs(out), victim.pid),
               30, message="the victim holds the batch and runs its first job")
    # When it stalls until a peer's reaper has taken the batch back (its liveness session idled out)
    victim.signal(signal.SIGSTOP)
    before = started_by(read_runs(out), victim.pid)
    peer = procs.consumer({**env, "NQ_TEST_SLEEP": "0"}, QUEUE, handler="nqhandlers:record")
    try:
        wait_until(lambda: _claimed_by(fdb, victim.pid) == 0 and
                   set(finished_counts([r for r in read_runs(out) if r.pid == peer.pid])) == set(ids),
                   60, 0.05, "the peer ran the whole batch")
    finally:
        victim.signal(signal.SIGCONT)
    # Then, woken, it finishes the job it was running and starts no other one of the batch
    wait_until(lambda: "someone else's now" in victim.stderr_text()
               or started_by(read_runs(out), victim.pid) != before,
               30, 0.05, "the victim to decide on its next job")
    assert started_by(read_runs(out), victim.pid) == before, victim.stderr_text()
    assert victim.alive()


def test_a_server_restart_gets_no_busy_consumer_reaped(server, fdb, procs, tmp_path):
    """Item 5: two consumers each in a long job, one idle; a clean restart freed every liveness
    lock, and the idle one, back first, reaped both busy ones before their keepers' next ping."""
    out = tmp_path / "runs"
    cfg = _config(tmp_path, "nq", "session_idle_s = 20\n")  # a keeper ping every 5 s
    env = {**recorder_env(fdb, out, sleep_s=8.0), "NOTIFYQ_CONFIG": cfg}
    busy = [procs.consumer(env, QUEUE, "--batch-size", "1") for _ in range(2)]
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_consumer") == 2, 30, message="2 registered")
    ids = _put(fdb, 2)
    wait_until(lambda: all(started_by(read_runs(out), p.pid) for p in busy), 30, message="both busy")
    idle = procs.consumer({**env, "NQ_TEST_SLEEP": "0"}, QUEUE, handler="nqhandlers:record")
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_consumer") == 3, 30, message="3 registered")
    # When the server restarts cleanly while both jobs run
    server.stop()
    server.start()
    # Then both jobs finish once, where they started, and nobody was reaped
    wait_until(lambda: set(finished_counts(read_runs(out))) == set(ids), 60, 0.1, "both jobs done")
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_job") == 0, 30, 0.1, "both acked")
    runs = read_runs(out)
    assert sorted(r.job for r in runs if not r.finished) == sorted(ids), runs
    assert "consumer died" not in idle.stderr_text() + "".join(p.stderr_text() for p in busy)


def test_a_restart_gets_no_consumer_reaped_whose_idle_worker_was_queued_for_the_watch(server, fdb, procs, tmp_path):
    """Two workers: one runs a long job, the other, idle, waits on the liveness session for the
    watch lock a peer's watcher holds. The restart ended that wait, and the session's retry began
    it again on the new connection: idle_wait_s (25 s) with the process's liveness lock not taken
    back, past the restart grace (15 s here), and a peer's pass took the running job back."""
    out = tmp_path / "runs"
    cfg = write_config(tmp_path / "nq.toml", "[consumer]\nreap_interval_s = 0.5\nsession_idle_s = 8\n"
                       "[wakeup]\npoll_max_s = 0.2\nidle_wait_s = 25.0\n")
    env = {**recorder_env(fdb, out), "NOTIFYQ_CONFIG": str(cfg)}
    dsn = fdb.config().dsn
    watch = QueueLocks(dsn.database, QUEUE).watch
    peer = Session(dsn, autocommit=True, name="peer-watcher")  # the test stands in for a peer's watcher
    try:
        # Given a consumer whose first worker runs a long job, and whose second one, idle after a
        # short job, waits on the liveness session for the watch lock, held by a peer's watcher
        busy = procs.consumer(env, QUEUE, "--workers", "2", "--batch-size", "1",
                              handler="nqhandlers:record_then_sleep")
        wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_consumer") == 1, 30, message="registered")
        [long_job] = _put(fdb, 1, ms=120_000)
        wait_until(lambda: any(r.job == long_job for r in read_runs(out)), 30, message="the long job runs")
        queued = threading.Thread(target=lambda: advisory.get_lock(peer, watch, 60), daemon=True)
        queued.start()  # behind the consumer's watcher, which hands the watch on with its next claim
        _put(fdb, 1)
        queued.join(60)
        home = fdb.scalar("SELECT IS_USED_LOCK(lock_name) FROM nq_consumer WHERE pid = %s", (busy.pid,))
        wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s "
                                      "AND INFO LIKE %s", (home, "%GET_LOCK%")), 30,
                   message="the idle worker queued for the watch lock on the liveness session")
        # When the server restarts after 8 s down (the consumer's reconnects are seconds apart by
        # then), and the peer's watcher, back first, holds the watch lock again
        server.stop()
        time.sleep(8)  # (the outage's length, not a wait for anything)
        server.start()
        # (should the consumer's reconnect come first, its worker is the watcher and nothing is
        # queued: the test then shows less, and still holds)
        advisory.get_lock(peer, watch, 0)
        # Then no reaper pass takes the running job back, within the restart grace or after it
        reclaimed = 0
        while int(fdb.query("SHOW GLOBAL STATUS LIKE 'Uptime'")[0][1]) < RESTART_GRACE_S + 3:
            result = reaper.reap_once(dsn, restart_grace_s=RESTART_GRACE_S)
            reclaimed += result.reclaimed if result is not None else 0
            time.sleep(0.2)  # (pacing: a pass as often as a busy fleet runs them)
        assert reclaimed == 0, busy.stderr_text()[-3000:]
        assert fdb.scalar("SELECT COUNT(*) FROM nq_job j JOIN nq_consumer c ON c.id = j.owner "
                          "WHERE j.id = %s AND j.status = 2 AND c.pid = %s", (long_job, busy.pid)) == 1
    finally:
        peer.close()


def test_a_reload_that_raises_session_idle_s_gets_no_busy_consumer_reaped(server, fdb, procs, tmp_path):
    """Item 6: the liveness session's server idle timeout is set when it connects; a SIGHUP to a
    longer session_idle_s slowed its keeper's pings past it, and a peer re-ran the busy job."""
    out = tmp_path / "runs"
    path = tmp_path / "nq.toml"
    cfg = _config(tmp_path, "nq", "session_idle_s = 2\n")
    env = {**recorder_env(fdb, out, sleep_s=8.0), "NOTIFYQ_CONFIG": cfg}
    busy = procs.consumer(env, QUEUE, "--batch-size", "1")
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_consumer") == 1, 30, message="registered")
    [job] = _put(fdb, 1)
    wait_until(lambda: started_by(read_runs(out), busy.pid), 30, message="busy")
    peer = procs.consumer({**env, "NQ_TEST_SLEEP": "0"}, QUEUE, handler="nqhandlers:record")
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_consumer") == 2, 30, message="2 registered")
    # When session_idle_s is raised to 40 s and the busy consumer reloads
    write_config(path, path.read_text().replace("session_idle_s = 2", "session_idle_s = 40"))
    busy.signal(signal.SIGHUP)
    # Then the job runs once, where it started, and the key is said to need a restart
    wait_until(lambda: finished_counts([r for r in read_runs(out) if r.pid == busy.pid]) == {job: 1},
               30, 0.1, "the busy consumer's run to end")
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_job") == 0, 30, 0.1, "the job acked")
    assert finished_counts(read_runs(out)) == {job: 1}
    assert "consumer died" not in peer.stderr_text()
    assert "session_idle_s needs a restart" in busy.stderr_text()


def test_a_polling_consumers_hung_handler_loses_its_job_at_its_lease_end(server, fdb, procs, tmp_path):
    """Item 8: the heartbeat extended every job the process held, so a hung handler held its job
    forever in polling mode; the lease bounds it, as with locks."""
    out = tmp_path / "runs"
    cfg = str(write_config(tmp_path / "polling.toml",
                           "[consumer]\nreap_interval_s = 0.5\n[wakeup]\npoll_max_s = 0.2\nidle_wait_s = 2.0\n"
                           "use_locks = false\n[defaults]\nlease_s = 3\n"))
    env = {**recorder_env(fdb, out, sleep_s=40.0), "NOTIFYQ_CONFIG": cfg}
    hung = procs.consumer(env, QUEUE, "--batch-size", "1")
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_consumer") == 1, 30, message="registered")
    [job] = _put(fdb, 1)
    wait_until(lambda: started_by(read_runs(out), hung.pid), 30, message="the handler hung")
    # When a peer runs beside it
    peer = procs.consumer({**env, "NQ_TEST_SLEEP": "0"}, QUEUE, handler="nqhandlers:record")
    # Then the job comes back at its lease's end and the peer runs it
    try:
        wait_until(lambda: finished_counts([r for r in read_runs(out) if r.pid == peer.pid]) == {job: 1},
               20, 0.1, "the peer to run the job of the hung handler")
    except AssertionError:
        print(fdb.query('SELECT status, attempts, lease_until, NOW(6), owner, last_error FROM nq_job'))
        print(fdb.query('SELECT * FROM nq_consumer'))
        raise
    assert hung.alive()
