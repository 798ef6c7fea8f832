"""The consumer's periodic INFO summary: counts since the last line, rate, handler time, idle."""

import logging

from notifyq.consume.summary import Summary
from notifyq.consume.stats import Stats


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_summary_counts_the_window_and_says_idle_when_nothing_ran(caplog):
    caplog.set_level(logging.INFO, logger="notifyq.service")
    clock = Clock()
    summary = Summary(60.0, clock)
    stats = Stats()
    # Given 10 jobs done (one failed and retried) in the first minute
    stats.claimed, stats.succeeded, stats.failed, stats.retried = 11, 10, 1, 1
    for _ in range(11):
        stats.handler_seconds.observe(0.002)
    clock.now += 30
    summary.maybe_log([stats], busy=0, workers=2)
    assert caplog.messages == []  # not yet: once per minute
    clock.now += 30
    summary.maybe_log([stats], busy=1, workers=2)
    # Then one line with the window's figures
    (line,) = caplog.messages
    assert line == ("consumer summary window_s=60 done=10 failed=1 retried=1 dead=0 cancelled=0 rate=0.2/s "
                    "handler_avg_ms=2.0 busy=1/2 idle=no")
    # And a minute without work still says so: idle, not silence
    clock.now += 60
    summary.maybe_log([stats], busy=0, workers=2)
    assert caplog.messages[-1] == ("consumer summary window_s=60 done=0 failed=0 retried=0 dead=0 "
                                   "cancelled=0 rate=0.0/s handler_avg_ms=- busy=0/2 idle=yes")


def test_a_summary_interval_of_zero_turns_it_off(caplog):
    caplog.set_level(logging.INFO, logger="notifyq.service")
    clock = Clock()
    summary = Summary(0.0, clock)
    clock.now += 1e6
    summary.maybe_log([Stats()], busy=0, workers=1)
    assert caplog.messages == []


def test_a_batch_failure_logs_one_line_per_job_and_its_traceback_once(caplog):
    import datetime as dt

    from notifyq.consume.outcomes import _log_failure
    from notifyq.jobs import Job, run_of

    caplog.set_level(logging.INFO, logger="notifyq.consumer")
    now = dt.datetime.now(dt.timezone.utc)
    jobs = [Job(id=i, queue="b", payload={}, priority=0, attempts=1, max_attempts=3, run_at=now, created_at=now)
            for i in (7, 8)]
    for job in jobs:
        run_of(job).fail("RuntimeError: batch broke",
                         detail="Traceback (most recent call last):\n  ...\nRuntimeError: batch broke\n")
    logged: dict[str, int] = {}
    _log_failure(jobs[0], 2.0, jobs[0].error, logged)
    _log_failure(jobs[1], None, jobs[1].error, logged)
    first, second = caplog.records
    assert (first.levelname, first.kv["job"], first.kv["attempt"]) == ("WARNING", 7, "1/3")
    assert first.kv["next"].startswith("retry at 20") and first.kv["traceback"].endswith("RuntimeError: batch broke")
    assert (second.levelname, second.kv["next"], second.kv["traceback"]) == ("ERROR", "dead", "as for job 7")


def test_a_job_acked_by_two_sends_of_its_claim_counts_once_whichever_counts_first():
    from notifyq.config.settings import QueueConfig
    from notifyq.consume.outcomes import Outcomes
    from notifyq.store import queries

    for order in ("exact first", "read back first"):
        stats = Stats()
        outcomes = Outcomes("q", QueueConfig(), stats)
        # Given the same three jobs of claim 7 acked twice (the worker's send and the stop's):
        # one ack's fence counted all three; the other's found them acked already, and read
        # back which its claim had acked (Acks.landed)
        exact = queries.Acks([1, 2, 3], 7, False, tasks=["a", "b", "a"])
        read_back = queries.Acks([1, 2, 3], 7, False, tasks=["a", "b", "a"])
        read_back.landed = {1, 2, 3}
        counts = [(exact, 3), (read_back, 3)]
        # When both count, in either order
        for acks, acked in counts if order == "exact first" else reversed(counts):
            outcomes.count_acked(acks, acked)
        # Then each job counts done once, under its task, and none as lost
        assert stats.succeeded == 3, order
        assert {t: stats.by_task.of(t).counters["succeeded"] for t in "ab"} == {"a": 2, "b": 1}, order
        assert stats.lost_acks == 0, order
