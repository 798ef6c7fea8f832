"""Batch: what a worker still holds of a claim, and when its lease must be pushed out (pure)."""

import datetime as dt

from notifyq.consume.batch import Batch
from notifyq.jobs import Job


def jobs(n: int) -> list[Job]:
    now = dt.datetime(2026, 1, 1)
    return [Job(id=i, queue="q", payload="{}", priority=0, attempts=1, max_attempts=5, run_at=now,
                created_at=now) for i in range(1, n + 1)]


def test_the_lease_is_extended_at_most_every_third_of_it_counted_from_the_claim():
    batch = Batch(token=7, jobs=jobs(3), lease_s=30.0, claimed_at=100.0)
    assert not batch.extend_due(109.9)
    assert batch.extend_due(110.0)
    batch.extended([1, 2, 3], [1, 2, 3], sent_at=110.0)
    assert not batch.extend_due(119.9) and batch.extend_due(120.0)


def test_an_extension_covers_the_running_job_and_the_waiting_ones_and_names_the_lost():
    batch = Batch(token=7, jobs=jobs(4), lease_s=30.0, claimed_at=0.0)
    batch.start(batch.jobs[:1])
    batch.finish()
    # A finished job whose ack is not sent yet is still claimed: an extension covers it (issue 26:
    # a long job's extend_lease() left it out, and it expired and ran again elsewhere)
    batch.start(batch.jobs[1:2])
    assert batch.held() == [1, 2, 3, 4]
    assert [j.id for j in batch.take_done()] == [1]  # its ack went out
    assert batch.held() == [2, 3, 4]
    # Job 3 was taken back; the running job 2 too (it is not skipped: it already runs)
    assert batch.extended([2, 3, 4], [4], sent_at=12.0) == [3]
    assert batch.lost == {3}
    batch.finish()
    assert batch.waiting() == [4]
    batch.skip()  # job 3
    assert batch.waiting() == [4]
    batch.start(batch.jobs[3:])
    assert batch.waiting() == [] and batch.held() == [2, 4]  # 2 finished, its ack not yet sent


class _FailedCommit:
    settled = failed = True


def test_a_claim_taken_again_after_its_commit_failed_is_settled_and_what_it_lost_is_not_started():
    batch = Batch(token=7, jobs=jobs(4), lease_s=30.0, claimed_at=0.0, commit=_FailedCommit())
    batch.start(batch.jobs[:1])
    batch.finish()
    assert batch.claim_lost()
    # Retaken: jobs 1 (it ran) and 3 are held again; a peer took 2 and 4 meanwhile
    assert batch.retaken([1, 3]) == [2, 4]
    assert not batch.claim_lost()
    assert batch.waiting() == [3] and batch.next_group(3) == []  # job 2 comes first: skipped
    batch.skip()
    assert [j.id for j in batch.next_group(3)] == [3]


def test_at_the_stop_a_batch_starts_nothing_more_and_what_waits_behind_a_running_job_is_taken():
    # Between two jobs (its worker may have looked at the stop just before it came): nothing is
    # taken, the worker gives back what waits itself, and starts nothing more
    between = Batch(token=7, jobs=jobs(3), lease_s=30.0, claimed_at=0.0)
    assert between.stop_starting() is None
    assert between.start_next(1) == [] and between.waiting() == [1, 2, 3]
    # Behind a running job: the waiting jobs are taken (not ours to start), until their give-back ended
    batch = Batch(token=7, jobs=jobs(3), lease_s=30.0, claimed_at=0.0)
    assert [j.id for j in batch.start_next(1)] == [1]
    assert batch.stop_starting() == [2, 3]
    assert batch.waiting() == [] and batch.held() == [1] and not batch.given_back.is_set()
    assert batch.handed_back == 0  # counted by the stop's give-back, not the lineup watch's
    # A give-back that failed: the batch's again, to give back as it ends, and never started
    batch.not_given_back([2, 3])
    batch.finish()
    assert batch.waiting() == [2, 3] and batch.held() == [1, 2, 3]
    assert batch.start_next(1) == []
    # A per-batch handler's batch: everything runs, nothing waits
    whole = Batch(token=7, jobs=jobs(3), lease_s=30.0, claimed_at=0.0)
    whole.start(whole.jobs)
    assert whole.stop_starting() == [] and whole.given_back.is_set()
