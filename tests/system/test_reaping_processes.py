"""Nothing stays claimed by a consumer that is gone, and nothing live is reaped, whatever mode the
consumers run in: `--exit-when-empty` reaps before it exits, polling consumers (no liveness lock)
are judged by heartbeat and lease, and mix with lock-mode consumers on one queue."""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import time
from pathlib import Path

from conftest import admin_connect, notifyq_cmd, run_cli, wait_until
from notifyq.store.signal import SIGNAL_SLOTS

QUEUE = "t"


def _config(tmp_path: Path, name: str, use_locks: bool = True, lease_s: float | None = None,
            hand_back: bool = True, session_idle_s: int | None = None) -> Path:
    """hand_back=False: batch_target_s = 0, a batch's jobs stay with their claim (consume/lineup.py)."""
    path = tmp_path / f"{name}.toml"
    text = "[consumer]\nreap_interval_s = 0.5\n"
    if session_idle_s is not None:
        text += f"session_idle_s = {session_idle_s}\n"
    text += f"[wakeup]\npoll_max_s = 0.2\nuse_locks = {'true' if use_locks else 'false'}\n[defaults]\n"
    if lease_s is not None:
        text += f"lease_s = {lease_s}\n"
    if not hand_back:
        text += "batch_target_s = 0\n"
    path.write_text(text)
    path.chmod(0o600)
    return path


def _env(db, tmp_path: Path, config: Path, sleep_s: float) -> dict[str, str]:
    out = tmp_path / "runs"
    out.mkdir(exist_ok=True)
    return {**db.env, "NQ_TEST_OUT": str(out), "NQ_TEST_SLEEP": str(sleep_s), "NOTIFYQ_CONFIG": str(config)}


class Consumers:
    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.started: list[subprocess.Popen] = []

    def start(self, env: dict[str, str], *args: str, handler: str = "nqhandlers:record_slow") -> subprocess.Popen:
        err = (self.tmp_path / f"consume-{len(self.started)}.err").open("w")
        proc = subprocess.Popen(notifyq_cmd("consume", "-q", QUEUE, "--handler", handler, *args), env=env,
                                stdout=subprocess.DEVNULL, stderr=err, text=True)
        self.started.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(30)


def _produce(db, n: int) -> list[int]:
    result = run_cli(db.env, "produce", "-q", QUEUE, *[f'{{"n": {i}}}' for i in range(n)])
    assert result.returncode == 0, result.stderr
    return [int(x) for x in result.stdout.split()]


def _finished(tmp_path: Path) -> collections.Counter:
    """How many times each job's handler finished (record_slow writes a " start" line first)."""
    counts: collections.Counter = collections.Counter()
    for path in (tmp_path / "runs").glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                counts[int(parts[0])] += 1
    return counts


def _started_by(tmp_path: Path) -> set[int]:
    """Pids that started a job."""
    return {int(line.split()[2]) for path in (tmp_path / "runs").glob("*.log")
            for line in path.read_text().splitlines() if line.endswith(" start")}


def _claimed_by(db, pid: int) -> int:
    return db.scalar("SELECT COUNT(*) FROM nq_job j JOIN nq_consumer c ON c.id = j.owner "
                     "WHERE c.pid = %s AND j.status = 2", (pid,))


def _killed_holding_five(db, tmp_path, consumers):
    """A consumer that claimed 5 slow jobs, then SIGKILLed: its env and the jobs' ids."""
    env = _env(db, tmp_path, _config(tmp_path, "nq"), sleep_s=60)
    victim = consumers.start(env, "--batch-size", "5")
    ids = _produce(db, 5)
    wait_until(lambda: _claimed_by(db, victim.pid) == 5, 30, message="the victim holds all 5 jobs")
    victim.kill()
    victim.wait(10)
    return env, ids


def test_exit_when_empty_takes_back_a_killed_consumers_jobs_and_runs_them(db, tmp_path):
    consumers = Consumers(tmp_path)
    try:
        # Given a consumer that claimed 5 slow jobs and was then SIGKILLed
        env, ids = _killed_holding_five(db, tmp_path, consumers)
        # When `consume --exit-when-empty` runs
        result = subprocess.run(notifyq_cmd("consume", "-q", QUEUE, "--handler", "nqhandlers:record",
                                            "--exit-when-empty"),
                                env={**env, "NQ_TEST_SLEEP": "0"}, capture_output=True, text=True, timeout=60)
        # Then it took the dead consumer's jobs back and handled them before exiting 0
        print(f"\n--exit-when-empty after a killed consumer: {len(_finished(tmp_path))} of 5 handled")
        assert result.returncode == 0, result.stderr
        assert sorted(_finished(tmp_path)) == ids, result.stderr
        assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
        assert db.scalar("SELECT COUNT(*) FROM nq_consumer") == 0
    finally:
        consumers.close()


def test_a_consumer_takes_back_a_dead_peers_jobs_before_its_own_first_claim(db, tmp_path):
    consumers = Consumers(tmp_path)
    try:
        # Given a consumer that claimed 5 slow jobs and was then SIGKILLed, and 5 newer jobs
        env, held = _killed_holding_five(db, tmp_path, consumers)
        _produce(db, 5)
        # When a consumer starts (a cron run, one job only) and claims a batch of 10
        result = subprocess.run(notifyq_cmd("consume", "-q", QUEUE, "--handler", "nqhandlers:record",
                                            "--exit-when-empty", "--max-jobs", "1", "--batch-size", "10"),
                                env={**env, "NQ_TEST_SLEEP": "0"}, capture_output=True, text=True, timeout=60)
        # Then it reaped before that claim: the oldest of the dead consumer's jobs ran first
        assert result.returncode == 0, result.stderr
        assert list(_finished(tmp_path)) == [held[0]], result.stderr
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2") == 0
    finally:
        consumers.close()


def test_a_polling_and_a_lock_mode_consumer_on_one_queue_never_run_a_job_twice(db, tmp_path):
    consumers = Consumers(tmp_path)
    try:
        # Given a polling consumer and a lock-mode consumer on one queue, with a lease (3 s)
        # shorter than a batch takes (6 jobs x 0.6 s): only the polling consumer's heartbeat
        # keeps its waiting jobs' leases
        polling = consumers.start(_env(db, tmp_path, _config(tmp_path, "polling", False, 3), 0.6),
                                  "--batch-size", "6")
        # (the lock-mode one takes a job at a time: its batch stays inside its lease, which
        # nothing extends for jobs still waiting in a batch)
        locking = consumers.start(_env(db, tmp_path, _config(tmp_path, "locks", True, 3), 0.6),
                                  "--batch-size", "1")
        for proc in (polling, locking):
            wait_until(lambda p=proc: db.scalar("SELECT COUNT(*) FROM nq_consumer WHERE pid = %s", (p.pid,)),
                       30, message="both consumers registered")
        # When 12 slow jobs are produced
        ids = _produce(db, 12)
        wait_until(lambda: polling.pid in _started_by(tmp_path), 30, message="the polling consumer at work")
        # Then `status` lists the polling consumer as alive while it works
        status = run_cli(db.env, "status", "--json")
        assert status.returncode == 0, status.stderr
        mine = [c for c in json.loads(status.stdout)["consumers"] if c["pid"] == polling.pid]
        assert mine and mine[0]["wakeup"] == "polling" and mine[0]["alive"], mine
        assert "DEAD" not in run_cli(db.env, "status").stdout
        # And every job runs exactly once
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0, 60, 0.1, "all 12 jobs done")
        counts = _finished(tmp_path)
        assert sorted(counts) == ids
        assert max(counts.values()) == 1, f"{sum(n > 1 for n in counts.values())} of 12 jobs ran twice: {counts}"
        assert polling.poll() is None and locking.poll() is None
    finally:
        consumers.close()


def _polling_victim(db, tmp_path, consumers: Consumers, stop_signal: int) -> float:
    """A polling consumer holding 4 slow jobs gets `stop_signal`; a lock-mode consumer is there.
    Returns how long the jobs took to come back to the survivor."""
    # Hand-back off: with it, the victim gives the 3 jobs waiting behind its running one back
    # batch_target_s (50 ms) after its claim (a polling consumer cannot see whether anyone
    # idles), so "holds all 4" lasted a few ms, missed by the wait below under load, and a stop
    # signal could land inside that give-back's transaction (test_a_consumer_frozen_inside_a_give_back_...)
    victim = consumers.start(_env(db, tmp_path, _config(tmp_path, "polling", False, 3, hand_back=False), 60),
                             "--batch-size", "4")
    wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer WHERE pid = %s", (victim.pid,)), 30,
               message="the polling consumer registered")
    ids = _produce(db, 4)
    wait_until(lambda: _claimed_by(db, victim.pid) == 4, 30, message="the polling consumer holds all 4 jobs")
    consumers.start(_env(db, tmp_path, _config(tmp_path, "locks", True, 3), 0), "--batch-size", "4",
                    handler="nqhandlers:record")
    victim.send_signal(stop_signal)
    stopped_at = time.monotonic()
    wait_until(lambda: sorted(_finished(tmp_path)) == ids, 60, 0.05, "the survivor ran the 4 jobs")
    return time.monotonic() - stopped_at


def test_a_killed_polling_consumers_jobs_come_back_within_its_lease(db, tmp_path):
    consumers = Consumers(tmp_path)
    try:
        took = _polling_victim(db, tmp_path, consumers, signal.SIGKILL)
        assert took < 3 + 5, f"came back after {took:.1f}s"
    finally:
        consumers.close()


def test_a_stalled_polling_consumers_jobs_come_back_within_its_lease(db, tmp_path):
    consumers = Consumers(tmp_path)
    try:
        took = _polling_victim(db, tmp_path, consumers, signal.SIGSTOP)
        assert took < 3 + 5, f"came back after {took:.1f}s"
    finally:
        consumers.close()


def _bumping(db) -> list[tuple[int, str, str | None]]:
    """(id, COMMAND, INFO) of the sessions of this test's database running a signal bump, read
    live from the processlist (information_schema.innodb_trx is a copy refreshed at most every
    0.1 s: it showed a lock wait over, or a rolled-back lock still held)."""
    return db.query("SELECT ID, COMMAND, INFO FROM information_schema.processlist "
                    "WHERE DB = %s AND INFO LIKE %s", (db.admin.database, "INSERT INTO nq_signal%"))


def test_a_consumer_frozen_inside_a_give_back_holds_its_jobs_no_longer_than_session_idle_s(db, tmp_path):
    consumers = Consumers(tmp_path)
    blocker = admin_connect(db.admin, db.admin.database)
    try:
        # Given 4 slow jobs, and every signal slot of their queue locked by the test, so that
        # a give-back (its UPDATE of the jobs, then the bump of a slot) waits in its transaction
        ids = _produce(db, 4)
        cur = blocker.cursor()
        cur.executemany("INSERT INTO nq_signal (queue, slot, seq) VALUES (%s, %s, 0) "
                        "ON DUPLICATE KEY UPDATE seq = seq", [(QUEUE, slot) for slot in range(SIGNAL_SLOTS)])
        cur.execute("BEGIN")
        cur.execute("SELECT slot FROM nq_signal WHERE queue = %s FOR UPDATE", (QUEUE,))
        # When a polling consumer claims them, hands the 3 behind its running one back (its
        # batch_target_s), is frozen (SIGSTOP) while that give-back waits, and the lock goes:
        # its give-back's statements are done, its COMMIT never comes
        env = _env(db, tmp_path, _config(tmp_path, "polling", False, 3, session_idle_s=2), 60)
        victim = consumers.start(env, "--batch-size", "4")
        (giver, _, _), = wait_until(lambda: _bumping(db), 30, message="the victim's give-back waiting for a slot")
        victim.send_signal(signal.SIGSTOP)
        blocker.rollback()
        # (its connection gone is as good: the server ended it after session_idle_s already)
        wait_until(lambda: db.scalar("SELECT COMMAND FROM information_schema.processlist WHERE ID = %s",
                                     (giver,)) in ("Sleep", None), 30, message="the give-back's bump done")
        stopped_at = time.monotonic()
        consumers.start(_env(db, tmp_path, _config(tmp_path, "locks", True, 3), 0), "--batch-size", "4",
                        handler="nqhandlers:record")
        # Then the server ends the frozen transaction after session_idle_s, and the jobs come
        # back to the survivor by their leases (3 s, run out by then), not after the server's
        # wait_timeout (8 h), for which its row locks kept every reaper pass waiting
        wait_until(lambda: sorted(_finished(tmp_path)) == ids, 30, 0.05, "the survivor ran the 4 jobs")
        took = time.monotonic() - stopped_at
        assert took < 2 + 5, f"came back after {took:.1f}s"
    finally:
        blocker.close()
        consumers.close()
