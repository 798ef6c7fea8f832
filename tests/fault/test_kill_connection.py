"""KILL CONNECTION (as root) on the sessions of running consumers and producers.

A killed work session costs a reconnect and nothing else. A killed lock session frees the
consumer's liveness lock: the reaper may take its claimed jobs back (those alone may run twice)
and the consumer must notice, take its lock back or re-register under a new id, and carry on.
Until it notices (its next statement on that session) it claims and starts jobs as before
(docs/delivery-contract.md): its claims of that time are "its claimed jobs" too.
"""

from __future__ import annotations

import signal

import pytest
from conftest import wait_until

from notifyq.store import locks

from .conftest import (
    connections_of,
    consumer_id_of,
    consumer_sessions,
    finished_counts,
    freeze_mid_batch,
    produce,
    read_runs,
    recorder_env,
    write_config,
)


def _kill(testdb, conn_id: int) -> None:
    testdb.query(f"KILL CONNECTION {int(conn_id)}")


def test_killing_a_consumers_work_session_three_times_costs_reconnects_and_no_job(fdb, procs, tmp_path):
    # Given one consumer working through 200 jobs
    out = tmp_path / "runs"
    env = recorder_env(fdb, out, sleep_s=0.01)
    consumer = procs.consumer(env, "w", "--batch-size", "10")
    consumer_id = consumer_id_of(fdb, consumer.pid)
    produce(fdb, "w", 200)

    # When its work session is KILLed three times while it works
    killed = []
    for progress in (20, 60, 100):
        wait_until(lambda: len(finished_counts(read_runs(out))) >= progress, 30, message=f"{progress} done")
        work, _, _ = consumer_sessions(fdb, consumer.pid)
        _kill(fdb, work)
        killed.append(work)

    # Then every job is handled exactly once, by the same registration, which never lost its lock
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_job") == 0, 60, 0.05, "all 200 acked")
    counts = finished_counts(read_runs(out))
    assert len(counts) == 200 and max(counts.values()) == 1
    assert fdb.scalar("SELECT id FROM nq_consumer WHERE pid = %s", (consumer.pid,)) == consumer_id
    # And it really did reconnect
    work_now, _, _ = consumer_sessions(fdb, consumer.pid)
    assert work_now not in killed
    assert consumer.alive()


# Three workers and no peer: the victim's own reaper is the only one that can take its claims
# back, and it must not run before the process took its lock back (or claim under a free lock).
@pytest.mark.parametrize("workers, with_peer", [(1, True), (3, False)])
def test_killing_a_busy_consumers_lock_session_loses_no_job_and_it_stays_registered(
        fdb, procs, tmp_path, workers, with_peer):
    # Given busy consumers and 150 jobs (sped-up reaper, so the dead lock is seen quickly); the
    # victim's workers share one registration, whose lock its queue's watcher session holds
    out = tmp_path / "runs"
    fast = write_config(tmp_path / "fast.toml", "[consumer]\nreap_interval_s = 0.5\n"
                        "[wakeup]\npoll_max_s = 0.2\nidle_wait_s = 5.0\n")
    env = {**recorder_env(fdb, out, sleep_s=0.05), "NOTIFYQ_CONFIG": str(fast)}
    victim = procs.consumer(env, "l", "--batch-size", "10", "--workers", str(workers))
    peer = procs.consumer(env, "l", "--batch-size", "10") if with_peer else None
    old_id = consumer_id_of(fdb, victim.pid)
    if peer is not None:
        consumer_id_of(fdb, peer.pid)
    produce(fdb, "l", 150)
    wait_until(lambda: len(finished_counts(read_runs(out))) >= 20, 30, message="20 done")

    # When the victim's lock session is KILLed in the middle of a batch
    held = freeze_mid_batch(fdb, victim, old_id)
    lock_conn = fdb.scalar("SELECT IS_USED_LOCK(lock_name) FROM nq_consumer WHERE id = %s", (old_id,))
    assert lock_conn in connections_of(fdb, victim.pid)
    killed_at = fdb.scalar("SELECT UTC_TIMESTAMP(6)")  # the server's clock, as the records below
    _kill(fdb, lock_conn)
    victim.signal(signal.SIGCONT)

    # Then, still busy, it holds a liveness lock again: its old one if it took it back before a
    # reaper did (its claims stay its own), else a new registration (the old one is reaped)
    def registered_and_locked():
        rows = fdb.query("SELECT id FROM nq_consumer WHERE pid = %s AND IS_USED_LOCK(lock_name) IS NOT NULL",
                         (victim.pid,))
        return rows[0][0] if rows else None

    new_id = wait_until(registered_and_locked, 10, message="a live registration")
    if new_id != old_id:
        wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_consumer WHERE id = %s", (old_id,)) == 0,
                   10, message="the old registration reaped")
    # And every job is handled; only jobs a reaper took back from the victim's old registration
    # may have run twice, and only from claims it made before it registered again. Not only the
    # jobs it held when its lock died (`held`): it goes on claiming and starting jobs under its
    # free lock until it notices the KILL at its next statement on the lock session (a reap
    # check, every reap_interval_s), and a peer's reaper may take such a claim back while it
    # runs; the victim's ack is then fenced out and the peer runs the job again, as the delivery
    # contract allows. The take-backs are the attempt records the reaper writes with them.
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_job") == 0, 60, 0.05, "all 150 acked")
    counts = finished_counts(read_runs(out))
    duplicates = {job for job, n in counts.items() if n > 1}
    assert len(counts) == 150
    registered_at = fdb.scalar("SELECT started_at FROM nq_consumer WHERE pid = %s", (victim.pid,))
    taken_back = _taken_back_from(fdb, old_id)
    assert all(killed_at <= taken_at and claimed_at < registered_at
               for claimed_at, taken_at in taken_back.values()), (killed_at, registered_at, taken_back)
    assert duplicates <= set(taken_back), (duplicates, held, taken_back)
    assert fdb.scalar("SELECT COUNT(*) FROM nq_consumer WHERE pid = %s", (victim.pid,)) == 1
    assert victim.alive() and (peer is None or peer.alive())
    print(f"\nlock session of {workers} worker(s) killed: {len(held)} jobs held, {len(taken_back)} taken "
          f"back, {len(duplicates)} ran twice, {'kept its id' if new_id == old_id else 're-registered'}")


def _taken_back_from(testdb, consumer_id: str) -> dict[int, tuple]:
    """{job id: (its claim's time, the take-back's time)} of the claims a reaper took back from
    `consumer_id` as dead (its lock free), from the attempt records the take-back wrote: not a
    lease that ran out, which a live consumer's claims must never reach."""
    rows = testdb.query(
        "SELECT job_id, started_at, ended_at FROM nq_attempt WHERE consumer = %s AND outcome = 'taken back'"
        " AND (error LIKE %s OR error LIKE %s)", (consumer_id, "consumer died%", "its consumer is gone%"))
    return {int(job_id): (claimed_at, taken_at) for job_id, claimed_at, taken_at in rows}


def test_killing_a_streaming_producers_sessions_between_batches_loses_no_line(fdb, procs, tmp_path):
    # Given a consumer and a `notifyq produce --print-ids` fed through a pipe
    out = tmp_path / "runs"
    env = recorder_env(fdb, out, sleep_s=0.0)
    procs.consumer(env, "p", "--handler", "nqhandlers:record")
    producer = procs.start(env, "produce", "-q", "p", "--print-ids", stdin=True)
    ringer = locks.QueueLocks(fdb.admin.database, "p").ringer

    def feed(start: int, n: int) -> None:
        producer.stdin.write("".join(f'{{"n": {i}}}\n' for i in range(start, start + n)))
        producer.stdin.flush()
        wait_until(lambda: len(producer.stdout_text().split()) == start + n, 30,
                   message=f"{start + n} ids printed")

    feed(0, 50)
    # When its work session is KILLed while it waits for more input, and then its lock session
    sessions = wait_until(lambda: connections_of(fdb, producer.pid), 10, message="producer sessions")
    lock_conn = fdb.scalar("SELECT IS_USED_LOCK(%s)", (ringer,))
    assert lock_conn in sessions and len(sessions) == 2
    work_conn = next(c for c in sessions if c != lock_conn)
    _kill(fdb, work_conn)
    feed(50, 50)
    _kill(fdb, lock_conn)
    feed(100, 50)
    producer.stdin.close()

    # Then the producer carries on to a clean exit, and every printed id is handled exactly once
    assert producer.wait(30) == 0, producer.stderr_text()
    ids = [int(x) for x in producer.stdout_text().split()]
    assert len(set(ids)) == 150
    wait_until(lambda: set(finished_counts(read_runs(out))) == set(ids), 30, message="150 jobs handled")
    assert max(finished_counts(read_runs(out)).values()) == 1
    assert fdb.scalar("SELECT COUNT(*) FROM nq_job") == 0

