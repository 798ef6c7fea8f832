"""The fault workload's job mix (workload.Mix): no server needed."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

from .schedule import CI_CLASSES, FAULT_CLASSES
from .workload import RARE_PER_MINUTE, Mix

ROOT = Path(__file__).resolve().parents[2]
CAPPED = {"slow": "slow", "long": "long", "kanji": "kanji", "fork": "fork"}  # kind -> RARE_PER_MINUTE's name


def kinds(jobs: int, duration_s: float | None, classes=FAULT_CLASSES, seed: int = 12) -> list[str]:
    mix = Mix(random.Random(seed), classes, 4.0, jobs, duration_s)
    return [mix.payload()[0] for _ in range(jobs)]


def test_the_ci_schedule_draws_the_same_jobs_with_or_without_the_cap():
    # Given the CI schedule's shape (3,000 jobs in 60 s), whose counts are the caps' per-minute ones
    for seed in (1, 2, 12):
        # When its mix is drawn with the run's duration (the cap) and without it
        # Then every job is the same kind with the same payload: CI's cost is unchanged
        with_cap = Mix(random.Random(seed), CI_CLASSES, 4.0, 3000, 60.0)
        without = Mix(random.Random(seed), CI_CLASSES, 4.0, 3000, None)
        assert [with_cap.payload() for _ in range(3000)] == [without.payload() for _ in range(3000)]


def test_a_long_run_has_the_rare_kinds_per_minute_of_ci_spread_over_the_run():
    # Given the long run's shape: 100,000 jobs in ten minutes
    drawn = kinds(100_000, 600.0)
    counts = Counter(drawn)

    # Then each rare kind is capped at its per-minute count (the job count alone gave 200 slow,
    # 200 long and 100 poison jobs: more consumer time than the run had)
    for kind, name in CAPPED.items():
        assert counts[kind] == RARE_PER_MINUTE[name] * 10, (kind, counts[kind])
    assert counts["poison"] + counts["unwind"] == RARE_PER_MINUTE["poison"] * 10
    # And they are not all drawn in the run's first minutes: the last of each kind comes after
    # 40 % of the jobs (thinned draws that passed to the next band once ended the long jobs at 28 %)
    for kind in (*CAPPED, "poison"):
        last = max(i for i, k in enumerate(drawn) if k == kind)
        assert last > 40_000, (kind, last)
    # And the common kinds keep their shares: a thinned draw is redrawn among them
    assert 0.025 < counts["fail1"] / 100_000 < 0.035
    assert 0.25 < counts["fx"] / 100_000 < 0.30


def test_a_seed_draws_the_same_jobs_in_every_process():
    # Given the long run's mix drawn from one seed in two fresh processes
    code = ("import hashlib, sys; sys.path.insert(0, 'tests'); from fault.test_workload import kinds; "
            "print(hashlib.sha256(repr(kinds(20_000, 120.0)).encode()).hexdigest())")
    # When each draws it, Then both draw the same jobs (a seed replays a run; the thinning and
    # effects streams were once seeded by hash(), which Python 3.11 varies per process)
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              cwd=ROOT).stdout for _ in range(2)}
    assert len(digests) == 1, digests
