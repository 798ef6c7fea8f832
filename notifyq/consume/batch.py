"""Batch: one claim in a worker's hands — which jobs have started, which run, which wait, and
when the lease of those still held must be pushed out.

The claim's lease covers every job of the batch from the claim on. Jobs that wait behind a
long-running one would see it run out while their consumer is alive and well, and a reaper
would hand them to another consumer: the batch would run them twice. So the worker pushes the
lease of the jobs it still holds out again, in one statement, at most every lease/3, before
it starts the next job; the answer says which jobs are still its own, and a job that is not
is never started. The service reads `running` and `waiting()` from its own thread at shutdown.
"""

from __future__ import annotations

import threading
import time

from notifyq.jobs import Job
from notifyq.store.pipeline import Pending

EXTEND_EVERY = 1 / 3  # of the lease: two more chances to extend before it would run out


class Batch:
    def __init__(self, token: int, jobs: list[Job], lease_s: float, claimed_at: float,
                 commit: Pending | None = None, owner: str = "", epoch: int = 0):
        self.token = token
        self.owner = owner  # the consumer id claimed under
        self.epoch = epoch  # the Presence's registration it was made (or last confirmed) in
        self.commit = commit  # the claim's COMMIT, sent ahead: read at the session's next statement
        self.jobs = jobs
        self.lease_s = lease_s  # the claim's own: a reload changes the next claims' lease, not this one
        self.extended_at = claimed_at  # monotonic, taken before the statement was sent
        self.started = 0  # jobs[:started] have been handed to the handler
        self.running: list[Job] = []  # in the handler right now
        # Finished, outcome not yet sent (acks go out about once a second): still claimed, so
        # still covered by every extension. A long job's extend_lease() once pushed out its own
        # lease alone, and the finished jobs before it expired and ran again elsewhere.
        self.done: list[Job] = []
        self.settled = threading.Event()  # its worker is done with it (the service waits at shutdown)
        self.lost: set[int] = set()  # taken back from us (their lease ran out) before they started
        # timeout_s: helper threads whose call timed out (their extensions are refused: the work
        # session is not theirs any more), under handler_lock with every handler's extension
        self.revoked: set[int] = set()
        self.handler_lock = threading.Lock()

    def claim_lost(self) -> bool:
        """The claim's COMMIT failed (or its connection was lost) after its jobs began to run:
        none of them is ours to start any more (the rest are given back, fenced by token)."""
        return self.commit is not None and self.commit.failed

    def waiting(self) -> list[int]:
        """Ids of the jobs not started yet that are still ours."""
        return [j.id for j in self.jobs[self.started:] if j.id not in self.lost]

    def held(self) -> list[int]:
        """What a lease extension covers: every job whose outcome is not sent yet."""
        return [j.id for j in self.done] + [j.id for j in self.running] + self.waiting()

    def extend_due(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return now - self.extended_at >= self.lease_s * EXTEND_EVERY

    def extended(self, asked: list[int], owned: list[int], sent_at: float) -> list[int]:
        """Record an extension's answer; returns the waiting ids we no longer own."""
        self.extended_at = sent_at
        started = {j.id for j in self.running} | {j.id for j in self.done}
        gone = [job_id for job_id in set(asked) - set(owned) if job_id not in started]
        self.lost.update(gone)
        return sorted(gone)

    def taken_back(self) -> list[int]:
        """The whole claim is someone else's now: none of what waits is ours to start. Returns
        the ids that waited."""
        gone = self.waiting()
        self.lost.update(gone)
        return gone

    def skip(self) -> None:
        """The next job is lost: pass over it without starting it."""
        self.started += 1

    def next_group(self, size: int) -> list[Job]:
        """The next jobs to start together: up to `size`, in claim order, ending before a job
        that is no longer ours (start() counts from `started`)."""
        group: list[Job] = []
        for job in self.jobs[self.started:self.started + size]:
            if job.id in self.lost:
                break
            group.append(job)
        return group

    def start(self, jobs: list[Job]) -> None:
        self.started += len(jobs)
        self.running = jobs
        now = time.monotonic()
        for job in jobs:
            job._started = now

    def finish(self) -> None:
        now = time.monotonic()
        for job in self.running:
            job._ended = now
        self.done += self.running
        self.running = []

    def take_done(self) -> list[Job]:
        """The finished jobs, for their outcomes to be sent: no longer the batch's to extend."""
        done, self.done = self.done, []
        return done
