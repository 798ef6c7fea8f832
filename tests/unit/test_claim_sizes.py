"""Jobs of mixed duration (consume/lineup.py): claim sizes by time per job, and a batch's hand-back
of what waits behind its running job (pure)."""

import datetime as dt

from notifyq.consume.batch import Batch
from notifyq.consume.lineup import ClaimSizer
from notifyq.jobs import Job, run_of


def jobs(n: int) -> list[Job]:
    now = dt.datetime(2026, 1, 1)
    return [Job(id=i, queue="q", payload="{}", priority=0, attempts=1, max_attempts=5, run_at=now,
                created_at=now) for i in range(1, n + 1)]


def test_a_claim_takes_about_the_target_of_work_at_least_one_job_at_most_batch_size():
    sizer = ClaimSizer()
    assert sizer.size(100, 0.1) == 100  # nothing timed yet: a full batch
    sizer.observe(0.001, 1)  # quick jobs keep full batches
    assert sizer.size(100, 0.1) == 100
    sizer = ClaimSizer()
    sizer.observe(0.2, 4)  # a batch of 4 jobs ran in 0.2 s: 50 ms each
    assert sizer.size(100, 0.1) == 2
    sizer.observe(4.0, 1)  # a long job: one at a time
    assert sizer.size(100, 0.1) == 1
    assert sizer.size(100, 0) == 100  # the rule off


def test_the_average_forgets_a_long_job_within_some_quick_jobs():
    sizer = ClaimSizer()
    sizer.observe(4.0, 1)
    calls = 0
    while sizer.size(100, 0.1) < 100:
        sizer.observe(0.0005, 1)
        calls += 1
    assert 30 <= calls <= 50  # weight 0.2: the excess over 0.5 ms shrinks by 0.8 per call, to under 1 ms


def test_a_batch_of_n_jobs_moves_the_average_as_n_jobs_one_by_one_would():
    one_by_one, at_once = ClaimSizer(), ClaimSizer()
    one_by_one.observe(4.0, 1)
    at_once.observe(4.0, 1)
    for _ in range(10):
        one_by_one.observe(0.001, 1)
    at_once.observe(0.010, 10)
    assert abs(one_by_one.job_s - at_once.job_s) < 1e-9


def test_a_hand_back_takes_the_waiting_jobs_only_while_a_job_runs_and_they_never_start():
    batch = Batch(token=7, jobs=jobs(4), lease_s=30.0, claimed_at=0.0)
    assert batch.hand_back() is None  # nothing runs yet: its worker is about to start the first
    assert batch.given_back.is_set()  # nothing on its way back: the worker's next claim need not wait
    assert [j.id for j in batch.start_next(1)] == [1]
    assert batch.hand_back() == [2, 3, 4]
    assert not batch.given_back.is_set()  # until the watch says their give-back ended
    assert batch.waiting() == [] and batch.held() == [1]  # no extension covers them any more
    batch.finish()
    assert batch.start_next(1) == []  # the next group ends before a job that is not ours
    assert batch.hand_back() is None


class Handler:
    def __init__(self, per_batch=False, concurrency=1):
        self.per_batch, self.concurrency = per_batch, concurrency


def test_a_per_batch_handler_claims_whole_batches_and_a_coroutine_handler_at_least_a_group():
    sizer = ClaimSizer()
    sizer.observe(1.0, 10)  # 0.1 s per job
    assert sizer.size_for(Handler(), 100, 0.1) == 1
    assert sizer.size_for(Handler(per_batch=True), 100, 0.1) == 100  # one call runs the batch
    assert sizer.size_for(Handler(concurrency=50), 100, 0.1) == 50  # one group runs at once
    assert sizer.size_for(Handler(concurrency=500), 100, 0.1) == 100


def test_a_batchs_pace_spans_its_first_start_to_its_last_end_over_the_jobs_that_ran():
    # Given a batch of 4 whose third job was taken back before it started
    batch = Batch(token=7, jobs=jobs(4), lease_s=30.0, claimed_at=0.0)
    batch.lost.add(3)
    # When its jobs run in claim order, the lost one passed over, the last two as one group
    spans = []
    for size in (1, 1):
        [job] = batch.start_next(size)
        batch.finish()
        spans.append(job)
    assert batch.start_next(1) == []  # the next is not ours: it is skipped, never started
    batch.skip()
    [last] = batch.start_next(2)
    batch.finish()
    # Then the pace counts the 3 jobs that ran, from the first one's start to the last one's end
    runs = [run_of(j) for j in (*spans, last)]
    assert batch.ran == 3
    assert (batch.first_start, batch.last_end) == (runs[0].started, runs[-1].ended)
    assert all(r.started <= r.ended for r in runs)
