"""The seeded fault schedule: which faults, when, and against which slot; all from one seed.

A plan is computed up front from (seed, classes, duration), so the same seed replays the same
sequence of faults at the same offsets against the same consumer slots. (Which job a SIGKILL
catches mid-run still depends on the machine's timing; the schedule itself does not.)

Fault classes, each switched on or off by name:
  sigkill          SIGKILL a consumer (it is restarted in its slot)
  stall            SIGSTOP a consumer for longer than the lease, then SIGCONT
  kill_connection  KILL CONNECTION of a random session of the runtime user (consumers', producer's)
  server_restart   clean restart of the server (SIGTERM, start)
  server_crash     SIGKILL of the server, start (InnoDB recovery)
  poison           a few jobs whose handler os._exit()s, or (every other one) raises a BaseException
                   of its own on every attempt: only they may end dead
  slow             a few jobs whose handler outlasts the lease
  polling          half the consumer slots run with wakeup.use_locks = false, slots are
                   restarted gracefully now and then (consumers join a busy queue), and a
                   few jobs take 0.1 s (so a claim is in flight when a reaper looks)
  exit_when_empty  a second deployment (its own database) served only by cron-like
                   `consume --exit-when-empty` runs, some of them SIGKILLed mid-batch
  cancel           `jobs cancel` of random recently enqueued jobs
  retry            a few jobs fail their first attempt (retries, due retries in the claim order)
  due_priority     every 10 s, 400 delayed low-priority jobs and then one high-priority job, all
                   due a second later: the high one must be claimed before the backlog

Issue 26's classes. Cheap ones, on the main deployment (in the CI draw):
  kill_session     KILL CONNECTION of one session of a consumer, by kind in turn: the liveness
                   session of a busy consumer (one in a long, lease-extending job; the class adds
                   a few), its work session, its other sessions (watcher, heartbeat, reaper)
  huge_error       a few jobs whose first attempt fails with a 90 KB non-ASCII error
  fork             a few jobs whose handler forks a child that calls sys.exit(0)
  shared_producer  four threads put() tagged jobs through one shared Producer
  rr_dedup         a REPEATABLE READ caller (and an autocommit one) puts a dedup key another
                   producer has just taken: the key's first job is still pending
  async_handler    one more consumer whose handler is `async def`
Issue 29's class, cheap, on the main deployment (in the CI draw):
  effects          a share of the plain jobs (kind fx) write one row each into an effects table
                   through job.transaction(), which commits it with the job's completion; the
                   checker wants exactly one row per acked job, none for a dead or cancelled one;
                   the queues keep results, and a few jobs return (or give job.transaction()) a
                   result that cannot be encoded: dropped, the job done once, no consumer exits
Issue "trust, round three"'s class, cheap, on the main deployment (in the CI draw):
  kill_query       every ~3 s, a 0.5 s burst of KILL QUERY (kill_query.py): at the watch lock's
                   holder (the instant wake's target, caught between a statement it sent ahead
                   and its reply) and at random sessions of random consumers; the checker's
                   no_progress rule wants no span with jobs ready and nothing started
Issue 38's class, cheap, on a deployment of its own (in the CI draw):
  rate             a queue with `rate` and `rate_per_key` ("rated": its own database, two
                   consumers), fed keyed jobs a little faster than the rate allows (rated.py); the
                   checker's `rate` rule wants no window of one period with more than N starts
Outside attack 35's class, cheap, on the main deployment (in the CI draw):
  bystander        an innocent application (bystander.py): ~40 idle sessions of the consumers'
                   database user, opened at the start and right after each server restart on the
                   ids the consumers had before it; the checker's `bystander_killed` rule wants
                   none of them to die but with the server (a KILL of an id from before a restart)
Cheap classes for two fixed behaviours, on the main deployment (in the CI draw):
  row_lock         about every 5 s, an application (row_lock.py, the server's admin) holds a random
                   ready job's row (one without a key) with BEGIN; SELECT ... FOR UPDATE for 1-4 s,
                   then rolls back; the last one is let go after the workload's last put, on a
                   quiet queue. The checker's `locked_pickup` rule wants each such job (still ready
                   when the lock went, not cancelled) claimed within the deployment's
                   wakeup.poll_max_s and a slack of the lock's end (its batch's first start),
                   or behind a backlog, with no idle span past that and no job ranked after
                   it claimed first
  reload_drop      now and then, some main consumers (each has a config file of its own with the
                   class) are SIGHUPed with their file rewritten without [queue.fq] (mistyped
                   [queue.fqq]), and a burst of 0.25 s jobs of one key is put meanwhile; a few
                   seconds later the file is restored and they are SIGHUPed again (reload_drop.py).
                   The reload must be refused whole: the key_limit rule catches a consumer that
                   applied it (its limit_per_key gone, more runs of the key at once)
A cheap class for a fixed behaviour, on the main deployment (in the CI draw):
  key_lock         about every 6 s, another session (key_lock.py, the server's admin) holds the
                   nq_flow_key row of a key with running jobs for 5-7 s (longer than the lease),
                   as a consumer stopped in the middle of a claim holds it, then rolls back: the
                   outcomes of that key's running jobs wait for it, and must keep their jobs
                   (a reaper may not take them back as expired meanwhile); it excuses no
                   second run (the checker's run_twice and attempts). The holder records the
                   spans in which a transaction waited for its lock: for locked_pickup those
                   are work (an outcome waiting on a key row, maybe the watcher's claim behind
                   it), not an idle fleet; the rest of the hold is judged as any time
  signal_gap       about every 6 s, an application (signal_gap.py, the server's admin) holds a gap
                   lock on nq_signal's key range for 2-4 s (REPEATABLE READ; SELECT ... FOR UPDATE
                   of a queue that does not exist), then rolls back: a new queue's slot rows wait
                   for it. Meanwhile one job is put on a new queue and a `consume
                   --exit-when-empty` starts on another: the checker's `signal_gap` rule wants the
                   put back without an error within 3 s of the hold's end and the consumer gone by
                   itself (status 0) within 20 s of its start; the live queue goes on (no_progress)
Long ones, episodes on a second deployment ("long": lease 30 s, session_idle_s 4, queue fl for
Python handlers, fc and fg for --command), one at a time in a seeded order:
  stall_idle       SIGSTOP a consumer 9 s (> session_idle_s) while five 2 s jobs of its batch
                   wait behind the running one, then SIGCONT
  busy_restart     two consumers in 20 s jobs, a third idle: a clean restart or a crash, by turns
  sighup_reload    SIGHUP with session_idle_s raised 4 -> 40 and queue fl's lease_s lowered
                   30 -> 8, while a 30 s job and a batch of 1.5 s jobs run; then back
  long_command     two 14 s --command jobs on a 6 s lease (command_timeout_s 60)
  grace_expiry     SIGTERM a command consumer with shutdown_grace_s 2 while a 10 s command
                   runs; a peer then serves its queue. Every other time (first on odd seeds) the
                   command is the config's, and the consumer is SIGHUPed while it runs
  grace_restart    SIGTERM a command consumer (two workers, shutdown_grace_s 7) while a 5 s and
                   an 11 s command run, and restart the server (clean) during its grace; an idle
                   peer serves the queue. The short command must be acked, the long one given
                   back uncharged and run again by the peer, the consumer exit 0 within the grace
                   and a few seconds (the checker's grace_restart rule)
  grace_outage     grace_restart's stop, the server away across the grace's end: stopped (clean,
                   or a crash every other play) once the consumer's registration says stopping,
                   held down while the short command ends and while the grace ends, started
                   again 2 s after the grace's end. The same jobs' outcomes, the consumer's exit
                   0 within the grace, the stop's 12 s of waiting for its server, and a few
                   seconds (the checker's grace_outage rule)
  frozen_at_stop   an outside attack's stop: the server frozen (SIGSTOP) just before a Python
                   handler's job ends, the consumer (one worker, claims of one job or of two)
                   SIGTERMed once it ended, the server thawed 3 s after the 3 s grace's end; then
                   a peer starts. The finished job acked once (never run again), nothing started
                   by the stopping consumer after the SIGTERM, the other job given back and run
                   by the peer, the exit 0 within the grace, 12 s and a few seconds (the
                   checker's frozen_at_stop rule)
"""

from __future__ import annotations

import dataclasses
import random

BEFORE_26 = ("sigkill", "stall", "kill_connection", "server_restart", "server_crash", "poison",
             "slow", "polling", "exit_when_empty", "cancel", "retry", "due_priority")
CHEAP_26 = ("kill_session", "huge_error", "fork", "shared_producer", "rr_dedup", "async_handler")
EFFECTS_29 = ("effects",)
STALL_15 = ("kill_query",)
FLOW_38 = ("rate",)
ATTACK_35 = ("bystander",)
LOCK_RELOAD = ("row_lock", "reload_drop")
KEY_LOCK = ("key_lock",)
SIGNAL_GAP = ("signal_gap",)
EPISODES = ("stall_idle", "busy_restart", "sighup_reload", "long_command", "grace_expiry", "grace_restart",
            "grace_outage", "frozen_at_stop")
FAULT_CLASSES = (BEFORE_26 + CHEAP_26 + EFFECTS_29 + STALL_15 + FLOW_38 + ATTACK_35 + LOCK_RELOAD + KEY_LOCK
                 + SIGNAL_GAP + EPISODES)
# What the CI schedule (test_fault_schedule.py) runs: every class but the long episodes (each
# takes 15-45 s of a second deployment; benchmarks/fault_schedule.py runs them).
CI_CLASSES = (BEFORE_26 + CHEAP_26 + EFFECTS_29 + STALL_15 + FLOW_38 + ATTACK_35 + LOCK_RELOAD + KEY_LOCK
              + SIGNAL_GAP)
EPISODE_GAP_S = 3.0  # between two episodes: the long deployment's queue is empty again
# Faults the schedule injects at its own pace (the rest shape the workload or the fleet).
# Step kind -> the class that enables it. A rolling restart (SIGTERM, a fresh process in the
# slot) is no fault, but it is how new consumers join a busy queue: with `polling` it makes
# polling-mode consumers join while lock-mode reapers run.
TIMED = {"sigkill": "sigkill", "stall": "stall", "kill_connection": "kill_connection",
         "server_restart": "server_restart", "server_crash": "server_crash", "cancel": "cancel",
         "rolling_restart": "polling", "kill_session": "kill_session"}
SERVER_GAP_S = 20.0  # at least this long between two server restarts: let the fleet settle
KILL_QUERY_EVERY_S = 3.0  # kill_query's bursts, about this often, on a random stream of their own
ROW_LOCK_EVERY_S = 5.0  # row_lock's locks, about this often (each 1-4 s), on a stream of their own
ROW_LOCK_S = (1.0, 4.0)
# The last lock is taken this long before the workload's end and held the longest: it goes
# after the last put, when no put wakes a consumer and only the consumers' own retry claims it
ROW_LOCK_LAST_LEAD_S = 1.0
RELOAD_DROP_EVERY_S = 20.0  # reload_drop's plays, about this often, on a stream of their own
RELOAD_DROP_S = 5.0  # how long the bad config stays in place
KEY_LOCK_EVERY_S = 6.0  # key_lock's locks, about this often, on a stream of their own
KEY_LOCK_S = (5.0, 7.0)  # each held this long: past the schedule's usual 4 s lease
SIGNAL_GAP_EVERY_S = 6.0  # signal_gap's holds, about this often, on a stream of their own
SIGNAL_GAP_S = (2.0, 4.0)  # each held this long: past the slot rows' 1 s, within any lock wait timeout


def parse_classes(text: str) -> tuple[str, ...]:
    """'all', 'ci' (what CI runs; 'today' is its old name), 'none', or a comma list; a leading
    '-' removes a class ('all,-polling')."""
    chosen: list[str] = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        remove = word.startswith("-")
        name = word.lstrip("-")
        names = {"all": FAULT_CLASSES, "ci": CI_CLASSES, "today": CI_CLASSES, "none": (), "before26": BEFORE_26,
                 "cheap26": CHEAP_26, "effects29": EFFECTS_29, "episodes": EPISODES}.get(name, (name,))
        for n in names:
            if n not in FAULT_CLASSES:
                raise ValueError(f"unknown fault class {n!r}; known: {', '.join(FAULT_CLASSES)}")
            if remove and n in chosen:
                chosen.remove(n)
            elif not remove and n not in chosen:
                chosen.append(n)
    return tuple(c for c in FAULT_CLASSES if c in chosen)


@dataclasses.dataclass(frozen=True)
class Step:
    at_s: float  # offset from the start of the schedule
    kind: str  # a key of TIMED
    pick: float  # in [0, 1): which slot, session or job, resolved against what exists then
    length_s: float = 0.0  # a stall's duration


@dataclasses.dataclass(frozen=True)
class Plan:
    seed: int
    classes: tuple[str, ...]
    duration_s: float
    jobs: int
    consumers: int
    lease_s: float
    steps: tuple[Step, ...]
    fault_every_s: float = 1.5
    episodes: tuple[str, ...] = ()  # the long deployment's episodes, in the order they are played

    def replay_command(self) -> str:
        return (f"benchmarks/fault_schedule.py --seed {self.seed} --classes {','.join(self.classes) or 'none'} "
                f"--seconds {self.duration_s:g} --jobs {self.jobs} --consumers {self.consumers} "
                f"--lease {self.lease_s:g} --fault-every {self.fault_every_s:g}")

    def describe(self) -> str:
        counts: dict[str, int] = {}
        for s in self.steps:
            counts[s.kind] = counts.get(s.kind, 0) + 1
        faults = ", ".join(f"{k} x{v}" for k, v in counts.items()) or "none"
        if self.episodes:
            faults += f"; episodes {' '.join(self.episodes)}"
        return (f"seed {self.seed}: {self.jobs} jobs over {self.duration_s:g}s, {self.consumers} consumers, "
                f"lease {self.lease_s:g}s, classes {','.join(self.classes) or '-'}; timed faults: {faults}")


# Faults on a node of a Galera cluster (tests/cluster/fault_run.py), never in FAULT_CLASSES: the
# single-server schedule has no cluster to run them on.
NODE_FAULTS = ("writer_kill", "node_pause")
NODE_WRITER_PAUSE = 0.6  # a node_pause whose pick is below this pauses the writer, else another node


def make_cluster_plan(seed: int, duration_s: float, jobs: int, consumers: int = 3, lease_s: float = 20.0,
                      node_every_s: float = 30.0, fault_every_s: float = 4.0) -> Plan:
    """The schedule on a 3-node cluster: a node fault every `node_every_s` (writer kill and node
    pause by turns, the first chosen by the seed), a killed node restarted after 6-10 s, a paused
    one resumed after 14-18 s; consumer SIGKILLs
    at random between them. The lease outlasts a paused writer's failover (about 16 s), so a batch
    in flight keeps its claim and is acked on the new writer."""
    rng = random.Random(seed)
    steps: list[Step] = []
    first = rng.randrange(2)
    t, i = min(6.0, node_every_s / 3), 0
    while t < duration_s:
        kind = NODE_FAULTS[(first + i) % 2]
        # A pause outlasts the sessions' read timeout (store/db.py FAILOVER_READ_TIMEOUT_S, 12 s):
        # they find the writer silent, not back.
        length = rng.uniform(14.0, 18.0) if kind == "node_pause" else rng.uniform(6.0, 10.0)
        steps.append(Step(round(t, 3), kind, rng.random(), round(length, 3)))
        t, i = t + node_every_s, i + 1
    t = 0.0
    while True:
        t += rng.uniform(0.5, 1.5) * fault_every_s
        if t >= duration_s:
            break
        steps.append(Step(round(t, 3), "sigkill", rng.random()))
    classes = ("sigkill",) + NODE_FAULTS
    return Plan(seed, classes, duration_s, jobs, consumers, lease_s, tuple(sorted(steps, key=lambda s: s.at_s)),
                fault_every_s)


def make_plan(seed: int, classes: tuple[str, ...], duration_s: float, jobs: int, consumers: int = 4,
              lease_s: float = 4.0, fault_every_s: float = 1.5) -> Plan:
    rng = random.Random(seed)
    timed = [kind for kind, cls in TIMED.items() if cls in classes]
    steps: list[Step] = []
    t, last_server = 0.0, -SERVER_GAP_S / 2
    while timed:
        t += rng.uniform(0.5, 1.5) * fault_every_s
        if t >= duration_s:
            break
        kind = rng.choice(timed)
        if kind.startswith("server") and t - last_server < SERVER_GAP_S:
            kind = rng.choice([k for k in timed if not k.startswith("server")] or ["sigkill"])
            if kind not in timed:
                continue
        if kind.startswith("server"):
            last_server = t
        length = rng.uniform(lease_s + 1.0, lease_s + 3.0) if kind == "stall" else 0.0
        steps.append(Step(round(t, 3), kind, rng.random(), round(length, 3)))
    if "kill_query" in classes:  # a stream of its own: the other faults keep their offsets
        kill_rng, t = random.Random(seed * 1000 + 15), 0.0
        while (t := t + kill_rng.uniform(0.5, 1.5) * KILL_QUERY_EVERY_S) < duration_s:
            steps.append(Step(round(t, 3), "kill_query", kill_rng.random()))
        steps.sort(key=lambda s: s.at_s)
    steps += _lock_reload_steps(seed, classes, duration_s)
    steps.sort(key=lambda s: s.at_s)
    return Plan(seed, classes, duration_s, jobs, consumers, lease_s, tuple(steps), fault_every_s,
                episode_order(seed, classes, duration_s))


def _lock_reload_steps(seed: int, classes: tuple[str, ...], duration_s: float) -> list[Step]:
    """row_lock's, key_lock's, signal_gap's and reload_drop's steps, each class on a stream of its
    own: the other faults keep their offsets, and each keeps its own with or without the others."""
    steps: list[Step] = []
    if "row_lock" in classes:
        rng, t = random.Random(seed * 1000 + 41), 0.0
        last = duration_s - ROW_LOCK_LAST_LEAD_S
        while (t := t + rng.uniform(0.5, 1.5) * ROW_LOCK_EVERY_S) < last - ROW_LOCK_S[1]:
            steps.append(Step(round(t, 3), "row_lock", rng.random(), round(rng.uniform(*ROW_LOCK_S), 3)))
        if last > 0:
            steps.append(Step(round(last, 3), "row_lock", rng.random(), ROW_LOCK_S[1]))
    if "key_lock" in classes:
        rng, t = random.Random(seed * 1000 + 43), 0.0
        while (t := t + rng.uniform(0.5, 1.5) * KEY_LOCK_EVERY_S) < duration_s - KEY_LOCK_S[1]:
            steps.append(Step(round(t, 3), "key_lock", rng.random(), round(rng.uniform(*KEY_LOCK_S), 3)))
    if "signal_gap" in classes:
        rng, t = random.Random(seed * 1000 + 44), 0.0
        while (t := t + rng.uniform(0.5, 1.5) * SIGNAL_GAP_EVERY_S) < duration_s - SIGNAL_GAP_S[1]:
            steps.append(Step(round(t, 3), "signal_gap", rng.random(), round(rng.uniform(*SIGNAL_GAP_S), 3)))
    if "reload_drop" in classes:
        rng, t = random.Random(seed * 1000 + 42), 0.0
        while (t := t + rng.uniform(0.5, 1.5) * RELOAD_DROP_EVERY_S) < duration_s - RELOAD_DROP_S:
            steps.append(Step(round(t, 3), "reload_drop", rng.random(), RELOAD_DROP_S))
    return steps


# About how long each episode takes (episodes.py), to fit them in the run's duration
EPISODE_S = {"stall_idle": 20.0, "busy_restart": 30.0, "sighup_reload": 50.0, "long_command": 25.0,
             "grace_expiry": 25.0, "grace_restart": 28.0, "grace_outage": 32.0,
             "frozen_at_stop": 22.0}


def episode_order(seed: int, classes: tuple[str, ...], duration_s: float) -> tuple[str, ...]:
    """Every chosen episode once in a seeded order, then again in a new order while time is
    left. Its own random stream: choosing episodes leaves the timed faults' offsets as they were."""
    chosen = [c for c in EPISODES if c in classes]
    rng = random.Random(seed * 1000 + 26)
    order: list[str] = []
    t = 0.0
    while chosen:
        rng.shuffle(chosen)
        for name in chosen:
            if order and t + EPISODE_S[name] > duration_s:
                return tuple(order)
            order.append(name)
            t += EPISODE_S[name] + EPISODE_GAP_S
    return tuple(order)
