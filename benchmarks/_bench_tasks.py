"""A task for the cost benchmark's `--tasks` drain. Its job's payload carries the job's own id
(cost.py writes it after the fill), so the drain's exactly-once check reads the same ids."""

from __future__ import annotations

import notifyq

import _bench_handlers


@notifyq.task(queue="bench", name="bench.noop")
def noop(job_id: int) -> None:
    _bench_handlers.noop(_Ided(job_id))


class _Ided:
    __slots__ = ("id",)

    def __init__(self, job_id: int):
        self.id = job_id
