"""The short fault schedule, on every change: real consumers, a real server, seeded faults, and
the history checker's verdict on the delivery contract.

It runs every fault class but issue 26's long episodes (schedule.CI_CLASSES: the classes from
before issue 26 and its cheap ones, `cheap26`); benchmarks/fault_schedule.py runs the episodes.
Another seed, or fewer classes, without editing anything (`before26`: the set CI ran before):

    NOTIFYQ_FAULT_SEED=3 NOTIFYQ_FAULT_CLASSES=all,-polling .venv/bin/python -m pytest tests/fault/test_fault_schedule.py

A failure prints the seed and the command line that replays the schedule
(benchmarks/fault_schedule.py --seed N --classes ...).
"""

from __future__ import annotations

import os

from .harness import FaultRun
from .schedule import CI_CLASSES, make_plan, parse_classes

SEED = int(os.environ.get("NOTIFYQ_FAULT_SEED", "1"))
CLASSES = parse_classes(os.environ.get("NOTIFYQ_FAULT_CLASSES", ",".join(CI_CLASSES)))
DURATION_S = 60.0
JOBS = 3000


def test_a_seeded_fault_schedule_keeps_the_delivery_contract(tmp_path, server_template):
    # Given four consumers, producers enqueueing by every path, and a seeded schedule of faults
    plan = make_plan(SEED, CLASSES, DURATION_S, JOBS)

    # When the schedule runs and healthy consumers drain what is left
    result = FaultRun(plan, tmp_path / "run", template=server_template).run()

    # Then the checker finds nothing lost, no innocent job dead, no unexplained second run,
    # attempts within the rule, nothing stranded, the claim order kept
    print("\n" + result.summary())
    assert result.drained, result.summary()
    assert result.report.ok, result.summary()
    assert result.report.jobs >= JOBS * 0.9, result.summary()  # the workload really ran
