"""Workflows under faults: real `notifyq consume` processes run a workflow while the test
SIGKILLs one mid-batch and KILLs another's connections; the workflow checker
(checker.check_workflow) then judges the history: no child starts before its parents are done,
none is released twice, none waits forever, each batch's callback commits once."""

from __future__ import annotations

import signal
from pathlib import Path

from conftest import RUNTIME_USER, admin_connect, wait_until

import notifyq
from notifyq.produce.producer import Producer

from . import checker
from .conftest import consumer_id_of, consumer_sessions, freeze_mid_batch, recorder_env

HANDLER = "nqhandlers:workflow_step"


def _effects_table(fdb) -> None:
    fdb.query("CREATE TABLE wf_effect (id INT AUTO_INCREMENT PRIMARY KEY, job_id BIGINT NOT NULL, pid INT NOT NULL)")
    conn = admin_connect(fdb.admin)
    for host in ("%", "localhost"):
        conn.cursor().execute(f"GRANT SELECT, INSERT ON `{fdb.admin.database}`.`wf_effect` TO '{RUNTIME_USER}'@'{host}'")
    conn.close()


def _workflow(fdb) -> tuple[list[tuple[int, int]], dict[int, int]]:
    """Chains, fan-outs and batches with callbacks, all on queue wf. Returns (edges, callbacks)."""
    wf = notifyq.Workflow()
    batches = []
    for b in range(6):
        root = wf.add("wf", {"b": b})
        chain = wf.chain("wf", [{"b": b, "c": i} for i in range(4)], after=[root])
        fan = [wf.add("wf", {"b": b, "f": i}, after=[chain[-1]]) for i in range(12)]
        batches.append((wf.batch([root, *chain, *fan], on_success=("wf", {"b": b, "cb": True})), 1 + 4 + 12))
    with Producer("wf", fdb.config()) as p:
        p.put_workflow(wf)
    edges = [tuple(r) for r in fdb.query("SELECT parent_id, child_id FROM nq_edge")]
    return edges, {batch.on_success.id: n for batch, n in batches}


def _runs(out: Path) -> list[checker.WorkflowRun]:
    starts: list[tuple[int, int, float]] = []
    ends: dict[tuple[int, int], list[float]] = {}
    for path in out.glob("*.wf"):
        for line in path.read_text().splitlines():
            kind, job, pid, t = line.split()
            if kind == "S":
                starts.append((int(job), int(pid), int(t) / 1e9))
            else:
                ends.setdefault((int(job), int(pid)), []).append(int(t) / 1e9)
    runs = []
    for job, pid, start in sorted(starts, key=lambda s: s[2]):
        # a run's end is the first end of its process for that job after its start
        later = [e for e in ends.get((job, pid), []) if e >= start]
        end = min(later) if later else None
        runs.append(checker.WorkflowRun(job, pid, start, end, end is not None))
    return runs


def test_a_workflow_under_sigkill_and_kill_connection_keeps_the_workflow_rules(fdb, procs, tmp_path):
    # Given a workflow of 6 batches (root, a chain of 4, a fan-out of 12, an on_success callback)
    _effects_table(fdb)
    out = tmp_path / "runs"
    env = recorder_env(fdb, out, sleep_s=0.02)
    edges, callbacks = _workflow(fdb)
    total = fdb.scalar("SELECT COUNT(*) FROM nq_job")
    consumers = [procs.consumer(env, "wf", "--batch-size", "5", handler=HANDLER) for _ in range(3)]
    ids = [consumer_id_of(fdb, c.pid) for c in consumers]

    def done() -> int:
        return fdb.scalar("SELECT COUNT(DISTINCT job_id) FROM wf_effect")

    # When one consumer is SIGKILLed in the middle of a batch
    wait_until(lambda: done() >= total // 5, 60, message="a fifth of the workflow done")
    freeze_mid_batch(fdb, consumers[0], ids[0])
    consumers[0].signal(signal.SIGKILL)
    consumers[0].wait(10)
    # And another's work session and its lock session are KILLed (a reaper may take its claims back)
    wait_until(lambda: done() >= total // 2, 60, message="half of the workflow done")
    work, lock, _ = consumer_sessions(fdb, consumers[1].pid)
    fdb.query(f"KILL CONNECTION {int(work)}")
    fdb.query(f"KILL CONNECTION {int(lock)}")
    procs.consumer(env, "wf", "--batch-size", "5", handler=HANDLER)  # a replacement

    # Then the whole workflow ends: nothing pending, nothing waiting
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_job WHERE status IN (0, 1, 2, 6)") == 0, 120, 0.2,
               "the workflow drained")
    final = {job: status for job, status in fdb.query("SELECT id, status FROM nq_job")}
    for parent, child in edges:
        final.setdefault(parent, None)
        final.setdefault(child, None)
    effects = {job: n for job, n in fdb.query("SELECT job_id, COUNT(*) FROM wf_effect GROUP BY job_id")}
    # And the workflow rules hold: no early start, no second release, no child left, callbacks once
    violations = checker.check_workflow(_runs(out), edges, final, callbacks, effects)
    assert violations == [], "\n".join(map(str, violations[:10]))
    # And every job completed once (the fenced completion), callbacks included
    assert len(effects) == total and set(effects.values()) == {1}
    assert fdb.scalar("SELECT COUNT(*) FROM nq_edge WHERE state <> 2") == 0
    print(f"\nworkflow under faults: {total} jobs, {len(edges)} edges, {len(_runs(out))} runs")
