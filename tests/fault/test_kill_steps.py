"""Durable steps under SIGKILL: consumers killed again and again in the middle of jobs made of
steps; each step's effect (written in its step transaction, or inside job.transaction()) lands
exactly once, and the runs that took jobs over skipped the steps that had finished."""

from __future__ import annotations

import signal

from conftest import admin_connect, wait_until

from .conftest import consumer_id_of, produce, recorder_env

STEPS = ("reserve", "charge", "ship", "notify")  # tests/helpers/nqsteps.py
JOBS = 150  # enough that the survivors have not drained the queue before the sixth kill, on a loaded machine
KILLS = 6


def _effects_table(fdb) -> None:
    conn = admin_connect(fdb.admin, fdb.admin.database)
    try:
        cur = conn.cursor()
        cur.execute("CREATE TABLE step_effect (id BIGINT AUTO_INCREMENT PRIMARY KEY, job_id BIGINT UNSIGNED NOT NULL, "
                    "step VARCHAR(16) NOT NULL, attempt INT NOT NULL, pid INT NOT NULL)")
        for host in ("%", "localhost"):
            cur.execute(f"GRANT SELECT, INSERT ON `{fdb.admin.database}`.`step_effect` TO '{fdb.dsn.user}'@'{host}'")
    finally:
        conn.close()


def test_each_steps_effect_lands_exactly_once_while_consumers_are_sigkilled_mid_job(fdb, procs, tmp_path):
    # Given jobs of four steps each (three step transactions, one inside job.transaction()), and
    # two consumers that linger 50 ms in each step
    _effects_table(fdb)
    env = recorder_env(fdb, tmp_path / "runs", sleep_s=0.05)
    consumers = [procs.consumer(env, "st", "--batch-size", "2", handler="nqsteps:steps") for _ in range(2)]
    for proc in consumers:
        consumer_id_of(fdb, proc.pid)
    produce(fdb, "st", JOBS)

    # When, again and again, a consumer is SIGKILLed as soon as it wrote a step's effect in an
    # open transaction (a row of its own pid not committed yet is not visible: so the kill is
    # timed by its committed effects advancing), and a fresh one takes its place
    killed_mid_step = 0
    for n in range(KILLS):
        victim = consumers[n % 2]
        before = fdb.scalar("SELECT COUNT(*) FROM step_effect WHERE pid = %s", (victim.pid,))
        wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM step_effect WHERE pid = %s", (victim.pid,)) > before,
                   60, 0.005, f"kill {n}: the victim at work")
        # Each step lingers 50 ms inside its transaction after its write: the kill lands in one
        # (or between two), never after the job's end only
        victim.signal(signal.SIGKILL)
        victim.wait(10)
        killed_mid_step += 1
        consumers[n % 2] = procs.consumer(env, "st", "--batch-size", "2", handler="nqsteps:steps")
        consumer_id_of(fdb, consumers[n % 2].pid)

    # Then every job ends done (its row deleted), with no job dead
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_job") == 0, 120, 0.1, "all jobs done")
    assert fdb.scalar("SELECT COUNT(*) FROM nq_attempt WHERE outcome = 'dead'") == 0

    # And each step's effect landed exactly once per job, and its record with it
    effects = fdb.query("SELECT job_id, step, COUNT(*) FROM step_effect GROUP BY job_id, step")
    counts = {(int(job), step): int(n) for job, step, n in effects}
    jobs = {job for job, _ in counts}
    assert len(jobs) == JOBS
    assert {(job, step) for job in jobs for step in STEPS} == set(counts)
    twice = {key: n for key, n in counts.items() if n != 1}
    assert not twice, f"steps whose effect landed more than once: {twice}"
    assert fdb.scalar("SELECT COUNT(*) FROM nq_step") == JOBS * len(STEPS)

    # And the kills did land mid-job: some jobs were finished by another process than the one that
    # did their first steps, which the taking-over run skipped
    spread = fdb.scalar("SELECT COUNT(*) FROM (SELECT job_id FROM step_effect GROUP BY job_id "
                        "HAVING COUNT(DISTINCT pid) > 1) t")
    assert spread >= 1, "no kill landed in the middle of a job"
    print(f"\nSIGKILL mid-steps: {killed_mid_step} kills, {spread} of {JOBS} jobs finished by another process, "
          f"each of {len(STEPS)} steps' effects once")
