"""The order a fair queue's claimed batch starts its jobs in.

A claim's rows come back in claim order (priority, run_at, id: queries.claim sorts what it
locked), so a fair claim that took 50 jobs of key A and 3 of key B, B's put after A's, started
all 50 A before the first B: fairness decided what was claimed, not what ran first. A batch
runs its jobs one after another, so a fair queue's batch is started round-robin by key, as the
claim took them: each key's first job, then each key's second, and so on; claim order inside
each round, and inside each key.
"""

from __future__ import annotations

from notifyq.jobs import Job


def round_robin_by_key(jobs: list[Job]) -> list[Job]:
    """`jobs` (in claim order) reordered round-robin by key; a job without a key counts as its
    own key (None). One key, or none: the same list."""
    turn: dict[str | None, int] = {}
    ranked = []
    for position, job in enumerate(jobs):
        rank = turn.get(job.key, 0)
        turn[job.key] = rank + 1
        ranked.append((rank, position))
    if len(turn) < 2:
        return jobs
    return [jobs[position] for _, position in sorted(ranked)]
