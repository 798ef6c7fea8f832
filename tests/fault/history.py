"""What a fault-schedule run leaves behind, as plain data the checker reads.

Its sources, all timed on CLOCK_MONOTONIC (shared by every process of the machine):
- runs: the handler's start/end lines (tests/helpers/nqfault.py), one Run per start;
- enqueues: every enqueue the producer saw acknowledged (the call returned, the commit landed);
- faults: what the schedule did, to which process, when;
- hand-backs: claimed jobs given back unstarted, from the consumers' log lines;
- the final rows of the jobs table after the drain, and the claim-recovery times the monitor saw;
- the effect rows that `fx` jobs' handlers wrote through job.transaction() (issue 29);
- the bystander application's sessions that died (outside attack 35);
- the row_lock class's locks on ready jobs' rows (when each was taken and let go);
- the key_lock class's locks on key rows, with the spans in which a session waited for one;
- the signal_gap class's gap locks on nq_signal's key range, and the puts on new queues made
  under them;
- the reapers' take-backs of expired leases, with the jobs each named.

A job is named by (deploy, id): the schedule may run two notifyq databases (deployments).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Collection
from pathlib import Path

NS = 1_000_000_000

JobKey = tuple[str, int]


@dataclasses.dataclass
class Run:
    deploy: str
    job: int
    attempt: int
    pid: int
    token: int
    start: float  # monotonic seconds
    wall_start: float  # epoch seconds at the same instant (to place run_at on the monotonic clock)
    priority: int
    run_at: float  # epoch seconds (server time, UTC)
    end: float | None = None  # None: the process died (or stopped) before the handler returned
    outcome: str | None = None  # ok | fail
    flags: str = ""  # L: kept its lease (extended it), C: a --command run, F: forked a child
    tag: str = ""  # the put() that stored the job (payload "u"), when the workload tagged it
    proc: int = 0  # the process the handler ran in when not `pid` (a --command's own pid)
    flow_key: str = ""  # the job's flow-control key (Job.key), "" without one
    # A rated queue's job: when its claim spent its starts (epoch seconds, the server's clock:
    # the rate log's own time for the claim's token, read by the handler); 0.0: not read
    spent_at: float = 0.0
    # An fx job: when its job.transaction() block was about to COMMIT (monotonic), which
    # completes the job before its end line; None: not such a run
    commit_at: float | None = None

    @property
    def keeps_lease(self) -> bool:
        """Its handler extended its lease (or its consumer owed it that, for a command within
        command_timeout_s): running past the lease is no excuse for a second run of it."""
        return "L" in self.flags or "C" in self.flags

    @property
    def key(self) -> JobKey:
        return (self.deploy, self.job)

    @property
    def spent_at_mono(self) -> float | None:
        """When its claim spent its rate starts, on the monotonic clock (None: not recorded)."""
        return self.spent_at - (self.wall_start - self.start) if self.spent_at else None

    @property
    def run_at_mono(self) -> float:
        """When the job became due, on the monotonic clock."""
        return self.run_at - (self.wall_start - self.start)


@dataclasses.dataclass(frozen=True)
class Enqueue:
    deploy: str
    job: int
    kind: str  # "" (plain), poison, unwind, fail1, slow
    method: str  # put, put_many, delayed, priority, dedup, transactional
    priority: int
    delay_s: float
    acked_at: float  # monotonic, when the call (or the caller's COMMIT) returned
    tag: str = ""  # payload "u" of a tagged put (shared_producer), "" otherwise
    dedup: str = ""  # the dedup key it was put with
    called_at: float | None = None  # monotonic, when the put was called (dedup checks)

    @property
    def key(self) -> JobKey:
        return (self.deploy, self.job)


@dataclasses.dataclass(frozen=True)
class Refused:
    """A tagged put() that raised (not OutcomeUnknown): it must have stored nothing."""
    deploy: str
    tag: str
    error: str


@dataclasses.dataclass(frozen=True)
class Exit:
    """A consumer process's end, as the harness saw it (`at` is no earlier than the real exit)."""
    pid: int
    at: float  # monotonic
    code: int | None
    expected: bool  # the schedule's doing (SIGKILL, SIGTERM, a poison job, a refused handler)
    why: str = ""


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str  # sigkill, stall, kill_connection, server_restart, server_crash, poison_exit, cancel,
    #            kill_session, busy_restart, busy_crash, sighup, grace_expiry, grace_restart (its
    #            detail "shutdown_grace_s=N"; checker.EXCUSE);
    #            taken_back: not a fault but its evidence, a reaper's log line "consumer died, jobs
    #            returned" (pid: the process it named, detail: the reaper's pid); re_registered:
    #            evidence too, a process's "liveness session reconnected" line (pid: that process)
    start: float  # monotonic
    end: float  # == start for instantaneous faults; SIGCONT time for a stall, back-up for a server
    pid: int | None = None  # the process hit; None: every process (the server)
    job: JobKey | None = None  # cancel: the job; poison_exit: the job that crashed its process
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class HandBack:
    """Jobs a claim gave back unstarted (a consumer's log line: the lineup watch's hand-back, or
    a worker's give-back of what it did not start): each was claimed, by (pid, token), from
    before that claim's first start until `at`, and is claimable again from then. No start line
    shows such a claim, so without this the checker would take the job for claimable all along."""
    deploy: str
    pid: int
    token: int
    jobs: tuple[int, ...]
    at: float  # monotonic, when the line was written (after the give-back's COMMIT)


@dataclasses.dataclass(frozen=True)
class LeaseTakeBack:
    """A reaper's take-back of claimed jobs whose lease ran out (its "leases expired" line names
    them): by the process `reaper`, from the consumer whose pid is `owner` (None: the monitor
    never saw its registration), at `at` (monotonic, after the take-back's COMMIT). Evidence, not
    a fault: a live consumer's jobs taken back so were finished and not acked (or not extended)
    within their lease, and run again, uncharged when taken back together."""
    deploy: str
    reaper: int
    owner: int | None
    jobs: tuple[int, ...]
    at: float


@dataclasses.dataclass(frozen=True)
class BystanderLoss:
    """A session of the bystander application (bystander.py) that stopped answering: it was
    open and answered at `last_ok`, and failed at `seen_at` (monotonic)."""
    conn_id: int  # its server id
    opened_at: float
    last_ok: float
    seen_at: float
    error: str


@dataclasses.dataclass(frozen=True)
class RowLock:
    """An application's BEGIN; SELECT ... FOR UPDATE on a ready job's row (row_lock.py): held
    from `start` (the locking read returned) until `end` (the ROLLBACK returned; monotonic).
    status: the job's status read in that transaction just before the ROLLBACK (0: still
    ready); None when the session was lost first (a server fault ended the lock, when is not
    known)."""
    deploy: str
    job: int
    start: float
    end: float
    status: int | None

    @property
    def key(self) -> JobKey:
        return (self.deploy, self.job)


@dataclasses.dataclass(frozen=True)
class KeyLock:
    """An outside session's lock on a key's nq_flow_key row (key_lock.py): held from `start`
    (the locking read returned) until `end` (the ROLLBACK returned, or its session lost;
    monotonic). waits: the spans in which the holder saw a transaction waiting for its lock (an
    outcome of a job of the key: a claim carrying its ack, a failure, a give-back), each from
    the first look that saw one to the first that saw none, or to `end`."""
    deploy: str
    key: str
    start: float
    end: float
    waits: tuple[tuple[float, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class GapPut:
    """A put of one job on a queue that did not exist, made while a signal_gap hold held the gap
    its slot rows go in (signal_gap.py): from `start` to `end` (monotonic); error: what it
    raised ("" when it returned)."""
    queue: str
    start: float
    end: float
    error: str = ""


@dataclasses.dataclass(frozen=True)
class SignalGap:
    """An outside session's gap lock on nq_signal's key range (signal_gap.py): a locking read of
    a queue that does not exist, under REPEATABLE READ, held from `start` (the read returned)
    until `end` (the ROLLBACK returned, or its session lost; monotonic). gap: an INSERT of that
    queue's row on another session was refused meanwhile (the gap really was locked); puts: the
    puts on a new queue made during the hold; consumer: the pid of the `consume
    --exit-when-empty` started on another new queue as the hold began (None: none)."""
    deploy: str
    queue: str
    start: float
    end: float
    gap: bool
    puts: tuple[GapPut, ...] = ()
    consumer: int | None = None


@dataclasses.dataclass(frozen=True)
class FinalRow:
    deploy: str
    job: int
    status: int  # 0 ready, 1 scheduled, 2 claimed, 3 done, 4 dead
    attempts: int
    last_error: str | None
    owner: str | None


@dataclasses.dataclass
class History:
    runs: list[Run]
    enqueues: list[Enqueue]
    faults: list[Fault]
    final_rows: list[FinalRow]
    lease_s: float  # the consumers' lease
    # per killed consumer id: seconds after its death its jobs were last seen claimed (monitor.py)
    recovery_s: dict[str, float | None] = dataclasses.field(default_factory=dict)
    recovery_bound_s: float = 10.0
    # per gone consumer (recovery_s's names): seconds in which no consumer of its deployment ran
    recovery_unattended_s: dict[str, float] = dataclasses.field(default_factory=dict)
    exits: list[Exit] = dataclasses.field(default_factory=list)
    refused: list[Refused] = dataclasses.field(default_factory=list)
    consumer_pids: set[int] = dataclasses.field(default_factory=set)  # empty: not known, not judged
    lease_by_deploy: dict[str, float] = dataclasses.field(default_factory=dict)  # else lease_s
    # issue 29: effect rows per job (the `effects` handler mode writes one through job.transaction())
    effects: dict[JobKey, int] = dataclasses.field(default_factory=dict)
    # kept results that are not valid JSON (JSON_VALID 0), by job: the effects class's unenc jobs
    # return NaN and lone surrogates, which must be dropped, never kept as invalid JSON
    invalid_results: list[JobKey] = dataclasses.field(default_factory=list)
    # issue 38, rate limits: deploy -> its queue's rates, each (N, period_s, per_key): at most N
    # starts in any window of period_s, of the queue as a whole (per_key False) or of each job
    # key apart; and the key each keyed job was put with
    rates: dict[str, list[tuple[int, float, bool]]] = dataclasses.field(default_factory=dict)
    job_keys: dict[JobKey, str] = dataclasses.field(default_factory=dict)
    hand_backs: list[HandBack] = dataclasses.field(default_factory=list)
    # issue 38: each deployment's limit_per_key (none: its runs are not judged by key_limit)
    key_limits: dict[str, int] = dataclasses.field(default_factory=dict)
    # outside attack 35: sessions of the bystander application that died (bystander.py)
    bystander_losses: list[BystanderLoss] = dataclasses.field(default_factory=list)
    # the row_lock class: an application's locks on ready jobs' rows, and each deployment's
    # wakeup.poll_max_s (its consumers' largest: the longest wait before a claim is tried again)
    row_locks: list[RowLock] = dataclasses.field(default_factory=list)
    # the key_lock class: an outside session's locks on key rows (their faults are in `faults`)
    key_locks: list[KeyLock] = dataclasses.field(default_factory=list)
    # the signal_gap class: an outside session's gap locks on nq_signal, with their new-queue puts
    signal_gaps: list[SignalGap] = dataclasses.field(default_factory=list)
    poll_max_s: dict[str, float] = dataclasses.field(default_factory=dict)
    # reapers' take-backs of expired leases, with the jobs they named (the checker's messages)
    lease_takebacks: list[LeaseTakeBack] = dataclasses.field(default_factory=list)

    def lease_of(self, deploy: str) -> float:
        return self.lease_by_deploy.get(deploy, self.lease_s)

    def runs_by_job(self) -> dict[JobKey, list[Run]]:
        by_job: dict[JobKey, list[Run]] = defaultdict(list)
        for run in self.runs:
            by_job[run.key].append(run)
        for runs in by_job.values():
            runs.sort(key=lambda r: r.start)
        return by_job


def read_runs(out: Path, pids: Collection[int] | None = None) -> list[Run]:
    """Every start, joined with its end (same deploy, job, attempt, pid and token); pids: only
    these consumers' records and the --command runs' (cmd*.log). The schedule's look-ups during
    a run pass them: all records of a long run are hundreds of thousands of lines, and parsing them
    several times a second held the harness's other threads back (its cron runs came late)."""
    runs: list[Run] = []
    open_runs: dict[tuple, Run] = {}
    paths = out.glob("*.log") if pids is None else [
        *(out / f"{pid}.log" for pid in pids if (out / f"{pid}.log").exists()), *out.glob("cmd*.log")]
    for path in sorted(paths):
        for line in path.read_text().splitlines():
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "S" and len(parts) >= 10:
                deploy, job, attempt, pid, token = parts[1], *map(int, parts[2:6])
                extra = dict(p.split("=", 1) for p in parts[10:] if "=" in p)
                run = Run(deploy, job, attempt, pid, token, int(parts[6]) / NS, int(parts[7]) / NS,
                          int(parts[8]), int(parts[9]) / 1e6, flags=extra.get("f", ""), tag=extra.get("u", ""),
                          proc=int(extra.get("c", 0)), flow_key=extra.get("k", ""),
                          spent_at=int(extra.get("m", 0)) / 1e6)
                runs.append(run)
                open_runs[(deploy, job, attempt, pid, token)] = run
            elif parts[0] == "C" and len(parts) == 7:
                deploy, job, attempt, pid, token = parts[1], *map(int, parts[2:6])
                run = open_runs.get((deploy, job, attempt, pid, token))
                if run is not None:
                    run.commit_at = int(parts[6]) / NS
            elif parts[0] == "E" and len(parts) == 8:
                deploy, job, attempt, pid, token = parts[1], *map(int, parts[2:6])
                run = open_runs.pop((deploy, job, attempt, pid, token), None)
                if run is not None:
                    run.end, run.outcome = int(parts[6]) / NS, parts[7]
    return runs


def poison_exits(runs: list[Run], poison: set[JobKey]) -> list[Fault]:
    """A poison job's start is the moment its process died (it os._exits right after the line)."""
    return [Fault("poison_exit", r.start, r.start, r.pid, r.key) for r in runs if r.key in poison]
