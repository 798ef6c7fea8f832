"""Jobs of mixed duration across real `notifyq consume` processes (consume/lineup.py): a quick job
claimed behind a long one in one process is handed back and run by the other, idle, process."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from conftest import notifyq_cmd, wait_until

from notifyq.produce.producer import Producer
from notifyq.store.locks import QueueLocks

Q = "hol"


def starts(out: Path) -> list[tuple[int, int, int]]:
    """(job id, attempt, pid) per handler start."""
    found = []
    for path in out.glob("*.log"):
        for line in path.read_text().splitlines():
            job_id, attempt, pid = map(int, line.split())
            found.append((job_id, attempt, pid))
    return found


def test_quick_jobs_behind_a_long_one_run_in_the_other_idle_process_while_it_runs(db, tmp_path):
    # Given two idle consumer processes of one worker each (default batch_size 100, batch_target_s)
    conf = tmp_path / "notifyq.toml"
    conf.write_text("[wakeup]\npoll_max_s = 30\n[log]\nlevel = \"info\"\n")  # a poll would not find them in time
    env = {**db.env, "NQ_TEST_OUT": str(tmp_path), "NOTIFYQ_CONFIG": str(conf)}
    with open(tmp_path / "consumers.err", "a") as err:
        procs = [subprocess.Popen(notifyq_cmd("consume", "-q", Q, "--handler", "nqlineup:hold_or_record"),
                                  env=env, stdout=subprocess.DEVNULL, stderr=err) for _ in range(2)]
    watch = QueueLocks(db.dsn.database, Q).watch
    try:
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 2
                   and db.scalar("SELECT IS_USED_LOCK(%s)", (watch,)) is not None, 60,
                   message="two registered consumers, one watching")
        # When a long job and then 8 quick ones are put in one transaction (one claim sees all 9)
        with Producer(Q, db.config()) as producer:
            held, *quick = producer.put_many([{"hold": True}] + [{"n": i} for i in range(8)])
        wait_until(lambda: any(s[0] == held for s in starts(tmp_path)), 30, message="the long job started")
        # Then, while it still runs, all 8 start in the other process, each once, as its first
        # attempt (code before: they waited behind the long job in its batch, here until released)
        wait_until(lambda: len([s for s in starts(tmp_path) if s[0] in quick]) == 8, 15,
                   message="the quick jobs started")
        long_pid = next(pid for job_id, _, pid in starts(tmp_path) if job_id == held)
        runs = [s for s in starts(tmp_path) if s[0] in quick]
        assert sorted(job_id for job_id, _, _ in runs) == sorted(quick)
        assert {attempt for _, attempt, _ in runs} == {1}
        assert {pid for _, _, pid in runs} == {p.pid for p in procs} - {long_pid}
        assert not (tmp_path / "release").exists()
        # And once released, the long job ends and nothing is left or ran twice
        (tmp_path / "release").touch()
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = %s", (Q,)) == 0, 30,
                   message="every job done")
        assert len(starts(tmp_path)) == 9
        assert "handed back jobs waiting behind a long one" in (tmp_path / "consumers.err").read_text()
    finally:
        (tmp_path / "release").touch()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert [proc.wait(60) for proc in procs] == [0, 0]
