"""The history checker catches what it is there to catch: planted violations in synthetic
histories (no server needed), and clean histories pass."""

from __future__ import annotations

import dataclasses

from . import checker
from .history import (BystanderLoss, Enqueue, Exit, Fault, FinalRow, GapPut, HandBack, History, KeyLock,
                      LeaseTakeBack, Refused, RowLock, Run, SignalGap)
from .schedule import CI_CLASSES, make_cluster_plan, make_plan, parse_classes

LEASE = 4.0


def run(job, attempt, pid, start, end=None, outcome="ok", token=None, priority=0, run_at=0.0):
    token = token if token is not None else job * 100 + attempt  # one batch per run unless given
    r = Run("main", job, attempt, pid, token, start, start, priority, run_at)
    if end is not None:
        r.end, r.outcome = end, outcome
    return r


def enq(job, at=0.0, kind="", priority=0):
    return Enqueue("main", job, kind, "put", priority, 0.0, at)


def history(runs, enqueues, faults=(), rows=(), recovery=None):
    return History(list(runs), list(enqueues), list(faults), list(rows), LEASE, recovery or {})


def rules(h: History) -> dict[str, int]:
    return checker.check(h).by_rule()


def test_a_clean_history_passes():
    h = history([run(1, 1, 10, 1.0, 1.1), run(2, 1, 11, 1.0, 1.2)], [enq(1), enq(2)])
    assert checker.check(h).ok


def test_a_job_acknowledged_but_never_handled_is_lost():
    h = history([run(1, 1, 10, 1.0, 1.1)], [enq(1), enq(2)])
    assert rules(h) == {"lost": 1}


def test_a_job_that_started_but_never_ended_and_is_gone_is_lost():
    h = history([run(1, 1, 10, 1.0)], [enq(1)])
    assert rules(h) == {"lost": 1}


def test_a_dead_job_with_a_reason_or_a_cancelled_job_is_not_lost():
    h = history([], [enq(1, kind="poison"), enq(2)],
                faults=[Fault("cancel", 1.0, 1.1, job=("main", 2), detail="deleted")],
                rows=[FinalRow("main", 1, 4, 3, "consumer died; out of attempts", None)])
    assert checker.check(h).ok


def test_an_innocent_job_dead_is_caught_and_a_poison_one_is_not():
    rows = [FinalRow("main", 1, 4, 5, "consumer died; out of attempts", None),
            FinalRow("main", 2, 4, 5, "consumer died; out of attempts", None)]
    h = history([], [enq(1, kind="poison"), enq(2)], rows=rows)
    assert rules(h) == {"innocent_dead": 1}
    assert checker.check(h).violations[0].job == ("main", 2)


def test_an_unwind_job_dead_of_its_base_exception_is_no_innocent_death():
    rows = [FinalRow("main", 1, 4, 1, "Unwound: a handler's own BaseException", None)]
    h = history([run(1, 1, 10, 1.0, 1.1, outcome="fail")], [enq(1, kind="unwind")], rows=rows)
    assert checker.check(h).ok


def test_a_kept_result_that_is_not_valid_json_is_caught():
    h = history([run(1, 1, 10, 1.0, 1.1)], [enq(1)])
    h.invalid_results = [("main", 1)]
    assert rules(h) == {"invalid_result": 1}


def test_a_second_run_after_a_lease_take_back_names_it():
    """A reaper's take-back of an expired lease excuses nothing (it is no fault), but the
    violation says it: the earlier run's claim lost its lease while its consumer lived."""
    h = history([run(1, 1, 10, 1.0, 1.1), run(1, 1, 11, 7.5, 7.6)], [enq(1)])
    h.lease_takebacks = [LeaseTakeBack("main", 12, 10, (1, 2, 3), 5.2), LeaseTakeBack("main", 12, 10, (4,), 5.3)]
    report = checker.check(h)
    assert report.by_rule() == {"run_twice": 1, "attempts": 1}
    for v in report.violations:
        assert "taken back from pid 10's claim by pid 12's reaper at 5.200, its lease expired, 4.10s after the " \
               "earlier run ended" in str(v), v
        assert "5.300" not in str(v)


def test_a_job_run_twice_by_healthy_consumers_is_caught():
    h = history([run(1, 1, 10, 1.0, 1.1), run(1, 2, 11, 2.0, 2.1)], [enq(1)])
    assert rules(h) == {"run_twice": 1}


def test_a_job_running_in_two_places_at_once_is_caught():
    h = history([run(1, 1, 10, 1.0, 2.0), run(1, 2, 11, 1.5, 2.5)], [enq(1)])
    assert rules(h) == {"concurrent_run": 1}


def test_a_second_run_is_excused_by_a_kill_stall_lost_connection_or_restart_in_between():
    for fault in (Fault("sigkill", 1.05, 1.05, 10), Fault("stall", 0.5, 6.0, 11),
                  Fault("kill_connection", 1.5, 1.5, 10), Fault("server_crash", 1.2, 1.8)):
        h = history([run(1, 1, 10, 1.0, 1.1), run(1, 2, 11, 2.0, 2.1)], [enq(1)], faults=[fault])
        report = checker.check(h)
        assert report.ok, (fault, report.violations)
        assert sum(report.duplicates.values()) == 1


def test_a_fault_on_an_unrelated_process_excuses_nothing():
    h = history([run(1, 1, 10, 1.0, 1.1), run(1, 2, 11, 2.0, 2.1)], [enq(1)],
                faults=[Fault("sigkill", 1.5, 1.5, 99)])
    assert rules(h) == {"run_twice": 1}


def test_a_run_that_outlasted_the_lease_excuses_the_second_run_and_a_retry_is_no_duplicate():
    past_lease = [run(1, 1, 10, 1.0, 1.0 + LEASE + 1), run(1, 2, 11, 1.0 + LEASE + 0.5, 7.0)]
    retry = [run(2, 1, 10, 1.0, 1.1, outcome="fail"), run(2, 2, 11, 2.0, 2.1)]
    report = checker.check(history(past_lease + retry, [enq(1), enq(2)]))
    assert report.ok, report.violations
    assert report.duplicates == {"past_lease": 1}


def test_attempts_that_fall_behind_the_starts_are_caught():
    h = history([run(1, 1, 10, 1.0, 1.1, outcome="fail"), run(1, 1, 10, 2.0, 2.1)], [enq(1)])
    assert rules(h) == {"attempts": 1}


def test_an_attempt_repeated_after_its_claim_was_taken_back_together_is_the_first_exception():
    # Started at 1.0 under a claim of several jobs, its consumer killed at 1.05: not charged
    runs = [run(1, 1, 10, 1.0), run(1, 1, 11, 2.0, 2.1)]
    assert checker.check(history(runs, [enq(1)], faults=[Fault("sigkill", 1.05, 1.05, 10)])).ok
    # The same repeat with nothing that took the claim back is a violation
    assert rules(history([run(1, 1, 10, 1.0, 1.1), run(1, 1, 10, 2.0, 2.1)], [enq(1)])) \
        == {"run_twice": 1, "attempts": 1}


def test_an_attempt_skipped_by_a_claim_taken_back_alone_before_its_start_is_the_second_exception():
    # Claimed alone at about 0.5, its consumer killed before the start: that attempt stands
    h = history([run(1, 2, 11, 2.0, 2.1)], [enq(1)], faults=[Fault("sigkill", 0.6, 0.6, 10)])
    assert checker.check(h).ok
    # Without any fault, a first start that is not attempt 1 is a violation
    assert rules(history([run(1, 2, 11, 2.0, 2.1)], [enq(1)])) == {"attempts": 1}
    assert rules(history([run(1, 1, 10, 1.0, 1.1, outcome="fail"), run(1, 3, 10, 2.0, 2.1)], [enq(1)])) \
        == {"attempts": 1}


def test_a_dead_job_shows_the_attempt_of_its_last_start():
    runs = [run(1, 1, 10, 1.0, 1.1, outcome="fail"), run(1, 2, 10, 2.0, 2.1, outcome="fail")]
    dead = lambda n: [FinalRow("main", 1, 4, n, "boom", None)]  # noqa: E731
    assert checker.check(history(runs, [enq(1, kind="poison")], rows=dead(2))).ok
    assert rules(history(runs, [enq(1, kind="poison")], rows=dead(3))) == {"attempts": 1}
    # One more: a claim taken back alone after the last start, out of attempts
    assert checker.check(history(runs, [enq(1, kind="poison")], rows=dead(3),
                                 faults=[Fault("sigkill", 3.0, 3.0, 12)])).ok


def test_a_job_that_starts_again_under_a_new_claim_after_its_cancel_is_caught():
    # Running at the cancel (attempt 1 until 2.5), then run again by another claim at 3.0
    h = history([run(1, 1, 10, 1.0, 2.5, outcome="fail"), run(1, 2, 11, 3.0, 3.1)], [enq(1)],
                faults=[Fault("cancel", 2.0, 2.1, job=("main", 1), detail="requested")])
    assert rules(h) == {"after_cancel": 1}
    # Deleted while pending: no start after it at all
    h = history([run(1, 1, 11, 3.0, 3.1)], [enq(1)], faults=[Fault("cancel", 2.0, 2.1, job=("main", 1),
                                                                   detail="deleted")])
    assert rules(h) == {"after_cancel": 1}


def test_the_claim_that_held_a_job_at_its_cancel_may_still_start_it():
    # Claimed (not started) when the cancel was requested: its handler starts and sees the request
    h = history([run(1, 1, 10, 3.0, 3.1)], [enq(1)],
                faults=[Fault("cancel", 2.0, 2.1, job=("main", 1), detail="requested")])
    assert checker.check(h).ok


def test_jobs_left_claimed_or_stranded_by_a_gone_consumer_are_caught():
    h = history([run(1, 1, 10, 1.0, 1.1)], [enq(1), enq(2)],
                rows=[FinalRow("main", 2, 2, 1, None, "c" * 32)],
                recovery={"main/aaaa pid 10": 1.0, "main/bbbb pid 11": 30.0, "main/cccc pid 12": None})
    assert rules(h) == {"lost": 1, "left_claimed": 1, "stranded": 2}


def test_a_batch_run_out_of_priority_order_is_caught():
    runs = [run(1, 1, 10, 1.0, 1.1, token=1, priority=0), run(2, 1, 10, 1.2, 1.3, token=1, priority=9)]
    assert rules(history(runs, [enq(1), enq(2)])) == {"priority": 1}


def test_a_claim_that_takes_a_low_priority_job_while_a_high_one_waits_is_caught():
    # pid 10 finishes a batch at 2.0, then claims job 3 (priority 0) and starts it at 2.1;
    # job 4 (priority 9) was acknowledged at 0.5 and is only claimed by pid 11 after 3.0.
    runs = [run(1, 1, 10, 1.0, 2.0, token=1), run(3, 1, 10, 2.1, 2.2, token=2),
            run(2, 1, 11, 1.0, 3.0, token=5), run(4, 1, 11, 3.1, 3.2, token=6, priority=9)]
    enqueues = [enq(1), enq(2), enq(3), enq(4, at=0.5, priority=9)]
    assert rules(history(runs, enqueues)) == {"priority": 1}
    # Any fault between the two claims excuses it: job 4 may have been held by a claim that died.
    assert checker.check(history(runs, enqueues, faults=[Fault("kill_connection", 2.5, 2.5, 77)])).ok


def test_a_job_held_by_a_claim_that_handed_it_back_unstarted_was_not_waiting():
    # pid 10 claims job 3 (priority 0) after 2.0; job 4 (priority 9, acknowledged at 0.5) was
    # claimed by pid 12's batch (its first start, job 5's, at 1.2) and handed back unstarted at
    # 2.9, then run by pid 11: held when pid 10 claimed, not waiting.
    runs = [run(1, 1, 10, 1.0, 2.0, token=1), run(3, 1, 10, 2.1, 2.2, token=2),
            run(2, 1, 11, 1.0, 3.0, token=5), run(4, 1, 11, 3.1, 3.2, token=6, priority=9),
            run(6, 1, 12, 0.6, 1.1, token=8), run(5, 1, 12, 1.2, 4.0, token=7)]
    enqueues = [enq(1), enq(2), enq(3), enq(4, at=0.5, priority=9), enq(5), enq(6)]
    handed = HandBack("main", 12, 7, (4,), 2.9)
    # Without the hand-back's line the checker saw job 4 waiting (behind pid 10's and 12's claims)
    assert rules(history(runs, enqueues)) == {"priority": 2}
    assert checker.check(dataclasses.replace(history(runs, enqueues), hand_backs=[handed])).ok
    # Handed back before pid 10's claim could start (at 1.4): claimable then, and left waiting
    early = dataclasses.replace(handed, at=1.4)
    assert rules(dataclasses.replace(history(runs, enqueues), hand_backs=[early])) == {"priority": 1}
    # The claim that handed it back is judged too: pid 12's batch was claimed after 2.5 (its
    # last batch's end), later than pid 10's first start, while job 4 waited from 0.5
    late = [r for r in runs if r.pid != 12] + [run(6, 1, 12, 1.0, 2.5, token=8),
                                                run(5, 1, 12, 2.6, 4.0, token=7)]
    assert rules(dataclasses.replace(history(late, enqueues), hand_backs=[handed])) == {"priority": 1}


def test_fault_classes_parse_and_a_seed_replays_the_same_schedule():
    assert parse_classes("ci") == CI_CLASSES
    assert "stall_idle" in parse_classes("all") and "stall_idle" not in CI_CLASSES  # long runs only
    assert "kill_session" in CI_CLASSES and parse_classes("episodes,-busy_restart")[0] == "stall_idle"
    assert "polling" not in parse_classes("all,-polling")
    a = make_plan(7, parse_classes("all"), 60, 1000)
    assert a == make_plan(7, parse_classes("all"), 60, 1000)
    assert a.steps != make_plan(8, parse_classes("all"), 60, 1000).steps
    # Episodes take their own random stream: the timed faults stay where they were without them
    assert a.episodes and make_plan(7, parse_classes("all,-episodes"), 60, 1000).steps == a.steps


def test_a_handler_past_the_lease_excuses_the_rerun_of_the_finished_jobs_of_its_claim_only():
    # Jobs 1 and 2 finish at 1.1 (their ack pending), job 3 of the same claim runs to 7.0
    runs = [run(1, 1, 10, 1.0, 1.1, token=7), run(3, 1, 10, 1.1, 7.0, token=7),
            run(1, 1, 11, 5.5, 5.6, token=8), run(2, 1, 12, 1.0, 1.1, token=9), run(2, 1, 11, 5.6, 5.7, token=8)]
    report = checker.check(history(runs, [enq(1), enq(2), enq(3)]))
    # Then job 1's second run is excused, job 2's (another claim) is not
    assert report.by_rule() == {"run_twice": 1, "attempts": 1}
    assert {v.job for v in report.violations} == {("main", 2)}
    assert report.duplicates == {"past_lease_in_batch": 1, "unexplained": 1}


def test_a_run_cut_short_after_its_lease_ran_out_excuses_the_second_run_and_its_batch_mates():
    # Job 1 finished at 1.1 (ack pending); job 2 of the same claim started at 1.1 and never
    # ended (its process died later); both ran again after the lease ran out
    runs = [run(1, 1, 10, 1.0, 1.1, token=7), run(2, 1, 10, 1.1, token=7),
            run(1, 1, 11, 5.2, 5.3, token=8), run(2, 1, 11, 5.3, 5.4, token=8)]
    report = checker.check(history(runs, [enq(1), enq(2)]))
    assert report.ok, report.violations
    assert report.duplicates == {"past_lease_in_batch": 1, "past_lease": 1}


def test_a_run_cut_short_whose_lease_ran_from_its_claim_excuses_a_second_run_sooner_after_its_start():
    # Seed 44: pid 10's batch before ended at 0.9, so its next claim came after that. Job 1 of
    # the new claim started at 1.0 and ended; job 2 started at 1.3 (no lease push can come
    # before it: a push needs a third of the lease since the claim) and ran on past the lease,
    # its process killed later. The lease ran out by 1.0 + 4.0: both ran again at 5.1 and 5.2,
    # less than a lease after job 2's own start
    runs = [run(9, 1, 10, 0.8, 0.9, token=6),
            run(1, 1, 10, 1.0, 1.05, token=7), run(2, 1, 10, 1.3, token=7),
            run(1, 1, 11, 5.1, 5.15, token=8), run(2, 1, 11, 5.2, 5.3, token=8)]
    report = checker.check(history(runs, [enq(9), enq(1), enq(2)]))
    assert report.ok, report.violations
    assert report.duplicates == {"past_lease_in_batch": 1, "past_lease": 1}


def test_a_second_run_sooner_than_a_lease_after_a_start_that_may_have_pushed_the_lease_is_caught():
    # The same, but the batch before ended at -1.0 (a push may have come just before job 2
    # started, at 1.3), or there was no batch before (the claim may be older): the lease may
    # have run until 5.3, so job 2's run at 5.2 is still a violation
    for before in ([run(9, 1, 10, -1.2, -1.0, token=6)], []):
        runs = [*before, run(1, 1, 10, 1.0, 1.05, token=7), run(2, 1, 10, 1.3, token=7),
                run(2, 1, 11, 5.2, 5.3, token=8)]
        report = checker.check(history(runs, [enq(r.job) for r in before] + [enq(1), enq(2)]))
        assert report.by_rule() == {"concurrent_run": 1, "attempts": 1}, before


def test_a_slow_job_may_die_of_its_expired_leases_and_an_ordinary_one_may_not():
    rows = [FinalRow("main", 1, 4, 5, "lease expired; out of attempts", None),
            FinalRow("main", 2, 4, 5, "lease expired; out of attempts", None)]
    assert rules(history([], [enq(1, kind="slow"), enq(2)], rows=rows)) == {"innocent_dead": 1}


def test_a_job_killed_while_it_ran_alone_may_end_dead_and_one_killed_elsewhere_may_not():
    # Job 1's last run (pid 10) was cut short by a SIGKILL of pid 10; job 3's (pid 12) ended,
    # and pid 12 lost its connection before the ack; job 2's was hit by nothing
    runs = [run(1, 5, 10, 1.0), run(2, 5, 11, 1.0), run(3, 5, 12, 1.0, 1.5)]
    rows = [FinalRow("main", j, 4, 5, "consumer died; out of attempts", None) for j in (1, 2, 3)]
    faults = [Fault("sigkill", 0.5, 0.5, 10), Fault("sigkill", 2.0, 2.0, 10),
              Fault("kill_connection", 1.6, 1.6, 12), Fault("sigkill", 0.5, 0.5, 12)]
    report = checker.check(history(runs, [enq(1), enq(2), enq(3)], faults=faults, rows=rows))
    assert [v.job for v in report.violations if v.rule == "innocent_dead"] == [("main", 2)]


def test_a_second_run_inside_a_failover_window_is_put_down_to_it_and_one_after_it_is_caught():
    # Given a Galera node fault from 1.5 s until the node was a Synced member again at 9 s
    for kind, cause in (("writer_kill", "failover_kill"), ("node_pause", "failover_pause")):
        window = Fault(kind, 1.5, 9.0, detail="node 1 (writer)")
        # When a job ran at 1.0 s and again at 8 s (its batch in flight at the failover)
        inside = checker.check(history([run(1, 1, 10, 1.0, 1.1), run(1, 2, 11, 8.0, 8.1)], [enq(1)],
                                       faults=[window]))
        # Then the second run is the failover's
        assert inside.ok and inside.duplicates == {cause: 1}, inside.violations
        # And a job whose both runs come a lease after the window is a violation
        after = history([run(2, 1, 10, 20.0, 20.1), run(2, 2, 11, 21.0, 21.1)], [enq(2)], faults=[window])
        assert rules(after) == {"run_twice": 1}


def test_a_cluster_plan_kills_and_pauses_nodes_by_turns_and_a_seed_replays_it():
    a = make_cluster_plan(5, 120, 1000, node_every_s=30)
    assert a == make_cluster_plan(5, 120, 1000, node_every_s=30)
    nodes = [s.kind for s in a.steps if s.kind in ("writer_kill", "node_pause")]
    assert len(nodes) == 4 and set(nodes[0::2]) == {nodes[0]} and set(nodes[1::2]) == {nodes[1]} != {nodes[0]}
    assert all(s.length_s > 12 for s in a.steps if s.kind == "node_pause")  # beyond the read timeout
    assert "writer_kill" not in parse_classes("all")  # the single-server schedule has no nodes


def test_a_gone_consumers_recovery_bound_stretches_by_the_outages_it_overlaps():
    # A consumer killed at t=10 whose jobs came back 25 s later (bound 10 s here): stranded,
    # unless a writer node was down for at least 15 s of that time (no reaper could reach it)
    recovery = {"main/aaaaaaaa pid 10": 25.0}
    kill = Fault("sigkill", 10.0, 10.0, 10)
    assert rules(history([], [], faults=[kill], recovery=recovery)) == {"stranded": 1}
    outage = Fault("node_pause", 12.0, 28.0, detail="node 1 (writer)")
    assert checker.check(history([], [], faults=[kill, outage], recovery=recovery)).ok
    short = Fault("writer_kill", 12.0, 20.0, detail="node 1 (writer)")
    assert rules(history([], [], faults=[kill, short], recovery=recovery)) == {"stranded": 1}


class _Sampled:
    """A root whose samples answer from `held` (owner -> claimed jobs), or fail while `down`."""

    def __init__(self):
        self.held: dict[str, int] = {"c1": 3}
        self.down = False

    def query(self, sql, params=None, retry_s=0.0):
        if self.down:
            import MySQLdb
            raise MySQLdb.OperationalError(2013, "lost")
        return [("c1", 10)] if "nq_consumer" in sql else list(self.held.items())


class _Gone:
    def __init__(self, killed_at):
        self.killed_at = killed_at

    def alive(self):
        return False


def test_a_gone_consumers_recovery_is_judged_by_when_its_jobs_were_last_seen_claimed():
    """Regression (issue 35, seed 23): no sample answered for seconds while the jobs of a killed
    consumer came back (a peer ran them again 6.9 s after the death), and the first sample that
    did, 12.8 s after it, was taken for their return: stranded, bound 10.8 s."""
    import time

    from .monitor import ClaimMonitor

    root, gone = _Sampled(), _Gone(time.monotonic() - 2.0)
    monitor = ClaimMonitor({"main": root}, type("Fleet", (), {"by_pid": lambda self, pid: gone})())
    monitor.tick()  # 2 s after the death: still claimed
    root.down = True
    monitor.tick()  # no answer
    root.down, root.held = False, {}
    gone.killed_at -= 12.0  # the next sample that answers comes 12 s later: nothing claimed
    monitor.tick()
    [seconds] = monitor.recovery().values()
    assert 2.0 <= seconds < 3.0
    assert checker.check(history([], [], recovery=monitor.recovery())).ok
    # Seen claimed past the bound is stranded, as ever
    assert rules(history([], [], recovery={"main/c1 pid 10": 11.0})) == {"stranded": 1}


class _Run:
    """A consumer of the fleet as the monitor sees it: of a deployment, running or not."""

    def __init__(self, deploy: str, running: bool):
        self.deploy, self.running, self.stopped = deploy, running, False

    def alive(self):
        return self.running

    def ready(self):
        return True


def test_a_gone_consumers_bound_stretches_by_the_time_no_consumer_of_its_deployment_ran():
    """Regression (seed 6): a cron-like deployment's run was SIGKILLed and the next run started
    14 s later; only a running consumer can reap, so its jobs came back at that run's first pass.
    The seconds with no consumer of the deployment running stretch the bound; while one runs,
    the bound is as ever."""
    import time

    from .monitor import ClaimMonitor

    root, gone = _Sampled(), _Gone(time.monotonic() - 1.0)
    other = _Run("main", False)
    fleet = type("Fleet", (), {"by_pid": lambda self, pid: gone, "started": [gone, other]})()
    gone.deploy, gone.stopped, gone.ready = "main", False, lambda: False
    monitor = ClaimMonitor({"main": root}, fleet)
    monitor.tick()  # 1 s after the death, nobody runs: those seconds count
    monitor._last_tick -= 11.0  # 11 s later, still nobody runs
    gone.killed_at -= 11.0
    monitor.tick()
    unattended = monitor.unattended_s()
    assert 11.5 <= next(iter(unattended.values())) <= 12.5
    other.running = True  # a run starts: from now on the bound holds as ever
    monitor._last_tick -= 1.0
    gone.killed_at -= 1.0
    monitor.tick()
    root.held = {}
    monitor.tick()
    recovery = monitor.recovery()
    assert 13.0 <= next(iter(recovery.values())) < 14.0
    h = history([], [], recovery=recovery)
    assert rules(h) == {"stranded": 1}  # bound 10 s alone
    h.recovery_unattended_s = monitor.unattended_s()
    assert checker.check(h).ok
    # with a consumer running all along, the same recovery is stranded
    h.recovery_unattended_s = {}
    assert rules(h) == {"stranded": 1}


# ------------------------------------------------------------------ issue 26's fault classes


def test_kill_session_a_process_that_reruns_its_own_jobs_after_losing_its_liveness_session_is_caught():
    # Item 3: pid 10 runs a long job (it extends its lease) and a short one of the same claim;
    # its liveness session is KILLed at 2.0 and pid 10 itself runs both again (it reaped itself)
    kill = Fault("kill_session", 2.0, 2.0, 10, detail="liveness")
    runs = [run(1, 1, 10, 0.9, 1.0, token=7), run(2, 1, 10, 1.0, 9.0, token=7),
            run(1, 2, 10, 3.0, 3.1, token=8), run(2, 2, 10, 3.1, 3.2, token=8)]
    runs[1].flags = "L"
    report = checker.check(history(runs, [enq(1), enq(2)], faults=[kill]))
    assert report.by_rule() == {"run_twice": 2}, report.violations
    # A peer that took the claim back while the lock was free is the trust rules' case: excused
    peer = [runs[0], run(1, 2, 11, 3.1, 3.2, token=8)]
    assert checker.check(history(peer, [enq(1)], faults=[kill])).ok
    # and so is pid 10 claiming the job again once a peer (pid 11) took it back: it was anyone's
    by_peer = Fault("taken_back", 2.5, 2.5, 10, detail="11")
    again = [runs[0], run(1, 2, 10, 3.0, 3.1, token=8)]
    assert checker.check(history(again, [enq(1)], faults=[kill, by_peer])).ok
    # nor a take-back of pid 10 before its first run started: that was no take-back of its claim
    early = Fault("taken_back", 2.5, 2.5, 10, detail="11")
    late_runs = [run(1, 1, 10, 3.0, 3.1, token=7), run(1, 2, 10, 4.0, 4.1, token=8)]
    assert checker.check(history(late_runs, [enq(1)], faults=[kill, early])).by_rule() == {"run_twice": 1}
    # but not when pid 10's own reaper took it back: that is item 3, caught by its own rule too
    by_itself = Fault("taken_back", 2.5, 2.5, 10, detail="10")
    report = checker.check(history(again, [enq(1)], faults=[kill, by_itself]))
    assert report.by_rule() == {"run_twice": 1, "self_reap": 1}, report.violations


def test_kill_session_a_take_back_midway_through_a_claim_excuses_the_hit_process_rerunning_its_later_jobs():
    # Seed 11: pid 10's liveness session is KILLed at 2.0; unaware (its session answered moments
    # ago), it claims jobs 1 and 2 (claim 7) and starts job 1 at 2.1. A peer, pid 11, finds the
    # lock free and takes the claim back whole at 2.25, before job 2 starts at 2.3 under it.
    # The acks are fenced out and pid 10 claims job 2 again (claim 8), at the same attempt: the
    # take-back undid the first. It came after the claim began, not after job 2's own start.
    kill = Fault("kill_session", 2.0, 2.0, 10, detail="liveness of a live consumer, connection 180")
    by_peer = Fault("taken_back", 2.25, 2.25, 10, detail="11")
    runs = [run(1, 1, 10, 2.1, 2.2, token=7), run(2, 1, 10, 2.3, 2.4, token=7), run(2, 1, 10, 2.5, 2.6, token=8)]
    report = checker.check(history(runs, [enq(1), enq(2)], faults=[kill, by_peer]))
    assert report.ok, report.violations
    assert report.duplicates == {"kill_session": 1}
    # Not once it re-registered (its liveness session reconnected at 2.6): a claim from then on
    # (claim 9, job 3 at 2.7) was made under a lock the KILL did not free, and a take-back of
    # pid 10 after it excuses no rerun of its job
    registered = Fault("re_registered", 2.6, 2.6, 10)
    again = Fault("taken_back", 2.8, 2.8, 10, detail="11")
    later = runs + [run(3, 1, 10, 2.7, 2.75, token=9), run(3, 1, 10, 2.9, 3.0, token=10)]
    report = checker.check(history(later, [enq(1), enq(2), enq(3)], faults=[kill, by_peer, registered, again]))
    assert report.by_rule() == {"run_twice": 1, "attempts": 1}, report.violations
    assert {v.job for v in report.violations} == {("main", 3)}
    # Nor a KILL of its work session: that frees no liveness lock, so no peer judged it by it
    work = Fault("kill_session", 2.0, 2.0, 10, detail="work of a live consumer, connection 181")
    report = checker.check(history(runs, [enq(1), enq(2)], faults=[work, by_peer]))
    assert report.by_rule() == {"run_twice": 1, "attempts": 1}, report.violations


def test_stall_idle_a_start_under_a_claim_taken_back_during_a_stall_is_caught():
    # Item 4: pid 10 claimed jobs 1-3 (claim 7), started job 1 at 1.0 and was stopped 1.5-10.5;
    # pid 11 took the claim back and ran jobs 2 and 3 at 6.0; pid 10, resumed, started them too
    stall = Fault("stall", 1.5, 10.5, 10)
    runs = [run(1, 1, 10, 1.0, 11.0, token=7), run(2, 1, 11, 6.0, 6.1, token=9), run(3, 1, 11, 6.1, 6.2, token=9),
            run(2, 1, 10, 11.0, 11.1, token=7), run(3, 1, 10, 11.1, 11.2, token=7)]
    report = checker.check(history(runs, [enq(1), enq(2), enq(3)], faults=[stall]))
    assert report.by_rule() == {"stale_start": 2}, report.violations
    # Without the late starts, the stall explains everything
    assert checker.check(history(runs[:3], [enq(1), enq(2), enq(3)], faults=[stall])).ok


def test_a_start_checked_before_a_stall_that_froze_it_just_after_the_previous_job_is_excused_once():
    # pid 10's claim 7: job 1 ran 1.0-1.1; a stall froze it 2 ms later, between its check and job
    # 2's start, until 10.5; pid 11 took the claim back and ran job 2 at 6.0; pid 10, resumed,
    # started job 2 at once (the check was made before the stall): not a violation
    stall = Fault("stall", 1.102, 10.5, 10)
    runs = [run(1, 1, 10, 1.0, 1.1, token=7), run(2, 1, 11, 6.0, 6.1, token=9),
            run(2, 1, 10, 10.5, 10.6, token=7)]
    assert rules(history(runs, [enq(1), enq(2)], faults=[stall])).get("stale_start") is None
    # But a start well after the stall's end was checked after it: caught
    late = runs[:2] + [run(2, 1, 10, 11.0, 11.1, token=7)]
    assert rules(history(late, [enq(1), enq(2)], faults=[stall])).get("stale_start") == 1
    # And a stall that came well after the previous job ended found the worker past its checks
    # only by chance; one inside a handler (the test above) is caught too
    early = Fault("stall", 1.6, 10.5, 10)
    assert rules(history(runs, [enq(1), enq(2)], faults=[early])).get("stale_start") == 1


def test_busy_restart_a_job_run_again_while_its_handler_ran_through_a_server_restart_is_caught():
    # Item 5: job 1's handler (it keeps its lease) ran through a restart at 5.0-5.2; a peer ran it at 6.0
    for kind in ("busy_restart", "busy_crash"):
        restart = Fault(kind, 5.0, 5.2)
        runs = [run(1, 1, 10, 1.0, 20.0), run(1, 1, 11, 6.0, 6.5), run(2, 1, 10, 4.0, 4.9), run(2, 2, 11, 6.0, 6.1)]
        runs[0].flags = "L"
        long = checker.EPISODE_DEPLOY  # the episodes' deployment, whose jobs the restart aims at
        runs = [dataclasses.replace(r, deploy=long) for r in runs]
        enqueues = [dataclasses.replace(enq(job), deploy=long) for job in (1, 2)]
        report = checker.check(history(runs, enqueues, faults=[restart]))
        # Job 2 had finished before it (its ack may have been lost): excused; job 1 is not
        assert report.by_rule() == {"concurrent_run": 1, "attempts": 1}, report.violations
        assert {v.job for v in report.violations} == {(long, 1)}


def test_sighup_a_job_run_again_after_a_reload_is_caught_and_a_kept_lease_is_no_excuse():
    # Item 6: pid 10 reloaded at 2.0; its 60 s job (extending its lease) ran again on pid 11 at 13.3
    runs = [run(1, 1, 10, 1.0, 61.0), run(1, 2, 11, 13.3, 73.3)]
    runs[0].flags = "L"
    report = checker.check(history(runs, [enq(1)], faults=[Fault("sighup", 2.0, 2.0, 10, detail="session_idle_s")]))
    assert report.by_rule() == {"concurrent_run": 1}, report.violations


def test_long_command_a_command_within_its_timeout_run_again_past_the_lease_is_caught():
    # Item 7: a 20 s --command (lease 4): its consumer owed it extensions; a peer ran it at 6.0
    first, second = run(1, 1, 10, 1.0, 21.0, token=0), run(1, 2, 11, 6.0, 26.0, token=0)
    first.flags = second.flags = "C"
    assert rules(history([first, second], [enq(1)])) == {"concurrent_run": 1}
    # A Python handler past its lease that never extended it is its own doing (the slow jobs)
    assert checker.check(history([run(1, 1, 10, 1.0, 21.0), run(1, 2, 11, 6.0, 6.1)], [enq(1)])).ok


def test_grace_expiry_a_command_that_outlives_its_consumer_is_caught():
    # Item 9: consumer pid 10 exited at 4.0 (grace expired); its command (pid 50) ended at 15.0,
    # while pid 11 ran the same job from 5.0
    first = run(1, 1, 10, 1.0, 15.0, token=0)
    first.flags, first.proc = "C", 50
    faults = [Fault("grace_expiry", 2.0, 4.0, 10)]
    h = history([first, run(1, 1, 11, 5.0, 6.0, token=0)], [enq(1)], faults=faults)
    h.exits = [Exit(10, 4.0, 0, True, "SIGTERM, shutdown grace 2 s")]
    report = checker.check(h)
    assert report.by_rule() == {"orphaned_run": 1}, report.violations
    assert "overlapping pid 11" in report.violations[0].detail
    # Its command killed with it (no end line): the grace expiry explains the second run, which
    # repeats the attempt (interrupted, not charged)
    first.end = first.outcome = None
    assert checker.check(h).ok


def test_charged_interrupt_a_job_charged_for_its_consumers_shutdown_is_caught():
    # Issue 40 item 10: pid 10 was stopped (grace expired at 4.0) while job 1 ran; the next start
    # is attempt 2: the deploy was charged to the job
    faults = [Fault("grace_expiry", 2.0, 4.0, 10)]
    h = history([run(1, 1, 10, 1.0), run(1, 2, 11, 5.0, 6.0)], [enq(1)], faults=faults)
    h.exits = [Exit(10, 4.0, 0, True, "SIGTERM, shutdown grace 2 s")]
    report = checker.check(h)
    assert report.by_rule() == {"charged_interrupt": 1}, report.violations
    # Given back uncharged, it repeats attempt 1: fine
    h.runs[1] = run(1, 1, 11, 5.0, 6.0)
    assert checker.check(h).ok
    # A crash is no interruption: a SIGKILLed consumer's job taken back alone is charged
    crash = history([run(1, 1, 10, 1.0), run(1, 2, 11, 5.0, 6.0)], [enq(1)],
                    faults=[Fault("sigkill", 2.0, 2.0, 10)])
    crash.exits = [Exit(10, 2.0, -9, True, "SIGKILL")]
    assert checker.check(crash).ok


def _stop_episode(runs, faults, rows, exit_at: float, code: int):
    """An episode's history (its own deployment) of jobs 1 and 2, whose pid 10 was stopped
    (SIGTERM) and exited at `exit_at` with `code`."""
    runs = [dataclasses.replace(r, deploy=checker.EPISODE_DEPLOY) for r in runs]
    enqueues = [dataclasses.replace(enq(job), deploy=checker.EPISODE_DEPLOY) for job in (1, 2)]
    h = history(runs, enqueues, faults=faults, rows=rows)
    h.exits = [Exit(10, exit_at, code, True, "SIGTERM")]
    return h


def grace_restart_history(short_again=None, long_again=(1, 11, 9.6, 20.6), exit_at=9.6, code=0, rows=(),
                          stop="grace_restart"):
    """pid 10 (two workers, shutdown_grace_s 7) stopped at 2.0 while it ran job 1 (a 5 s command)
    and job 2 (an 11 s one); the server restarted at 2.5-4.5, in its grace. Job 1 ended at 6.0,
    within it; job 2 was killed at its end (9.0) and given back. short_again / long_again: a
    later run of job 1 / job 2 (attempt, pid, start, end); stop: the stop's record."""
    runs = [run(1, 1, 10, 1.0, 6.0, token=0), run(2, 1, 10, 1.0, token=0)]
    for job, again in ((1, short_again), (2, long_again)):
        if again is not None:
            attempt, pid, start, end = again
            runs.append(run(job, attempt, pid, start, end, token=0))
    for r in runs:
        r.flags = "C"
    faults = [Fault(stop, 2.0, exit_at, 10, detail="shutdown_grace_s=7"),
              Fault("busy_restart", 2.5, 4.5, detail="in the grace of pid 10")]
    return _stop_episode(runs, faults, rows, exit_at, code)


def test_grace_restart_a_stop_whose_server_restarted_acks_what_ended_and_gives_back_what_ran_on():
    # The short job acked, the long one given back uncharged and run to its end by pid 11 after
    # the grace, the consumer gone 0.6 s after its grace: the contract
    assert checker.check(grace_restart_history()).ok


def test_grace_restart_a_job_that_ended_in_the_grace_but_was_not_acked_is_caught():
    # Job 1 ended at 6.0, the server back since 4.5, yet pid 11 ran it again
    report = checker.check(grace_restart_history(short_again=(2, 11, 10.0, 15.0)))
    assert report.by_rule() == {"grace_restart": 1, "run_twice": 1}, report.violations
    [caught] = [v for v in report.violations if v.rule == "grace_restart"]
    assert "not acked" in caught.detail
    # Or it stayed in the table (ready again after the drain)
    report = checker.check(grace_restart_history(rows=[FinalRow(checker.EPISODE_DEPLOY, 1, 0, 1, None, None)]))
    assert report.by_rule() == {"grace_restart": 1}, report.violations


def test_grace_restart_a_job_given_back_at_the_graces_end_and_never_run_again_is_caught():
    report = checker.check(grace_restart_history(long_again=None))
    assert report.by_rule() == {"grace_restart": 1, "lost": 1}, report.violations


def test_grace_restart_a_given_back_job_charged_or_run_again_during_the_grace_is_caught():
    # Its next start is attempt 2: the stop was charged to it
    report = checker.check(grace_restart_history(long_again=(2, 11, 9.6, 20.6)))
    assert report.by_rule() == {"grace_restart": 1}, report.violations
    assert "charged" in report.violations[0].detail
    # Unless a server crash as the stop came may have lost the registration's "stopping" mark:
    # a reaper's take-back then charges the job, as the contract says
    unmarked = grace_restart_history(long_again=(2, 11, 9.6, 20.6))
    unmarked.faults.append(Fault("server_crash", 2.3, 2.4))
    assert checker.check(unmarked).ok, checker.check(unmarked).violations
    # A peer ran it at 5.0, while pid 10 still ran it in its grace (a reaper took it back from
    # a live consumer): the interruption excuses a rerun after the grace, not during it
    report = checker.check(grace_restart_history(long_again=(1, 11, 5.0, 16.0)))
    assert report.by_rule() == {"grace_restart": 1}, report.violations
    assert "while pid 10 ran it" in report.violations[0].detail


def test_grace_restart_a_consumer_that_exits_late_or_nonzero_is_caught():
    late = checker.check(grace_restart_history(exit_at=9.0 + checker.GRACE_EXIT_BOUND_S + 1))
    assert late.by_rule() == {"grace_restart": 1}, late.violations
    failed = checker.check(grace_restart_history(code=5))
    assert failed.by_rule() == {"grace_restart": 1}, failed.violations
    assert "exited 5" in failed.violations[0].detail


def grace_outage_history(short_again=None, long_again=(1, 11, 12.8, 23.8), exit_at=12.6, code=0, rows=(),
                         crash=False):
    """grace_restart_history's stop (pid 10, at 2.0, a 7 s grace: to 9.0), the server away
    across the grace's end instead: stopped (or crashed) at 2.5, back at 12.0. Job 1 ended at
    6.0, in the outage; job 2 was killed at 9.0, in it too. pid 10 settled both once the server
    answered and exited at 12.6; pid 11 ran job 2 again from 12.8, at the same attempt."""
    h = grace_restart_history(short_again, long_again, exit_at, code, rows, stop="grace_outage")
    h.faults[1] = Fault("busy_crash" if crash else "busy_restart", 2.5, 12.0, detail="in the grace of pid 10")
    return h


def test_grace_outage_a_stop_whose_server_was_away_at_its_graces_end_settles_once_it_is_back():
    # The short job acked, the long one given back uncharged and run by pid 11 once the server
    # was back, the consumer gone 3.6 s after its grace (it waited for the server): the contract
    assert checker.check(grace_outage_history()).ok
    assert checker.check(grace_outage_history(crash=True)).ok
    # The stop waits for its server SETTLE_AT_EXIT_S at most: an exit 11 s after the grace is
    # grace_outage's to allow, not grace_restart's
    assert checker.check(grace_outage_history(exit_at=20.0)).ok
    assert checker.check(grace_restart_history(exit_at=20.0)).by_rule() == {"grace_restart": 1}


def test_grace_outage_a_command_that_ended_in_the_outage_given_back_and_run_again_is_caught():
    # Job 1's command exited 0 at 6.0 while its lease extension retried the server; its exit
    # ignored, it was given back interrupted at the grace's end and pid 11 ran it again
    report = checker.check(grace_outage_history(short_again=(1, 11, 12.8, 17.8)))
    assert report.by_rule() == {"grace_outage": 1, "run_twice": 1, "attempts": 1}, report.violations
    [caught] = [v for v in report.violations if v.rule == "grace_outage"]
    assert caught.job == (checker.EPISODE_DEPLOY, 1) and "not acked" in caught.detail
    # Or its ack met the server away at the grace's end and the stop did not settle it: the
    # job is still there after the drain (its lease then ran out: a reaper's, charged)
    report = checker.check(grace_outage_history(rows=[FinalRow(checker.EPISODE_DEPLOY, 1, 0, 2, None, None)]))
    assert report.by_rule() == {"grace_outage": 1}, report.violations


def test_grace_outage_a_long_job_charged_lost_or_run_again_in_the_grace_is_caught():
    report = checker.check(grace_outage_history(long_again=(2, 11, 12.8, 23.8)))
    assert report.by_rule() == {"grace_outage": 1}, report.violations
    assert "charged" in report.violations[0].detail
    report = checker.check(grace_outage_history(long_again=None))
    assert report.by_rule() == {"grace_outage": 1, "lost": 1}, report.violations
    report = checker.check(grace_outage_history(long_again=(1, 11, 5.0, 16.0)))
    assert report.by_rule() == {"grace_outage": 1}, report.violations


def test_grace_outage_a_consumer_that_exits_past_the_settles_bound_or_nonzero_is_caught():
    late = checker.check(grace_outage_history(exit_at=9.0 + checker.GRACE_STOPS["grace_outage"] + 1,
                                              long_again=(1, 11, 27.0, 38.0)))
    assert late.by_rule() == {"grace_outage": 1}, late.violations
    assert "exited 25.0 s after it (bound: 17 s past the grace)" in late.violations[0].detail
    failed = checker.check(grace_outage_history(code=5))
    assert failed.by_rule() == {"grace_outage": 1}, failed.violations
    assert "exited 5" in failed.violations[0].detail


def frozen_at_stop_history(first_again=None, second=(1, 11, 9.6, 10.6), exit_at=9.5, code=0, rows=()):
    """pid 10 (one worker, shutdown_grace_s 3) ran job 1 from 1.0 to 3.0; the server froze at
    2.8, just before that job ended (its ack met the frozen server), pid 10 was stopped at 3.2
    and the server thawed at 9.2, 3 s past the grace's end (6.2). pid 10 acked job 1 and gave
    job 2 back unstarted once the server answered, and exited at 9.5; pid 11 (the peer) ran job 2
    from 9.6. first_again: a later run of job 1, second: job 2's run (attempt, pid, start, end)."""
    runs = [run(1, 1, 10, 1.0, 3.0, token=0)]
    for job, again in ((1, first_again), (2, second)):
        if again is not None:
            attempt, pid, start, end = again
            runs.append(run(job, attempt, pid, start, end, token=0))
    faults = [Fault("frozen_at_stop", 3.2, exit_at, 10, detail="shutdown_grace_s=3"),
              Fault("server_frozen", 2.8, 9.2, detail="in the grace of pid 10")]
    return _stop_episode(runs, faults, rows, exit_at, code)


def test_frozen_at_stop_a_finished_job_acked_once_and_the_other_given_back_passes():
    # Job 1 acked once the server answered, job 2 run by the peer, pid 10 gone 3.3 s after its
    # grace (it waited for the frozen server): the contract
    assert checker.check(frozen_at_stop_history()).ok, checker.check(frozen_at_stop_history()).violations
    # The stop waits for its server SETTLE_AT_EXIT_S at most: an exit 11 s after the grace is
    # within the bound
    assert checker.check(frozen_at_stop_history(exit_at=17.0, second=(1, 11, 17.2, 18.2))).ok


def test_frozen_at_stop_a_finished_job_run_again_or_left_is_caught():
    # Job 1 ended at 3.0, just before the stop, its ack met the frozen server; the stop did not
    # send it, a reaper took it back and pid 11 ran it again
    report = checker.check(frozen_at_stop_history(first_again=(2, 11, 9.8, 11.8)))
    assert report.by_rule() == {"frozen_at_stop": 1, "run_twice": 1}, report.violations
    [caught] = [v for v in report.violations if v.rule == "frozen_at_stop"]
    assert caught.job == (checker.EPISODE_DEPLOY, 1) and "not acked" in caught.detail
    # Or it is still in the table after the drain
    report = checker.check(frozen_at_stop_history(rows=[FinalRow(checker.EPISODE_DEPLOY, 1, 0, 2, None, None)]))
    assert report.by_rule() == {"frozen_at_stop": 1}, report.violations


def test_frozen_at_stop_a_job_started_by_the_stopping_consumer_or_a_late_exit_is_caught():
    # Once the server answered, pid 10 started job 2 (the batch's next), after its SIGTERM
    report = checker.check(frozen_at_stop_history(second=(1, 10, 9.3, 10.3), exit_at=10.4))
    assert report.by_rule() == {"frozen_at_stop": 1}, report.violations
    assert "after its SIGTERM" in report.violations[0].detail
    late = checker.check(frozen_at_stop_history(exit_at=6.2 + checker.GRACE_STOPS["frozen_at_stop"] + 1,
                                                second=(1, 11, 25.0, 26.0)))
    assert late.by_rule() == {"frozen_at_stop": 1}, late.violations
    failed = checker.check(frozen_at_stop_history(code=5))
    assert failed.by_rule() == {"frozen_at_stop": 1}, failed.violations
    assert "exited 5" in failed.violations[0].detail


def test_fork_a_job_started_by_a_forked_child_is_caught():
    # Item 11: pid 10's handler forked pid 77, whose sys.exit returned into the worker loop
    h = history([run(1, 1, 10, 1.0, 1.5), run(2, 1, 77, 1.1, 1.2)], [enq(1), enq(2)])
    h.consumer_pids = {10, 11}
    assert rules(h) == {"stray_process": 1}


def test_huge_error_a_consumer_that_dies_of_a_job_is_caught():
    # Item 10: the failure of a job with a 90 KB error killed its consumer (exit 1)
    h = history([run(1, 1, 10, 1.0, 1.1, outcome="fail"), run(1, 2, 11, 6.0, 6.1)], [enq(1)])
    h.exits = [Exit(10, 1.3, 1, False, "not the schedule's doing"), Exit(12, 2.0, -9, True, "SIGKILL")]
    assert rules(h) == {"consumer_exit": 1}


def test_shared_producer_a_put_that_raised_but_stored_and_an_id_of_another_put_are_caught():
    # Item 1: put t1 raised and its job ran; put t2 returned id 2, which holds put t3's payload
    runs = [run(1, 1, 10, 1.0, 1.1), run(2, 1, 10, 1.2, 1.3), run(3, 1, 10, 1.4, 1.5)]
    runs[0].tag, runs[1].tag, runs[2].tag = "t1", "t3", "t4"
    h = history(runs, [Enqueue("main", 2, "", "shared", 0, 0.0, 0.5, tag="t2"),
                       Enqueue("main", 3, "", "shared", 0, 0.0, 0.5, tag="t4"), enq(1)])
    h.refused = [Refused("main", "t1", "ProgrammingError")]
    assert rules(h) == {"stored_after_raise": 1, "wrong_id": 1}


def test_rr_dedup_two_pending_jobs_with_one_key_are_caught():
    # Item 12: job 1 put with key K at 1.0 (due at 3.0); a REPEATABLE READ caller's put(K) at 1.5 got job 2
    puts = [Enqueue("main", 1, "", "dedup", 0, 2.0, 1.0, dedup="K", called_at=0.9),
            Enqueue("main", 2, "", "rr_dedup", 0, 2.0, 1.6, dedup="K", called_at=1.5)]
    runs = [run(1, 1, 10, 3.0, 3.1), run(2, 1, 10, 3.6, 3.7)]
    assert rules(history(runs, puts)) == {"dedup_twice": 1}
    # The same key taken again after job 1 had started is a new job, not a violation
    late = [puts[0], dataclasses.replace(puts[1], called_at=3.2, acked_at=3.3)]
    assert checker.check(history(runs, late)).ok


def test_async_handler_a_job_acked_without_its_handler_running_is_caught():
    # Item 2: the coroutine was never awaited: no start line, and the row is gone (done)
    assert rules(history([], [enq(1)])) == {"lost": 1}


def test_a_deployment_is_judged_with_its_own_lease():
    # A 10 s run on the long deployment (lease 30) rerun at 12.0 by a peer is no past-lease case
    runs = [Run("long", 1, 1, 10, 5, 1.0, 1.0, 0, 0.0), Run("long", 1, 2, 11, 6, 12.0, 12.0, 0, 0.0)]
    runs[0].end, runs[0].outcome, runs[1].end, runs[1].outcome = 11.0, "ok", 12.1, "ok"
    h = history(runs, [Enqueue("long", 1, "", "put", 0, 0.0, 0.5)])
    assert checker.check(h).ok  # judged with the default lease (4 s): past its lease
    h.lease_by_deploy = {"long": 30.0}
    assert checker.check(h).by_rule() == {"run_twice": 1}


def fx(job, at=0.0):
    return enq(job, at=at, kind="fx")


def test_exactly_one_effect_per_acked_job_passes():
    # Given fx jobs each acked once with its one effect row, one of them killed right after
    # its COMMIT (no end line: the effect row is its handling)
    h = history([run(1, 1, 10, 1.0, 1.1), run(2, 1, 10, 1.2)], [fx(1), fx(2)],
                faults=[Fault("sigkill", 1.3, 1.3, 10)])
    h.effects = {("main", 1): 1, ("main", 2): 1}
    assert checker.check(h).ok, checker.check(h).violations


def test_a_double_effect_is_caught():
    # Given an fx job run twice (a kill explains the second run) whose effect committed twice
    h = history([run(1, 1, 10, 1.0, 1.1), run(1, 2, 11, 2.0, 2.1)], [fx(1)],
                faults=[Fault("sigkill", 1.05, 1.05, 10)])
    h.effects = {("main", 1): 2}
    # Then the checker names it, and nothing else
    assert rules(h) == {"double_effect": 1}


def test_an_effect_of_a_dead_or_cancelled_job_and_an_acked_job_without_one_are_caught():
    rows = [FinalRow("main", 1, 4, 1, "cancelled", None)]
    h = history([run(1, 1, 10, 1.0, 1.1, outcome="fail"), run(3, 1, 10, 1.0, 1.1)], [fx(1), fx(2), fx(3)],
                faults=[Fault("cancel", 0.5, 0.5, job=("main", 1), detail="requested"),
                        Fault("cancel", 0.5, 0.5, job=("main", 2), detail="deleted")], rows=rows)
    h.effects = {("main", 1): 1, ("main", 2): 1}
    assert rules(h) == {"effect_of_dead": 1, "effect_of_cancelled": 1, "missing_effect": 1}


def test_a_dedup_put_that_found_a_plain_job_holding_its_key_owes_no_effect():
    # Given a plain job, then an fx put with the same key that got the plain job's id back
    h = history([run(1, 1, 10, 1.0, 1.1)], [enq(1), dataclasses.replace(fx(1, at=0.5), method="dedup")])
    # Then the job acked without an effect row is no violation: it ran the plain payload
    assert checker.check(h).ok, checker.check(h).violations


def test_ready_jobs_with_nothing_running_or_starting_for_longer_than_the_bound_are_a_stall():
    # Job 2 is ready from t=1 to t=9 while no handler runs or starts: 8 s > STALL_BOUND_S
    stalled = ([run(1, 1, 10, 0.1, 0.2), run(2, 1, 10, 9.0, 9.1)], [enq(1, at=0.0), enq(2, at=1.0)])
    assert rules(history(*stalled)) == {"no_progress": 1}
    # A burst of KILL QUERY excuses nothing: a KILL must never leave a consumer waiting
    assert rules(history(*stalled, faults=[Fault("kill_query", 2.0, 2.5, 10)])) == {"no_progress": 1}
    # nor a SIGHUP (reload_drop's reloads, refused or not, must never leave the fleet waiting)
    assert rules(history(*stalled, faults=[Fault("sighup", 2.0, 2.0, 10)])) == {"no_progress": 1}
    # A killed consumer does (its claims wait for a reaper), and so does a server restart
    for fault in (Fault("sigkill", 0.5, 0.5, 10), Fault("server_restart", 3.0, 5.0)):
        assert checker.check(history(*stalled, faults=[fault])).ok, fault


def test_no_stall_while_a_handler_runs_for_a_short_gap_or_for_a_delayed_job():
    runs = [run(1, 1, 10, 0.1, 0.2), run(2, 1, 10, 9.0, 9.1)]
    # A handler running through the gap: the fleet is busy, not stalled
    busy = history(runs + [run(3, 1, 11, 0.5, 8.5)], [enq(1), enq(2, at=1.0), enq(3, at=0.4)])
    assert checker.check(busy).ok
    # A gap within the bound
    assert checker.check(history([run(1, 1, 10, 0.1, 0.2), run(2, 1, 10, 5.5, 5.6)], [enq(1), enq(2, at=1.0)])).ok
    # A job put with a delay is not ready before it is due
    delayed = dataclasses.replace(enq(2, at=1.0), method="delayed", delay_s=8.0)
    assert checker.check(history(runs, [enq(1), delayed])).ok


# ------------------------------------------------------------------ rate limits (issue 38)


def rated(runs, rates, keys=None):
    h = history(runs, [enq(r.job) for r in runs])
    return dataclasses.replace(h, rates={"main": rates}, job_keys=keys or {})


def test_n_starts_per_period_pass_and_one_more_inside_a_period_is_a_rate_violation():
    # Given a rate of 3 per second and starts 0.4 s apart: 3 in any second, never 4
    ok = [run(i, 1, 10 + i % 2, 1.0 + 0.4 * i, 1.01 + 0.4 * i) for i in range(1, 10)]
    assert checker.check(rated(ok, [(3, 1.0, False)])).ok
    # When two more starts are planted among them (4 and 5 in windows of 0.7 and 0.4 s)
    planted = ok + [run(50, 1, 12, 2.0, 2.01), run(51, 1, 13, 2.1, 2.11)]
    # Then each is a violation of the rate, named once per window it overfills
    assert rules(rated(planted, [(3, 1.0, False)])) == {"rate": 3}
    # And one start more within a period's RATE_SLACK_S of the last is not one (a COMMIT's
    # start line comes that late on a loaded machine)
    late = ok + [run(52, 1, 14, 2.25, 2.26)]
    assert checker.check(rated([r for r in late if r.job != 4], [(3, 1.0, False)])).ok


def test_a_batchs_later_starts_count_at_its_claim_and_a_fault_on_the_process_excuses_a_late_line():
    # Given claims of 3 jobs a period apart whose jobs start one after the other: the third of
    # one claim starts 0.9 s after its claim, close to the next claim's first job
    batches = [run(10 * c + j, 1, 10, c * 1.0 + 0.45 * j, c * 1.0 + 0.45 * j + 0.4, token=c)
               for c in range(1, 4) for j in range(3)]
    assert checker.check(rated(batches, [(3, 1.0, False)])).ok
    # And four single-job claims within 0.5 s, one of them on a process that was stalled then
    late = [run(i, 1, 20 + i, 1.0 + 0.1 * i, 1.6, token=i) for i in range(4)]
    stalled = [Fault("stall", 0.5, 1.3, pid=23)]
    assert rules(rated(late, [(3, 1.0, False)])) == {"rate": 1}
    h = dataclasses.replace(rated(late, [(3, 1.0, False)]), faults=stalled)
    assert checker.check(h).ok


def spent(r: Run, at: float) -> Run:
    r.spent_at = at
    return r


def test_a_claims_spend_read_from_the_rate_log_is_measured_exactly_not_its_late_start_line():
    # Given 3 per second, and single-job claims whose spends the log holds exactly a period
    # apart (1.0, 1.4, 1.8, then 2.0 ...), while the first one's start line came 0.35 s late (a
    # loaded machine: later than RATE_SLACK_S; by the lines, 4 starts within 0.65 s)
    at = [1.0, 1.4, 1.8, 2.0, 2.4, 2.8, 3.0]
    ok = [spent(run(i, 1, 10, t, t + 0.01, token=i), t) for i, t in enumerate(at)]
    ok[0].start = ok[0].wall_start = 1.35
    assert checker.check(rated(ok, [(3, 1.0, False)])).ok
    # When the log says a fourth claim spent inside a period, its line late enough to hide it
    planted = ok + [spent(run(50, 1, 12, 3.3, 3.31, token=50), 2.5)]
    # Then it is a violation, named by its spend, once per window it overfills
    assert rules(rated(planted, [(3, 1.0, False)])) == {"rate": 3}
    assert "spent within" in checker.check(rated(planted, [(3, 1.0, False)])).violations[0].detail


def test_a_key_rate_counts_each_key_apart_and_jobs_without_a_key_not_at_all():
    # Given rate_per_key 1 per second: keys a and b start together, unkeyed jobs in between
    runs = [run(1, 1, 10, 1.0, 1.1), run(2, 1, 11, 1.0, 1.1), run(3, 1, 12, 1.2, 1.3), run(4, 1, 13, 1.2, 1.3)]
    keys = {("main", 1): "a", ("main", 2): "b"}
    assert checker.check(rated(runs, [(1, 1.0, True)], keys)).ok
    # When key a starts again within its period
    keys[("main", 3)] = "a"
    assert rules(rated(runs, [(1, 1.0, True)], keys)) == {"rate": 1}


# ------------------------------------------------------------------ issue 38: key_limit


def keyed(r: Run, key: str) -> Run:
    r.flow_key = key
    return r


def test_three_runs_of_a_key_at_once_under_a_limit_of_two_is_caught():
    # Planted: three overlapping runs of key k on three processes, limit_per_key 2
    runs = [keyed(run(1, 1, 10, 1.0, 1.5), "k"), keyed(run(2, 1, 11, 1.1, 1.6), "k"),
            keyed(run(3, 1, 12, 1.2, 1.7), "k"), keyed(run(4, 1, 13, 1.2, 1.7), "other")]
    h = dataclasses.replace(history(runs, [enq(1), enq(2), enq(3), enq(4)]), key_limits={"main": 2})
    assert rules(h) == {"key_limit": 1}
    # and without a limit for the deployment, or with a run that ended first, nothing
    assert checker.check(dataclasses.replace(h, key_limits={})).ok
    runs[0].end = 1.2  # ends as the third starts: the slot passes on
    assert checker.check(h).ok


def test_a_job_completed_by_its_own_block_frees_its_slot_at_the_commit_not_its_end_line():
    # Given limit 2 and two runs of key k, the first an fx job whose block committed (the
    # completion) at 1.3, its end line at 1.45; a third run of k starts at 1.4 between them
    first = keyed(run(1, 1, 10, 1.0, 1.45), "k")
    first.commit_at = 1.3
    runs = [first, keyed(run(2, 1, 11, 1.1, 2.0), "k"), keyed(run(3, 1, 12, 1.4, 1.5), "k")]
    h = dataclasses.replace(history(runs, [enq(1), enq(2), enq(3)]), key_limits={"main": 2})
    # Then that is no violation: the slot went with the COMMIT
    assert "key_limit" not in rules(h)
    # but a block that failed (its COMMIT did not complete the job) held its slot to the end
    first.outcome = "fail"
    assert rules(h)["key_limit"] == 1


def test_a_run_whose_process_was_killed_frees_its_slot_at_the_kill():
    # The first run's process is SIGKILLed at 1.3 (no end recorded); a peer's runs of the key start
    # after the kill, another one before: two at once at most
    runs = [keyed(run(1, 1, 10, 1.0), "k"), keyed(run(2, 1, 11, 1.1, 2.0), "k"),
            keyed(run(4, 1, 12, 1.4, 1.5), "k"), keyed(run(3, 1, 12, 1.6, 1.7), "k")]
    faults = [Fault("sigkill", 1.3, 1.3, pid=10)]
    h = dataclasses.replace(history(runs, [enq(1), enq(2), enq(3), enq(4)], faults=faults), key_limits={"main": 2})
    assert "key_limit" not in rules(h)
    # without the kill, the first run still holds its claim and three run at once
    h = dataclasses.replace(h, faults=[])
    assert rules(h).get("key_limit", 0) >= 1


def test_a_run_whose_process_moved_on_to_another_claim_no_longer_holds_its_slot():
    # A handler past its timeout runs on in its thread (no end line) while its process claims
    # again: its job was failed, its slot freed; two more runs of the key are within the limit
    runs = [keyed(run(1, 1, 10, 1.0, token=5), "k"), keyed(run(2, 1, 10, 1.5, 1.6, token=6), "k"),
            keyed(run(3, 1, 11, 1.55, 1.7), "k")]
    h = dataclasses.replace(history(runs, [enq(1), enq(2), enq(3)],
                                    rows=[FinalRow("main", 1, 4, 5, "timeout", None)]), key_limits={"main": 2})
    assert "key_limit" not in rules(h)


def test_a_job_started_after_its_claim_was_taken_back_holds_no_slot():
    # pid 10 claims jobs 1 and 2 (one claim), its liveness session is killed at 1.2 and a peer
    # takes the claim back at 1.3; pid 10 still starts job 2 at 5.0 (a long job, keeping its
    # lease) while two peers run the key: within the limit
    runs = [keyed(run(1, 1, 10, 1.0, 1.1, token=7), "k"), keyed(run(2, 1, 10, 5.0, 9.0, token=7), "k"),
            keyed(run(3, 1, 11, 5.1, 6.0), "k"), keyed(run(4, 1, 12, 5.2, 6.0), "k")]
    runs[1].flags = "L"
    faults = [Fault("kill_session", 1.2, 1.2, 10, detail="liveness"), Fault("taken_back", 1.3, 1.3, 10, detail="11")]
    h = dataclasses.replace(history(runs, [enq(i) for i in (1, 2, 3, 4)], faults=faults), key_limits={"main": 2})
    assert "key_limit" not in rules(h)
    # and without the fault, three hold at once
    assert rules(dataclasses.replace(h, faults=[])).get("key_limit", 0) >= 1


# ------------------------------------------------------------------ workflows (issue 39)

def _wf(job, start, end=None, ok=True, pid=10):
    return checker.WorkflowRun(job, pid, start, end, ok and end is not None)


def test_a_clean_workflow_history_passes():
    runs = [_wf(1, 1.0, 1.1), _wf(2, 1.0, 1.2), _wf(3, 1.3, 1.4)]
    assert checker.check_workflow(runs, [(1, 3), (2, 3)], {1: None, 2: None, 3: None}, {3: 2},
                                  {1: 1, 2: 1, 3: 1}) == []


def test_a_child_started_before_a_parent_was_done_is_caught():
    # the parent's first run was cut short (no ok end), the child started before its second run ended
    runs = [_wf(1, 1.0, None), _wf(3, 1.5, 1.6), _wf(1, 2.0, 2.1)]
    found = checker.check_workflow(runs, [(1, 3)], {1: None, 3: None}, {}, {1: 1, 3: 1})
    assert [v.rule for v in found] == ["early_start"]


def test_a_child_left_waiting_after_its_parents_ended_is_caught():
    runs = [_wf(1, 1.0, 1.1)]
    found = checker.check_workflow(runs, [(1, 3)], {1: None, 3: 6}, {}, {1: 1})
    assert [v.rule for v in found] == ["waits_forever"]
    # while a parent still runs, waiting is right
    assert checker.check_workflow(runs, [(1, 3)], {1: checker.CLAIMED, 3: 6}, {}, {1: 1}) == []


def test_a_child_released_twice_or_a_callback_run_twice_or_never_is_caught():
    runs = [_wf(1, 1.0, 1.1), _wf(3, 1.2, 1.3), _wf(3, 1.4, 1.5, pid=11)]
    found = checker.check_workflow(runs, [(1, 3)], {1: None, 3: None}, {3: 1}, {1: 1, 3: 2})
    assert sorted(v.rule for v in found) == ["callback_twice", "released_twice"]
    found = checker.check_workflow(runs[:1], [(1, 3)], {1: None, 3: None}, {3: 1}, {1: 1})
    assert [v.rule for v in found] == ["callback_missing"]


def test_a_bystander_session_that_dies_with_the_server_up_is_a_violation_and_one_a_restart_ended_is_not():
    # A session opened after the restart, killed a moment later with the server up (a consumer's
    # KILL of an id it had before the restart); one that died with the server; one that a
    # crash ended between its last answer and the failed poll
    faults = [Fault("server_restart", 10.0, 10.4), Fault("server_crash", 30.0, 30.2)]
    losses = [BystanderLoss(57, 10.45, 10.45, 10.9, "(2013, 'Lost connection to server during query')"),
              BystanderLoss(12, 2.0, 9.8, 10.3, "(2006, 'Server has gone away')"),
              BystanderLoss(13, 10.45, 29.9, 30.4, "(2013, 'Lost connection to server during query')")]
    h = dataclasses.replace(history([run(1, 1, 10, 1.0, 1.1)], [enq(1)], faults=faults), bystander_losses=losses)
    found = checker.check(h).violations
    assert [v.rule for v in found] == ["bystander_killed"]
    assert "session 57" in found[0].detail
    # No other fault excuses it: a KILL of a consumer's session is not a KILL of the bystander's
    h.faults.append(Fault("kill_connection", 10.6, 10.6, 10, detail="57"))
    assert rules(h) == {"bystander_killed": 1}
    # And without losses the run passes
    assert checker.check(dataclasses.replace(h, bystander_losses=[])).ok


def test_the_ci_schedule_runs_the_bystander_class():
    assert "bystander" in CI_CLASSES and "bystander" in parse_classes("ci")


# ------------------------------------------------------------------ a ready job's row held (row_lock)

def locked(runs, enqueues, locks, faults=(), poll_max_s=1.0):
    h = history(runs, enqueues, faults=faults)
    return dataclasses.replace(h, row_locks=list(locks), poll_max_s={"main": poll_max_s})


def test_a_job_claimed_long_after_the_lock_on_its_row_went_is_a_violation_and_a_prompt_one_is_not():
    # Job 5's row held t=1-4 (an application's SELECT ... FOR UPDATE, rolled back); job 1 runs
    # meanwhile, and job 5 starts 2 s after the lock went: within poll_max_s 1 + the slack
    lock = RowLock("main", 5, 1.0, 4.0, 0)
    enqueues = [enq(1), enq(5, at=0.5)]
    assert checker.check(locked([run(1, 1, 10, 0.1, 3.0), run(5, 1, 10, 6.0, 6.1)], enqueues, [lock])).ok
    # Planted: it waited for the watcher's safety claim (a minute) with the fleet idle
    idle = [run(1, 1, 10, 0.1, 3.0), run(5, 1, 10, 64.0, 64.1)]
    found = checker.check(locked(idle, enqueues, [lock])).violations
    assert "locked_pickup" in [v.rule for v in found], found
    late = next(v for v in found if v.rule == "locked_pickup")
    assert late.job == ("main", 5) and "60.0 s after the lock" in late.detail and "idle" in late.detail
    # Planted: the fleet busy, but a claim well after the lock took job 7, behind it in claim
    # order (a later id, the same priority and run_at), and left it waiting
    passed = [run(1, 1, 12, 0.1, 13.5), run(7, 1, 11, 9.0, 9.1), run(5, 1, 10, 14.0, 14.1)]
    found = checker.check(locked(passed, enqueues + [enq(7, at=8.0)], [lock])).violations
    assert [v.rule for v in found] == ["locked_pickup"] and "passed over" in found[0].detail, found
    # Behind a backlog of jobs ahead of it in claim order, its turn comes late: no violation
    backlog = [run(1, 1, 10, 0.1, 3.0), *(run(j, 1, 11, 4.0 + j, 4.9 + j) for j in (2, 3, 4)),
               run(5, 1, 10, 9.0, 9.1)]
    assert checker.check(locked(backlog, enqueues + [enq(j, at=0.2) for j in (2, 3, 4)], [lock])).ok
    # Its claim is judged by its batch's first start: behind a long job of the same claim, in time
    batch = [run(1, 1, 10, 0.1, 3.0), run(3, 1, 11, 4.5, 12.0, token=9),
             run(5, 1, 11, 12.0, 12.1, token=9, run_at=0.5)]
    assert checker.check(locked(batch, enqueues + [enq(3, at=3.4)], [lock])).ok
    # The bound is the deployment's poll_max_s and the slack: poll_max_s 60 allows the idle one
    assert "locked_pickup" not in rules(locked(idle, enqueues, [lock], poll_max_s=60.0))


def test_a_late_pickup_after_a_row_lock_is_excused_only_by_what_could_delay_that_job():
    lock = RowLock("main", 2, 1.0, 4.0, 0)
    # job 3, behind job 2 in claim order, claimed at 9 while job 1 keeps the fleet busy
    late = [run(1, 1, 13, 0.1, 13.5), run(3, 1, 11, 9.0, 9.1), run(2, 1, 10, 14.0, 14.1)]
    enqueues = [enq(1), enq(2, at=0.5), enq(3, at=3.4)]
    assert rules(locked(late, enqueues, [lock])) == {"locked_pickup": 1}
    # A server restart between the lock and the start; the starting process stopped; another one
    # stopped as the lock went (it may hold the watch); a cancel; a lock a server fault ended
    for fault in (Fault("server_restart", 5.0, 7.0), Fault("stall", 4.5, 11.0, 10), Fault("stall", 3.0, 9.0, 12)):
        assert "locked_pickup" not in rules(locked(late, enqueues, [lock], faults=[fault])), fault
    assert "locked_pickup" not in rules(locked(late, enqueues, [lock],
                                               faults=[Fault("cancel", 5.0, 5.0, job=("main", 2))]))
    assert "locked_pickup" not in rules(locked(late, enqueues, [dataclasses.replace(lock, status=None)]))
    # A claim of it lost in between (its start is attempt 2: the first claim was charged)
    lost_claim = [*late[:2], run(2, 2, 10, 14.0, 14.1)]
    assert "locked_pickup" not in rules(locked(lost_claim, enqueues, [lock]))
    # A reaper's take-back in between (a dead consumer's claim, uncharged, may have held it)
    assert "locked_pickup" not in rules(locked(late, enqueues, [lock],
                                               faults=[Fault("taken_back", 8.0, 8.0, 14, detail="11")]))
    # A KILL QUERY burst or a SIGHUP excuses nothing, nor a fault on another process later
    for fault in (Fault("kill_query", 4.0, 4.5, 10), Fault("sighup", 4.2, 4.2, 10), Fault("sigkill", 9.0, 9.0, 11)):
        assert rules(locked(late, enqueues, [lock], faults=[fault])).get("locked_pickup") == 1, fault


def test_a_job_locked_again_by_the_next_lock_is_judged_from_that_locks_end():
    # Job 5's row held t=1-4, and again t=4.05-12 by the next lock (seen: the same ready job
    # drawn twice); claimed at 12.5 while job 1 keeps the fleet busy. A claim at 9 took job 7,
    # behind it in claim order, while the second lock held it: no pass-over of the first lock's
    first, again = RowLock("main", 5, 1.0, 4.0, 0), RowLock("main", 5, 4.05, 12.0, 0)
    runs = [run(1, 1, 12, 0.1, 13.0), run(7, 1, 11, 9.0, 9.1), run(5, 1, 10, 12.5, 12.6)]
    enqueues = [enq(1), enq(5, at=0.5), enq(7, at=0.6)]
    assert checker.check(locked(runs, enqueues, [first, again])).ok
    # Planted: claimed long after the second lock went, passed over meanwhile: caught, once
    again = dataclasses.replace(again, end=8.0)
    late = [run(1, 1, 12, 0.1, 20.0), run(7, 1, 11, 13.0, 13.1), run(5, 1, 10, 18.0, 18.1)]
    assert rules(locked(late, enqueues, [first, again])) == {"locked_pickup": 1}


def test_a_held_row_is_no_stall_and_no_priority_inversion_while_it_is_held():
    # Job 2 (priority 9) is ready from t=1, its row held t=1.5-8, started at 8.5; nothing else runs
    # from t=1 on: a span of 7 s with a job ready, but a job no claim could take
    lock = RowLock("main", 2, 1.5, 8.0, 0)
    runs = [run(1, 1, 10, 0.1, 0.2), run(2, 1, 10, 8.5, 8.6, priority=9)]
    enqueues = [enq(1, at=0.0), enq(2, at=1.0, priority=9)]
    assert checker.check(locked(runs, enqueues, [lock])).ok
    assert rules(history(runs, enqueues)) == {"no_progress": 1}  # without the lock: a stall
    # A lower-priority job claimed while the row was held is no inversion
    inverted = [run(1, 1, 10, 0.1, 0.2), run(4, 1, 10, 2.0, 2.9), run(3, 1, 10, 3.0, 3.1),
                run(2, 1, 10, 8.5, 8.6, priority=9)]
    enqueues += [enq(3, at=2.0), enq(4, at=1.9)]
    assert checker.check(locked(inverted, enqueues, [lock])).ok
    assert rules(history(inverted, enqueues)).get("priority") == 1  # without the lock: one


def test_the_ci_schedule_runs_the_row_lock_and_reload_drop_classes_with_a_quiet_last_lock():
    assert {"row_lock", "reload_drop"} <= set(CI_CLASSES)
    plan = make_plan(1, parse_classes("row_lock,reload_drop"), 60.0, 3000)
    locks = [s for s in plan.steps if s.kind == "row_lock"]
    assert len(locks) >= 8 and all(1.0 <= s.length_s <= 4.0 for s in locks)
    # the last lock goes after the workload's last put: only the consumers' own retry claims it
    assert locks[-1].at_s + locks[-1].length_s > 60.0
    assert [s.kind for s in plan.steps].count("reload_drop") >= 2
    # each class on a stream of its own: the timed faults keep their offsets
    base = [s for s in make_plan(1, parse_classes("sigkill,stall"), 60.0, 3000).steps]
    both = [s for s in make_plan(1, parse_classes("sigkill,stall,row_lock,reload_drop"), 60.0, 3000).steps
            if s.kind in ("sigkill", "stall")]
    assert base == both


def test_one_id_returned_to_two_enqueues_without_a_dedup_key_is_caught():
    """Two acknowledged enqueues got one id (seen after a server crash: a put_many whose COMMIT
    lost its reply took the id crash recovery had given another put for its own): one of them
    stored nothing, and lost cannot see it. Dedup puts may share their holder's id."""
    runs = [run(1, 1, 10, 1.0, 1.1), run(2, 1, 10, 1.2, 1.3)]
    shared = [enq(1, at=0.5), dataclasses.replace(enq(1, at=0.6), method="put_many"), enq(2, at=0.5),
              dataclasses.replace(enq(2, at=0.7), method="dedup")]
    report = checker.check(history(runs, shared))
    assert report.by_rule() == {"shared_id": 1}
    assert "returned to a put acknowledged at 0.500 and to a put_many acknowledged at 0.600" in str(report.violations[0])


def test_the_key_lock_class_holds_keys_past_the_lease_and_excuses_no_second_run():
    assert "key_lock" in parse_classes("all") and "key_lock" in CI_CLASSES and "key_lock" in parse_classes("ci")
    plan = make_plan(1, parse_classes("key_lock"), 60.0, 3000)
    locks = [s for s in plan.steps if s.kind == "key_lock"]
    assert len(locks) >= 6 and all(LEASE < s.length_s <= 7.0 and s.at_s + s.length_s < 60.0 for s in locks)
    # on a stream of its own: the timed faults keep their offsets
    base = make_plan(1, parse_classes("sigkill,stall,row_lock"), 60.0, 3000).steps
    assert base == tuple(s for s in make_plan(1, parse_classes("sigkill,stall,row_lock,key_lock"), 60.0, 3000).steps
                         if s.kind != "key_lock")
    # A held key is nobody's fault: a finished job of its key run again while it was held (its
    # ack waited for the key's row past the lease, a reaper took it back) is still caught
    held = Fault("key_lock", 1.0, 7.0, None, detail="fk1")
    h = history([run(1, 1, 10, 1.5, 1.6), run(1, 1, 11, 6.5, 6.6)], [enq(1)], faults=[held])
    assert rules(h) == {"run_twice": 1, "attempts": 1}


def key_locked(runs, enqueues, row_lock, key_lock):
    """A history with a row lock and a key lock, the key lock also a fault (as the harness has it)."""
    fault = Fault("key_lock", key_lock.start, key_lock.end, None, detail=key_lock.key)
    return dataclasses.replace(locked(runs, enqueues, [row_lock], faults=[fault]), key_locks=[key_lock])


def test_a_pickup_behind_an_outcome_waiting_on_a_held_key_is_no_idle_fleet_but_a_stall_around_it_is():
    # Job 5's row held t=1-4. Job 1 (key fk1) ends at 3.0 and its ack waits in its consumer's
    # next claim for fk1's row, which an outside session holds t=2.5-10: the holder saw that
    # claim waiting t=3.0-10. No handler runs from 3.0; job 5 is claimed at 10.3, when the
    # key's row went and the claim behind the ack ran: 6.3 s after its row lock, past poll_max_s
    # 1 + the slack, but an outcome waited on a key row meanwhile, no idle fleet
    row_lock = RowLock("main", 5, 1.0, 4.0, 0)
    waited = KeyLock("main", "fk1", 2.5, 10.0, ((3.0, 10.0),))
    enqueues = [enq(1), enq(5, at=0.5)]
    behind = [run(1, 1, 10, 0.1, 3.0), run(5, 1, 10, 10.3, 10.4)]
    assert checker.check(key_locked(behind, enqueues, row_lock, waited)).ok
    # Planted: a hold nobody waited for excuses nothing (a real stall while a key was held)
    unwaited = dataclasses.replace(waited, waits=())
    assert rules(key_locked(behind, enqueues, row_lock, unwaited)) == {"locked_pickup": 1}
    # Planted: a waiter seen t=3-5 only, the fleet idle from then to the end of the hold and past
    # the bound: a stall inside the key_lock window is still caught
    brief = dataclasses.replace(waited, waits=((3.0, 5.0),))
    found = checker.check(key_locked(behind, enqueues, row_lock, brief)).violations
    assert [v.rule for v in found] == ["locked_pickup"] and "idle 5.3 s" in found[0].detail, found
    # Planted: the wait ended at 10, the fleet idle past the bound after it: caught
    after = [run(1, 1, 10, 0.1, 3.0), run(5, 1, 10, 16.0, 16.1)]
    assert rules(key_locked(after, enqueues, row_lock, waited)) == {"locked_pickup": 1}
    # Planted: a wait on another deployment's key row keeps no worker of this one busy
    elsewhere = dataclasses.replace(waited, deploy="rated")
    assert rules(key_locked(behind, enqueues, row_lock, elsewhere)) == {"locked_pickup": 1}


def gap_held(put: GapPut, consumer_exit: Exit | None = None, faults=()):
    """A clean history with one signal_gap hold t=10-13 (its gap really locked), its put on a new
    queue, and its consume --exit-when-empty (pid 77) with the exit given."""
    hold = SignalGap("main", "sg0001", 10.0, 13.0, True, (put,), 77)
    h = history([run(1, 1, 10, 1.0, 1.1)], [enq(1)], faults=faults)
    return dataclasses.replace(h, signal_gaps=[hold], exits=[consumer_exit] if consumer_exit else [],
                               consumer_pids={10, 77})


GAP_CONSUMER_GONE = Exit(77, 14.5, 0, True, "exit when empty")


def test_a_put_on_a_new_queue_under_a_signal_gap_that_errs_or_returns_late_is_caught_and_a_prompt_one_passes():
    assert "signal_gap" in CI_CLASSES and "signal_gap" in parse_classes("all")
    plan = make_plan(1, parse_classes("signal_gap"), 60.0, 3000)
    holds = [s for s in plan.steps if s.kind == "signal_gap"]
    assert len(holds) >= 6 and all(2.0 <= s.length_s <= 4.0 and s.at_s + s.length_s < 60.0 for s in holds)
    # each class on a stream of its own: the other lock classes keep their offsets
    locks = parse_classes("row_lock,key_lock")
    assert [s for s in make_plan(1, parse_classes("row_lock,key_lock,signal_gap"), 60.0, 3000).steps
            if s.kind != "signal_gap"] == list(make_plan(1, locks, 60.0, 3000).steps)
    # The put began as the hold t=10-13 did and returned 0.2 s after it went: as documented
    prompt = GapPut("sg0001p", 10.0, 13.2)
    assert checker.check(gap_held(prompt, GAP_CONSUMER_GONE)).ok
    # within the bound: back 2.9 s after the hold's end
    assert checker.check(gap_held(dataclasses.replace(prompt, end=15.9), GAP_CONSUMER_GONE)).ok
    # Planted: the put raised (a lock wait timeout after the producer's retries)
    errored = dataclasses.replace(prompt, end=21.0, error="DatabaseError: MySQL error 1205: Lock wait timeout")
    found = checker.check(gap_held(errored, GAP_CONSUMER_GONE)).violations
    assert [v.rule for v in found] == ["signal_gap"] and "1205" in found[0].detail, found
    # Planted: back 10.5 s after the hold went (it waited out a lock wait timeout and retried)
    late = dataclasses.replace(prompt, end=23.5)
    found = checker.check(gap_held(late, GAP_CONSUMER_GONE)).violations
    assert [v.rule for v in found] == ["signal_gap"] and "10.50 s after" in found[0].detail, found
    # A server restart while the put ran explains either
    restart = Fault("server_restart", 12.0, 14.0)
    assert checker.check(gap_held(errored, GAP_CONSUMER_GONE, faults=[restart])).ok
    # A KILL of a consumer's session does not (only the harness's own, the producer's)
    killed = Fault("kill_connection", 12.0, 12.0, 10)
    assert rules(gap_held(late, GAP_CONSUMER_GONE, faults=[killed])) == {"signal_gap": 1}
    assert checker.check(gap_held(late, GAP_CONSUMER_GONE, faults=[dataclasses.replace(killed, pid=4242)])).ok


def test_a_consumer_on_a_new_queue_under_a_signal_gap_that_never_leaves_or_fails_is_caught():
    prompt = GapPut("sg0001p", 10.0, 13.2)
    # Planted: the consume --exit-when-empty never exited by itself (the final stop ended it)
    stopped = dataclasses.replace(GAP_CONSUMER_GONE, at=90.0, why="SIGTERM")
    found = checker.check(gap_held(prompt, stopped)).violations
    assert [v.rule for v in found] == ["signal_gap"] and "exited 0 (SIGTERM)" in found[0].detail, found
    # Planted: no exit seen at all
    assert rules(gap_held(prompt, None)) == {"signal_gap": 1}
    # Planted: it exited 1 (its registration failed); consumer_exit catches the exit too
    failed = Exit(77, 14.5, 1, False, "not the schedule's doing")
    assert rules(gap_held(prompt, failed)) == {"signal_gap": 1, "consumer_exit": 1}
    # Planted: gone by itself, but 25 s after the hold began
    slow = dataclasses.replace(GAP_CONSUMER_GONE, at=35.0)
    found = checker.check(gap_held(prompt, slow)).violations
    assert [v.rule for v in found] == ["signal_gap"] and "25.0 s after" in found[0].detail, found
    # ... unless a fault on it (a killed session) or the server came in between
    assert checker.check(gap_held(prompt, slow, faults=[Fault("kill_connection", 11.0, 11.0, 77)])).ok


def test_an_episodes_restart_excuses_a_second_run_of_another_deployment_as_any_restart():
    """Regression (the long run --seed 19): the grace_restart episode's server restart, recorded
    as busy_restart, excused only jobs that had finished before it, on every deployment; a main
    job whose claim's COMMIT the restart lost ran again on a peer: run_twice. The episode's own
    deployment keeps the narrow rule."""
    restart = Fault("busy_restart", 10.0, 10.4)
    main_runs = [run(1, 1, 10, 10.01), run(1, 1, 11, 10.6, 10.7)]  # cut short, run again at attempt 1
    assert checker.check(history(main_runs, [enq(1)], faults=[restart])).ok
    long_runs = [dataclasses.replace(r, deploy="long") for r in main_runs]
    assert not checker.check(history(long_runs, [dataclasses.replace(enq(1), deploy="long")],
                                     faults=[restart])).ok
