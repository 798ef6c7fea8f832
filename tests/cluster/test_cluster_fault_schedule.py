"""The fault schedule on a 3-node Galera cluster, on every change: real consumer processes and
two producers (one of them ringing the consumers' bell) through one multi-host DSN, while the
writer node is SIGKILLed and restarted, a node (the writer first) is paused and resumed, and
consumers are SIGKILLed; then the history checker (tests/fault/checker.py).

Another seed without editing anything:

    NOTIFYQ_FAULT_SEED=3 .venv/bin/python -m pytest tests/cluster/test_cluster_fault_schedule.py

The long run with a table: benchmarks/fault_schedule.py --galera
"""

from __future__ import annotations

import dataclasses
import os

from fault.schedule import make_cluster_plan

from .conftest import FAST_EVICTION, requires_galera
from .fault_run import ClusterFaultRun, failover_summary, verdict

pytestmark = requires_galera

SEED = int(os.environ.get("NOTIFYQ_FAULT_SEED", "1"))
DURATION_S = 40.0
JOBS = 1200


def test_the_fault_schedule_on_a_cluster_keeps_the_delivery_contract_across_failovers(tmp_path):
    # Given three consumers, two producers, and a schedule that kills the writer node and then
    # pauses the writer node (20 s apart), with consumer SIGKILLs in between
    plan = make_cluster_plan(SEED, DURATION_S, JOBS, node_every_s=20.0)
    plan = dataclasses.replace(plan, steps=tuple(
        dataclasses.replace(s, pick=0.0) if s.kind == "node_pause" else s for s in plan.steps))  # the writer
    run = ClusterFaultRun(plan, tmp_path / "run", provider_options=FAST_EVICTION)

    # When the schedule runs, and healthy consumers drain what is left
    result = run.run()
    failovers = run.failovers(result.history)

    # Then the checker finds nothing lost, no innocent job dead, every second run explained by a
    # fault (duplicates only from batches in flight at a failover), attempts within the rule, and
    # no key of the limited queue past its limit_per_key across the failovers (key_limit: the
    # new writer counts the claimed rows the cluster committed)
    print("\n" + result.summary())
    print(f"failovers: {failovers}\n{failover_summary(failovers)}")
    print(f"duplicates by cause: {result.report.duplicates}")
    assert result.drained, result.summary()
    assert result.report.ok, result.summary()
    assert result.report.lost == 0 and result.report.innocent_dead == 0
    # And both writer faults happened and were failed over (a job enqueued after each was handled)
    kinds = sorted(f["fault"] for f in failovers if f["writer"])
    assert kinds == ["node_pause", "writer_kill"], failovers
    assert all(f["failover_s"] is not None for f in failovers), failovers
    # And every consumer slot still ran at the end, and no live consumer was reaped
    assert result.report.jobs >= JOBS * 0.9, result.summary()
    # (false reclaims included: a live consumer reaped while its liveness session reconnected,
    # after a failed watch hand-on, a move to a new writer, or the loss of the primary component)
    assert not verdict(result), verdict(result)
