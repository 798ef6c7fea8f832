"""A key's counter left high (nq_flow_key.running: a running job's row deleted outside notifyq,
or a dead consumer's job taken back while a claim held the key's row) holds the key's next job
back only until the counter's trust ends (COUNT_TRUST_S): the idle consumer whose claim held that
job claims again then, without any other wake-up, and the claim's recount starts it. Real
`notifyq consume` processes (store/flow.py, wakeup/waiter.py)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import admin_connect, notifyq_cmd, wait_until

from notifyq.produce.producer import Producer
from notifyq.store.flow import COUNT_TRUST_S

Q = "hq"
# The watcher's own wait without a wake-up (wakeup.SAFETY_S) and the queued consumers' (idle_wait_s)
# are far longer: a start within this says the trust's end woke the claim
WITHIN_S = COUNT_TRUST_S + 7


def _started(out: Path) -> set[int]:
    """The jobs whose handler started (hold_until_released's "job_id attempt pid start" lines)."""
    found = set()
    for path in out.glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[3] == "start":
                found.add(int(parts[0]))
    return found


def _consumers_env(db, tmp_path, settings: str) -> dict[str, str]:
    """The consumers' environment: a config of `settings` (TOML) at warning level, and the
    handlers' record of starts in tmp_path."""
    conf = tmp_path / "notifyq.toml"
    conf.write_text("[log]\nlevel = \"warning\"\n" + settings)
    return {**db.env, "NQ_TEST_OUT": str(tmp_path), "NOTIFYQ_CONFIG": str(conf)}


@pytest.mark.parametrize("workers", [(2,), (2, 1)], ids=["one-process", "two-processes"])
def test_a_job_held_by_a_counter_left_high_starts_once_the_counters_trust_ends(db, tmp_path, workers):
    # Given a queue limited to 1 running job per key, and consumer processes (two workers each
    # but the second's one: whichever claims the held job may be queued for the watch behind the
    # other's watcher), with the wake-up settings as shipped: the watcher waits 60 s without a
    # wake-up, a consumer queued for the watch 25 s
    env = _consumers_env(db, tmp_path, f"[queue.{Q}]\nlimit_per_key = 1\n")
    procs: list[subprocess.Popen] = []
    with open(tmp_path / "consumer.err", "w") as err:
        for n in workers:
            procs.append(subprocess.Popen(notifyq_cmd("consume", "-q", Q, "--handler", "nqhandlers:hold_until_released",
                                                      "--workers", str(n)),
                                          env=env, stdout=subprocess.DEVNULL, stderr=err))
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == len(workers), 60,
                   message="the consumers up")
        with Producer(Q, db.config()) as producer:
            # And key k's first job running (its handler blocks until released)
            first = producer.put({"hold": True}, key="k")
            wait_until(lambda: first in _started(tmp_path), 15, message="the first job running")
            # When the second job of k is put: the idle watcher's claim holds it back (k runs 1 of 1,
            # a counter counted when the first started, trusted for COUNT_TRUST_S)
            second = producer.put({"hold": True}, key="k")
        wait_until(lambda: db.scalar("SELECT running FROM nq_flow_key WHERE queue = %s AND job_key = 'k'", (Q,)) == 1,
                   5, message="k's counter at 1")
        # And the first job's row is deleted outside notifyq (its end releases no counter and
        # bumps no signal: the counter stays at 1, nothing wakes the consumers)
        db.query("DELETE FROM nq_job WHERE id = %s", (first,))
        deleted_at = time.monotonic()
        # Then the second job starts once the counter's trust has ended, while the first job's
        # handler still runs: the claim held by the counter is made again then, and recounts it
        # (before: it waited for the watcher's 60 s safety wake-up)
        wait_until(lambda: second in _started(tmp_path), WITHIN_S, 0.05,
                   message="the second job started after the counter's trust ended")
        assert time.monotonic() - deleted_at < WITHIN_S
        # And k's counter holds it alone (recounted: the deleted job is not in it)
        assert db.scalar("SELECT running FROM nq_flow_key WHERE queue = %s AND job_key = 'k'", (Q,)) == 1
    finally:
        (tmp_path / "release").touch()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(60) for proc in procs]
    assert codes == [0] * len(workers)


def _starts_by(out: Path, job_id: int) -> list[int]:
    """The pids that started `job_id`, one per start."""
    found = []
    for path in out.glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[3] == "start" and int(parts[0]) == job_id:
                found.append(int(parts[2]))
    return found


def test_a_job_a_reaper_took_back_while_a_claim_held_its_keys_row_starts_once_the_trust_ends(db, tmp_path):
    # Given a queue limited to 1 running job per key, and two consumer processes: A runs key k's
    # job (its handler blocks), B idles
    env = _consumers_env(db, tmp_path, f"[consumer]\nreap_interval_s = 0.5\n[queue.{Q}]\nlimit_per_key = 1\n")
    args = notifyq_cmd("consume", "-q", Q, "--handler", "nqhandlers:hold_until_released")
    procs: list[subprocess.Popen] = []
    holder = admin_connect(db.admin, db.admin.database)
    try:
        with open(tmp_path / "consumers.err", "w") as err:
            procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=err))
            wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 1, 60, message="A up")
            with Producer(Q, db.config()) as producer:
                job = producer.put({"hold": True}, key="k")
            wait_until(lambda: _starts_by(tmp_path, job) == [procs[0].pid], 15, message="A running the job")
            procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=err))
            wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 2, 60, message="B up")
        # And k's row held by a claim (here: this test's transaction) that recounted it: 1 running
        # (B's start left the queue's counters unknown: they are recounted by the next claim)
        cur = holder.cursor()
        cur.execute("BEGIN")
        cur.execute("SELECT running FROM nq_flow_key WHERE queue = %s AND job_key = 'k' FOR UPDATE", (Q,))
        cur.execute("UPDATE nq_flow_key SET running = 1, counted_at = NOW(6) WHERE queue = %s AND job_key = 'k'",
                    (Q,))
        # When A dies (SIGKILL), and B's reaper takes its job back: it finds k's row locked, and
        # leaves k's counter as it is (a reaper waits on no claim)
        procs[0].kill()
        procs[0].wait(10)
        wait_until(lambda: db.scalar("SELECT status FROM nq_job WHERE id = %s", (job,)) == 0, 30,
                   message="the job taken back")
        # And that claim commits: k's counter says 1 (high by the job taken back, never low), and
        # is trusted for COUNT_TRUST_S from its recount
        cur.execute("COMMIT")
        assert db.scalar("SELECT running FROM nq_flow_key WHERE queue = %s AND job_key = 'k'", (Q,)) == 1
        committed_at = time.monotonic()
        # Then B starts the job once k's counter's trust has ended: B's claims meanwhile held
        # it back by the counter, and nothing else wakes it (before: the watcher's 60 s safety)
        wait_until(lambda: procs[1].pid in _starts_by(tmp_path, job), WITHIN_S, 0.05,
                   message="B starting the job taken back")
        assert time.monotonic() - committed_at < WITHIN_S
    finally:
        holder.close()
        (tmp_path / "release").touch()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(60) for proc in procs]
    assert codes == [-signal.SIGKILL, 0]


def test_held_jobs_start_once_the_trust_ends_when_each_claim_takes_one_job(db, tmp_path):
    # Given a queue limited to 2 running jobs per key whose claims take one job each (as the claim
    # sizer sizes them for a queue of slow jobs: batch_target_s), and two consumer processes of 8
    # workers, with the wake-up settings as shipped
    env = _consumers_env(db, tmp_path, f"[queue.{Q}]\nlimit_per_key = 2\nbatch_size = 1\nworkers = 8\n")
    args = notifyq_cmd("consume", "-q", Q, "--handler", "nqhandlers:hold_until_released")
    procs: list[subprocess.Popen] = []
    with open(tmp_path / "consumers.err", "w") as err:
        for _ in range(2):
            procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=err))
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 2, 60, message="the consumers up")
        with Producer(Q, db.config()) as producer:
            # And key k's two slots taken by jobs that run (their handlers block until released)
            running = [producer.put({"hold": True}, key="k") for _ in range(2)]
            wait_until(lambda: set(running) <= _started(tmp_path), 15, message="k's two jobs running")
            # And four more jobs of k in one put (one wake-up: one claim holds them back by k's
            # counter, and arms the claim at the counter's trust's end in its process alone)
            held = producer.put_many([{"hold": True}] * 4, key="k")
        # And a claim at the counter's trust's end has recounted k and held them again: read as
        # free before its lock, k's two slots were more than its claim of one job, so it did not
        # drain the queue, and it took nothing (before: it armed no claim at the next trust's end)
        wait_until(lambda: db.scalar(
            "SELECT k.counted_at >= MAX(j.created_at) + INTERVAL %s SECOND FROM nq_flow_key k "
            "JOIN nq_job j ON j.id IN %s WHERE k.queue = %s AND k.job_key = 'k' GROUP BY k.counted_at",
            (COUNT_TRUST_S, tuple(held), Q)), 3 * WITHIN_S, 0.05, message="k recounted after its trust ended")
        assert not set(held) & _started(tmp_path)
        # When a running job's row is deleted outside notifyq (its counter stays at 2)
        db.query("DELETE FROM nq_job WHERE id = %s", (running[0],))
        deleted_at = time.monotonic()
        # Then a held job starts once the counter's trust ends (before: at the watcher's 60 s
        # safety wake-up, with no claim at the trust's end in either process)
        wait_until(lambda: set(held) & _started(tmp_path), WITHIN_S, 0.05,
                   message="a held job started after the counter's trust ended")
        assert time.monotonic() - deleted_at < WITHIN_S
    finally:
        (tmp_path / "release").touch()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(60) for proc in procs]
    assert codes == [0, 0]
