"""The history checker: does a fault-schedule run keep notifyq's delivery contract?

The contract (issue 13, "The contract to hold"), one rule per function below:
- lost: every acknowledged enqueue is handled at least once, or ends dead with a reason, or
  was cancelled by the schedule (the operator);
- innocent_dead: only poison jobs (the ones that crash their process), jobs the operator
  cancelled, slow jobs (of their expired leases) and jobs whose last run was cut short by a
  fault on their own process (taken back alone, charged) may end dead;
- duplicates: a job runs again (other than a retry after a failure) only when a process that
  ran or held it was killed or stalled, lost a connection, saw the server restart, or when the
  earlier run itself outlasted the lease. Any other second run is a violation: concurrent
  ("running in two places at once") or sequential ("run twice while its consumer was healthy");
- attempts: `attempts_ok`, the README's rule exactly: the k-th start is attempt k, with its two
  documented exceptions, each allowed only where a fault (or a run past its lease) explains it;
- after_cancel: a job the operator cancelled never starts again;
- charged_interrupt (issue 40, item 10): a job its consumer's shutdown grace interrupted (a
  grace_expiry) is given back uncharged: its next start repeats the attempt number. A crash
  still charges (innocent_dead, attempts): a job that kills its consumer every time ends dead;
- stranded: nothing stays claimed by a consumer that is gone (after the drain, and within the
  recovery bound while the schedule runs);
- priority: among jobs that were claimable at the same time, a claim never takes a lower
  priority one while a higher priority one waits (a keyed job under a limit excepted: its key's
  limit may hold it back). Asserted only where the history proves both
  were claimable and untouched by any fault; ties (run_at, id) are asserted only within a batch.

Issue 26 ("a live consumer keeps what it holds", "a worker never starts a job it no longer
owns", "an id that put() returned is always stored"):
- stale_start: no start under a claim that had been taken back (another claim started the job
  since this claim's first start), whatever the faults;
- orphaned_run: no handler (a --command) still running after its consumer exited;
- consumer_exit: no consumer process ends unless the schedule ended it;
- stray_process: no job starts in a process the harness did not start (a forked child);
- stored_after_raise / wrong_id: a put() that raised stored nothing, and the id a put()
  returned is the job it stored (tagged puts);
- dedup_twice: never two pending jobs with one dedup key;
- grace_restart: a consumer stopped while its jobs ran, the server restarting in its grace (the
  grace_restart episode), acks each job that ended within the grace (it never runs again, and is
  not left in the table), gives back each that still ran at the grace's end (it runs again on
  another process, repeating the attempt: uncharged), and exits 0 within the grace and
  GRACE_EXIT_BOUND_S;
- grace_outage: the same of a stop whose server was away across its grace's end (the
  grace_outage episode: down while the short command ended and while the grace ended, back
  within SETTLE_AT_EXIT_S of its end): the short job acked, the long one given back uncharged,
  the exit 0 within the grace, SETTLE_AT_EXIT_S (the stop waits that long for its server to
  settle what it held) and GRACE_EXIT_BOUND_S;
- frozen_at_stop: the same of a stop that came with the server frozen (SIGSTOP), a job of the
  consumer having ended just before (FROZEN_LEAD_S), the server thawed after the grace's end,
  within SETTLE_AT_EXIT_S (the frozen_at_stop episode): that job acked (never run again, not left
  in the table), nothing started by the process after the SIGTERM, the exit as grace_outage's;
Issue 29 ("exactly-once effects"): a job of the `effects` mode (kind fx) writes one row through
job.transaction(), which commits it with the job's completion:
- double_effect: never two effect rows for one job, whatever the faults;
- missing_effect: a job acked (gone from the table, not by a cancel; or kept done) has its row;
- effect_of_dead / effect_of_cancelled: a job that ended dead, or was cancelled before it
  completed, has none.
Issue 38 (rate limits):
- rate: never more than N starts of a rated queue (`rate`), or of one key (`rate_per_key`), in
  any window of the period. A start is counted at its claim's time, as the rate log wrote it
  (each run of the claim: a batch's later jobs begin as the ones before them end); the handler
  reads it from the log (Run.spent_at). Where it could not, the claim's first start line stands
  in, later than the spend by up to RATE_SLACK_S; a fault on either process (or the server) in
  the window excuses it (a stalled process's start line comes late; a killed one's claim may
  have committed unread).

Issue 38 ("flow control"):
- key_limit: at no instant more than N runs of a key (the deployment's limit_per_key) hold
  their claims. A run holds its claim from its start until it ends, or until something could
  have taken the claim from it: a fault on its process (its kill, stall, a KILL of one of its
  sessions, a peer's take-back, whose log line may come up to 0.5 s after it) or on the
  server, or its lease running out (a handler that
  kept its lease excepted). Such a run may go on after its slot went to another job of the
  key (its ack is fenced out): the documented semantics, not a violation. A job completed by
  its own job.transaction() block (fx) frees its slot with that COMMIT, before its end line:
  its run ends at the block's last line (Run.commit_at).

Outside attack 35 (a KILL of a connection id from before a server restart):
- bystander_killed: a session of the bystander application (same database user, opened right
  after each restart on the ids the consumers had before it) dies only with the server: a
  server fault between its last answer and its failure. No other fault excuses it (the
  schedule's own KILLs leave its sessions alone).
"Trust, round three" (no silent stall):
- no_progress: on the main deployment, never a span longer than STALL_BOUND_S in which a job
  was ready (put() had returned, no delay, not cancelled, not started yet), no handler ran and
  none started, unless a fault other than a kill_query or a SIGHUP came within a lease and the
  bound before it (a killed or stopped consumer's claims wait for a reaper or their lease).
A ready job's row held by an application (the row_lock class: BEGIN; SELECT ... FOR UPDATE):
- locked_pickup: a job still ready when the lock went (not cancelled) is claimed (its batch's
  first start) within the deployment's wakeup.poll_max_s and LOCKED_PICKUP_SLACK_S of the lock's
  end (of the last lock, when the next one took the same job again before a claim did), unless
  the server restarted between the lock and the start, the starting process was hit
  (it may have claimed the job and stopped), a claim of the job was lost or handed back
  unstarted in between, a reaper took a claim back in between, or a consumer was stopped as the lock went (the watch it may hold
  wakes nobody); and a late claim is a violation only where the fleet sat idle longer than
  that bound while the job waited, or a claim begun past it took a job ranked after it in claim
  order: behind a backlog, its turn comes when the jobs ahead of it are done. Its held span is no ready span for no_progress, and no claimable one for
  priority. A span in which a session of the deployment waited for a key row an outside
  session held (the key_lock class; the holder records when it saw a waiter) is no idle span:
  an outcome of the key's job waits there (a claim carrying its ack, maybe the one watcher's),
  and so does that claim; the rest of the hold, and the time after it, count as before.
A gap lock an outside session holds on nq_signal's key range (the signal_gap class):
- signal_gap: a put of one job on a new queue, made while the gap its slot rows go in was held,
  returns without an error within GAP_PUT_BOUND_S of the hold's end; the `consume
  --exit-when-empty` started on another new queue as the hold began exits by itself, status 0,
  within GAP_CONSUMER_BOUND_S of the hold's start. A server fault, or a KILL of the harness's
  (the producer's) session, while the put ran excuses its error or lateness; a server fault or a
  fault on the consumer's process before its exit excuses its lateness, not its status.
- the new faults excuse less than the old ones (EXCUSE): a KILL of a session excuses a peer's
  second run, not the process's own; a server restart excuses the second run of a job that had
  finished before it, not of one whose handler ran through it; a SIGHUP excuses nothing. A
  handler that keeps its lease (Run.keeps_lease) never excuses its own second run as past-lease.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
from collections.abc import Iterable

# The worker's rule: a lease push just before a start, once this share of the lease has passed
# since the claim or the last push
from notifyq.config import WakeupConfig
from notifyq.consume.batch import EXTEND_EVERY
from notifyq.consume.service import SETTLE_AT_EXIT_S

from .history import Fault, History, JobKey, Run

# Which fault explains a second run, in the order a cause is named. Faults on one process
# explain runs of that process; server faults explain every run.
PROCESS_CAUSES = {"sigkill": "sigkill", "poison_exit": "poison", "stall": "stall",
                  "kill_connection": "kill_connection"}
# On a Galera cluster (tests/cluster/fault_run.py) a node fault reaches every process through
# the failover it forces (or the eviction stall of a paused non-writer): its window runs from the
# fault until the node is a Synced member again. A duplicate it explains was in flight then.
SERVER_CAUSES = {"server_restart": "server", "server_crash": "server",
                 "writer_kill": "failover_kill", "node_pause": "failover_pause",
                 "busy_restart": "server_busy", "busy_crash": "server_busy", "server_frozen": "server_frozen"}
# What a fault may excuse (duplicate_cause), by kind; "any" when not listed:
# peer      a second run on another process than the one hit, or on the hit process itself once a
#           peer's reaper took back the claim it ran under (a `taken_back` record after that claim
#           began; its liveness session was the one killed, and the claim predates the process's
#           re-registration): a peer may take back what a process held while its session was gone
#           (presence.py's trust rules), and the jobs are then anyone's to claim; but a process
#           never takes its own claims back (issue 26 item 3, checked directly: the self_reap rule);
# finished  only the second run of a job whose run had ended before the fault (its ack may have
#           been in flight); one whose handler ran through it was a live consumer's (item 5);
# never     a reload changes settings, it takes nothing back (item 6);
# interrupted  only the second run of a job whose run the fault cut short (no end line): a stop
#           whose grace the server restarted in (or was away across the end of) gives back what
#           still ran at the grace's end, and acks what ended before it.
EXCUSE = {"kill_session": "peer", "busy_restart": "finished", "busy_crash": "finished", "sighup": "never",
          "grace_restart": "interrupted", "grace_outage": "interrupted", "server_frozen": "interrupted",
          "frozen_at_stop": "interrupted"}
# Records that are not faults: a reaper's take-back, a process's re-registration (evidence for
# the "peer" excuse), and the operator's cancel (the after_cancel rule's)
EVIDENCE = ("cancel", "taken_back", "re_registered")
CLOCK_SLACK_S = 0.25  # run_at (server clock) against CLOCK_MONOTONIC, and scheduling jitter
LOG_SLACK_S = 0.002  # a log line's wall-clock millisecond against CLOCK_MONOTONIC
TAKEBACK_LOG_SLACK_S = 0.5  # key_limit: how late a reaper's "jobs returned" line may follow its COMMIT
DEAD = 4
DONE = 3
CANCELLED = 5  # issue 29: a job cancelled while it ran ends in a state of its own
CLAIMED = 2
STALL_BOUND_S = 5.0  # no_progress: a fleet with ready jobs starts one within this (poll_max_s is 1 s)
STALL_DEPLOY = "main"  # the other deployments idle between cron runs or episodes by design
# rate: a claim's COMMIT to its first start line, on a healthy but loaded process (a fresh
# consumer's first claim, the full schedule on 2 cores: up to 0.12 s seen); a shared budget's
# lost lock lets starts through a whole period early, far past it
RATE_SLACK_S = CLOCK_SLACK_S
RATE_EXACT_SLACK_S = 0.001  # the rate log's own times: DATETIME(6), one server clock
# grace_restart: after its grace, a consumer whose server answers gives back and unregisters in
# a moment (docs/deploys.md); this bounds that moment, and the harness's look at its exit
GRACE_EXIT_BOUND_S = 5.0
# grace_restart: a run that ended this close to the grace's end may have missed its ack (the
# stop's settle raced it): given back and run again is then as right as acked
GRACE_ACK_SLACK_S = 1.0
STOP_MARK_S = 2.0  # grace_restart: a stop's mark lands within this (a connect, one UPDATE)
# The stops the grace rule judges (their records' kind, which is the rule's name) -> how long
# after the grace's end the consumer may exit: grace_restart's server is back within the grace;
# grace_outage's is away at its end, and the stop waits for it SETTLE_AT_EXIT_S at most
GRACE_STOPS = {"grace_restart": GRACE_EXIT_BOUND_S, "grace_outage": SETTLE_AT_EXIT_S + GRACE_EXIT_BOUND_S,
               "frozen_at_stop": SETTLE_AT_EXIT_S + GRACE_EXIT_BOUND_S}
# frozen_at_stop: the runs it judges include one that ended up to this long before the SIGTERM
# (the server froze just before it ended: its ack met the frozen server)
FROZEN_LEAD_S = 3.0
# locked_pickup: past poll_max_s (the longest wait before an idle consumer claims again), the
# claim and its first start on a loaded 2-core box: the waiting thread's wake-up and the claim's
# round trips compete for the CPU with a dozen consumers, the harness's producers and the server
# itself (a start line up to a second late is seen under the full schedule), and the claim may
# land behind a batch of 0.1 s jobs' acks; a job waiting for the safety claim (60 s) is far past it
LOCKED_PICKUP_SLACK_S = 3.0
READY = 0
# signal_gap: a put on a new queue waits for the gap lock once (its signal row's INSERT), after
# the slot rows' best effort gave up (about 1 s, RETRY_S, inside the hold): it is back as the
# lock goes, plus its own round trips and the harness's CPU share on the loaded 2-core box (the
# lock-holding sessions' slack, as LOCKED_PICKUP_SLACK_S). A put that waited out a lock wait
# timeout (10 s on notifyq's session) and retried is far past it.
GAP_PUT_BOUND_S = 3.0
# a `consume --exit-when-empty` on a new queue: the interpreter's start on the loaded box (a few
# seconds), the registration, whose slot rows give up after about 1 s, an empty claim, the exit;
# the harness sees the exit at its next look (0.5 s). One stuck in its registration (a lock wait
# timeout, retried) or not leaving is far past it.
GAP_CONSUMER_BOUND_S = 20.0

@dataclasses.dataclass(frozen=True)
class Violation:
    rule: str
    job: JobKey | None
    detail: str

    def __str__(self) -> str:
        where = f" job {self.job[0]}/{self.job[1]}" if self.job else ""
        return f"{self.rule}{where}: {self.detail}"


@dataclasses.dataclass
class Report:
    violations: list[Violation]
    jobs: int
    runs: int
    lost: int
    innocent_dead: int
    dead: int
    duplicates: dict[str, int]  # extra runs by cause
    concurrent: int  # of those, runs that overlapped another run of the same job
    priority_checked: int  # batches the cross-batch priority rule could judge
    max_recovery_s: float | None
    effect_jobs: int = 0  # issue 29: fx jobs, and the effect rows their handlers committed
    effect_rows: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_rule(self) -> dict[str, int]:
        return dict(collections.Counter(v.rule for v in self.violations))

    def examples(self, per_rule: int = 5) -> list[Violation]:
        """The first few violations of each rule: one rule's flood must not hide another's."""
        seen: collections.Counter = collections.Counter()
        out = []
        for v in self.violations:
            seen[v.rule] += 1
            if seen[v.rule] <= per_rule:
                out.append(v)
        return out


# ------------------------------------------------------------------ the rules


def check_lost(h: History) -> list[Violation]:
    # A completion committed with the effect is a handling, even when the process died before
    # its handler's end line (SIGKILL right after the COMMIT)
    done = {r.key for r in h.runs if r.outcome == "ok"} | {k for k, n in h.effects.items() if n}
    dead = {(f.deploy, f.job) for f in h.final_rows if f.status in (DEAD, CANCELLED) and f.last_error}
    cancelled = {f.job for f in h.faults if f.kind == "cancel" and f.detail in ("deleted", "requested")}
    left = {(f.deploy, f.job): f for f in h.final_rows}
    out = []
    for key in sorted({e.key for e in h.enqueues}):
        if key in done or key in dead or key in cancelled:
            continue
        row = left.get(key)
        state = f"still in the table with status {row.status}" if row else "gone without a successful run"
        out.append(Violation("lost", key, state))
    for row in h.final_rows:
        if row.status in (DEAD, CANCELLED) and not row.last_error:
            out.append(Violation("dead_without_reason", (row.deploy, row.job), "dead, last_error empty"))
    return out


def check_innocent_dead(h: History, faults: Faults) -> list[Violation]:
    """Poison jobs die of the crashes they cause, cancelled ones of their cancel, and a job whose
    handler always outlasts the lease (it never extends it) of its expired leases: each is
    the job's own doing, charged to it alone.

    One more death is the contract's, not the job's: a job alone in its consumer's hands when
    that consumer dies is charged (a crash it causes and a kill that hits while it runs look
    alike from outside), also when it died between the job's end and its ack. So a job whose
    last run was hit by a fault on its own process, or by the server, during or after it (the
    earlier charges are the attempt rule's to judge), may end dead with "consumer died" or
    "lease expired"."""
    poison = {e.key for e in h.enqueues if e.kind in ("poison", "unwind")}
    slow = {e.key for e in h.enqueues if e.kind == "slow"}
    cancelled = {f.job for f in h.faults if f.kind == "cancel" and f.detail == "requested"}
    runs = h.runs_by_job()
    out = []
    for r in h.final_rows:
        key = (r.deploy, r.job)
        if r.status != DEAD or key in poison | cancelled:
            continue
        error = r.last_error or ""
        if key in slow and error.startswith("lease expired"):
            continue
        last = runs[key][-1] if runs.get(key) else None
        if (error.startswith(("consumer died", "lease expired")) and last is not None
                and faults.cause({last.pid}, last.start, float("inf"))):
            continue
        out.append(Violation("innocent_dead", key, f"attempts {r.attempts}: {r.last_error}"))
    return out


def lease_out_bounds(runs: Iterable[Run], lease_s: float) -> dict[tuple, float]:
    """For each run (by run_id), a time by which its lease had run out unless its handler
    extended it: its start plus the lease, since the worker may have pushed the lease out just
    before starting it; or, sooner, the start of its batch's first job plus the lease, when no
    push can have come before the run started. That holds when the run started within
    EXTEND_EVERY of a lease after its process's previous batch ended: the claim came after that
    end (one worker per process, as the fleet runs them), and a push needs that much time since
    the claim. A job 0.2 s into its batch, started again 3.99 s after its own start, was 4.2 s
    past the claim of a 4 s lease: its second run is the contract's, not a violation."""
    out: dict[tuple, float] = {}
    by_pid: dict[int, list[Run]] = collections.defaultdict(list)
    for r in runs:
        out[run_id(r)] = r.start + lease_s
        if r.token:
            by_pid[r.pid].append(r)
    for mine in by_pid.values():
        batches: dict[int, list[Run]] = {}
        for r in sorted(mine, key=lambda r: r.start):
            batches.setdefault(r.token, []).append(r)
        previous_end: float | None = None
        for batch in batches.values():  # in the order their first jobs started
            first = batch[0].start
            for r in batch:
                if previous_end is not None and r.start < previous_end + lease_s * EXTEND_EVERY:
                    out[run_id(r)] = first + lease_s
            previous_end = max(r.end if r.end is not None else r.start for r in batch)
    return out


def run_id(r: Run) -> tuple:
    return (r.deploy, r.job, r.pid, r.token, r.start)


class Faults:
    """The faults, indexed for "did anything hit this process (or the server) in [lo, hi]";
    the time by which each run's lease had run out (lease_out_bounds); and the claims (pid,
    claim token) in which a handler ran past the lease."""

    def __init__(self, faults: Iterable[Fault], runs: Iterable[Run] = (), lease_s: float = float("inf")):
        runs = list(runs)
        by_job: dict[JobKey, list[Run]] = collections.defaultdict(list)
        for r in runs:
            by_job[r.key].append(r)
        self.lease_out = lease_out_bounds(runs, lease_s)
        self.past_lease = {(r.pid, r.token) for same_job in by_job.values() for r in same_job
                           if r.token and outlasted_lease(r, same_job, self.lease_out[run_id(r)])}
        self.by_pid: dict[int, list[Fault]] = collections.defaultdict(list)
        self.server: list[Fault] = []
        faults = list(faults)
        # (pid, claim token) -> the claim's first start: it was claimed (and could be taken back)
        # from then on, whichever of its jobs started later
        self.claimed_at: dict[tuple[int, int], float] = {}
        for r in runs:
            if r.token:
                ident = (r.pid, r.token)
                self.claimed_at[ident] = min(self.claimed_at.get(ident, r.start), r.start)
        # pid -> when a peer's reaper took its claims back, and when it re-registered (its
        # liveness session reconnected): evidence of a fault, not one itself
        self.taken_by_peer: dict[int, list[float]] = collections.defaultdict(list)
        self.registered: dict[int, list[float]] = collections.defaultdict(list)
        for f in faults:
            if f.kind == "taken_back" and f.pid is not None and f.detail != str(f.pid):
                self.taken_by_peer[f.pid].append(f.start)
            elif f.kind == "re_registered" and f.pid is not None:
                self.registered[f.pid].append(f.start)
        self.all = sorted((f for f in faults if f.kind not in EVIDENCE), key=lambda f: f.start)
        for f in self.all:
            if f.kind in SERVER_CAUSES:
                self.server.append(f)
            elif f.pid is not None:
                self.by_pid[f.pid].append(f)
        self._starts = [f.start for f in self.all]

    def cause(self, pids: Iterable[int], lo: float, hi: float, earlier: Run | None = None,
              later: Run | None = None) -> str | None:
        """A fault on one of `pids` (or the server) in [lo, hi] that may excuse `later` running
        again after `earlier` (EXCUSE); without the runs, any fault that can excuse anything."""
        for pid in pids:
            for f in self.by_pid.get(pid, ()):
                if f.start <= hi and f.end >= lo and (excuses(f, earlier, later) or self._peer_took_back(f, earlier, later)):
                    return PROCESS_CAUSES.get(f.kind, f.kind)
        for f in self.server:
            if f.start <= hi and f.end >= lo and excuses(f, earlier, later):
                return SERVER_CAUSES[f.kind]
        return None

    def _peer_took_back(self, f: Fault, earlier: Run | None, later: Run | None) -> bool:
        """The hit process ran the job again after a peer's reaper took back the claim it had
        run it under. Only a KILL of its liveness session frees its lock (a peer then judges it
        dead, as documented), and only its claims from before it re-registered (its liveness
        session reconnected) were made under that free lock: those are the ones excused.
        Until it notices the KILL it cannot know (its session answered moments ago), so it
        starts the rest of such a claim's jobs even after the take-back; their acks are fenced
        out, and the jobs, back together and uncharged, are anyone's to claim (itself too, at
        the same attempt). So the take-back must come after the fault and after the earlier
        run's claim began (its first start), not after the run's own start; before the second
        run. A take-back before the claim began is no take-back of it. The log lines have
        milliseconds: LOG_SLACK_S either side."""
        if EXCUSE.get(f.kind) != "peer" or not f.detail.startswith("liveness") or earlier is None \
                or later is None or earlier.pid != f.pid or later.pid != f.pid:
            return False
        claimed = self.claimed_at.get((earlier.pid, earlier.token), earlier.start)
        back = next((t for t in sorted(self.registered.get(f.pid, ())) if t >= f.start), float("inf"))
        if claimed > back + LOG_SLACK_S:
            return False  # claimed under its new registration, which the fault did not free
        lo, hi = max(f.start, claimed) - LOG_SLACK_S, later.start + LOG_SLACK_S
        return any(lo <= t <= hi for t in self.taken_by_peer.get(f.pid, ()))

    def any_between(self, lo: float, hi: float) -> bool:
        """Any fault at all (any process, the server) overlapping [lo, hi]."""
        i = bisect.bisect_right(self._starts, hi)
        return any(f.end >= lo for f in self.all[:i])


# The episodes' restarts (busy_restart, busy_crash: also the grace_restart episode's) restart the
# one server every deployment shares: their narrow policy is for the episodes' own deployment
# (episodes.DEPLOY), whose jobs they aim at; to any other they are a server restart like any.
EPISODE_DEPLOY = "long"


def excuses(f: Fault, earlier: Run | None, later: Run | None) -> bool:
    policy = EXCUSE.get(f.kind, "any")
    if f.kind in SERVER_CAUSES and earlier is not None and earlier.deploy != EPISODE_DEPLOY:
        policy = "any"
    if policy == "never":
        return False
    if earlier is None or later is None or policy == "any":
        return True
    if policy == "peer":
        return later.pid != f.pid
    if policy == "interrupted":
        return earlier.end is None
    return earlier.end is not None and earlier.end <= f.start  # finished


def outlasted_lease(r: Run, same_job: list[Run], lease_out: float) -> bool:
    """The handler ran past the lease (which had run out by `lease_out`): it ended after it, or
    (no end recorded: its process died or stopped later) the job started again elsewhere after.
    Never a handler that kept its lease: extending it was its claim's (or its consumer's) job."""
    if r.keeps_lease:
        return False
    if r.end is not None:
        return r.end > lease_out
    return any(o.start > lease_out for o in same_job if o is not r)


def duplicate_cause(earlier: Run, later: Run, faults: Faults, lease_s: float) -> str | None:
    """Why `later` ran although `earlier` had not failed; None: no excuse the contract allows.

    The window reaches a lease back from the first start: a job is claimed before its handler
    starts, and a claim older than the lease is fair game for a reaper anyway. A handler that
    ran past the lease excuses its own second run, and that of the jobs of its claim that had
    finished before it with their ack still pending (acks go out about once a second, before a
    start): the reaper takes the claim back whole."""
    lo = min(earlier.start, later.start) - lease_s
    hi = max(earlier.start, later.start)
    cause = faults.cause({earlier.pid, later.pid}, lo, hi, earlier, later)
    if cause:
        return cause
    if earlier.keeps_lease:
        return None
    lease_out = faults.lease_out.get(run_id(earlier), earlier.start + lease_s)
    if earlier.end is None:
        # Still running when the later run started, after its lease ran out
        return "past_lease" if later.start > lease_out else None
    if earlier.end > lease_out:
        return "past_lease"
    if (earlier.pid, earlier.token) in faults.past_lease:
        return "past_lease_in_batch"
    return None


def check_duplicates(h: History, faults: Faults) -> tuple[list[Violation], dict[str, int], int]:
    out: list[Violation] = []
    causes: collections.Counter = collections.Counter()
    concurrent = 0
    for key, runs in h.runs_by_job().items():
        for i in range(1, len(runs)):
            later = runs[i]
            if runs[i - 1].outcome == "fail":
                continue  # a retry: the contract's normal path
            earlier_ok = [r for r in runs[:i] if r.outcome != "fail"]
            overlapping = any(r.pid != later.pid and (r.end is None or r.end > later.start) for r in earlier_ok)
            concurrent += overlapping
            cause = next((c for c in (duplicate_cause(r, later, faults, h.lease_s) for r in earlier_ok) if c),
                         None)
            if cause:
                causes[cause] += 1
                continue
            causes["unexplained"] += 1
            rule = "concurrent_run" if overlapping else "run_twice"
            first = earlier_ok[-1] if earlier_ok else runs[i - 1]
            out.append(Violation(rule, key, f"attempt {first.attempt} on pid {first.pid} at {first.start:.3f}, "
                                            f"attempt {later.attempt} on pid {later.pid} at {later.start:.3f}, "
                                            "no fault that excuses it on either process nor the server in between"
                                            + lease_takeback_note(h, key, first, later)))
    return out, dict(causes), concurrent


def attempts_ok(runs: list[Run], faults: Faults, lease_s: float, enqueued_at: float | None,
                final_attempts: int | None = None) -> str | None:
    """The README's attempt rule; None when `runs` (one job's starts, in order) keep it, else why not.

    `attempts` counts handler starts: the k-th start is attempt k. Its two exceptions, both caused
    by a consumer dying or stalling, are allowed only where the history shows such a cause:
    - taken back together: a start's claim was taken back with other jobs of its claim, so its
      attempt was undone, and the next start repeats the number. Allowed when a fault hit the
      run's process or the server, or the run outlasted its lease (duplicate_cause);
    - taken back alone before it started (or after it ended, before its ack): that claim's
      attempt stands although its handler did not start, and the number skips. Allowed when
      any fault happened since the previous start (or the enqueue): which claim died, and on
      which process, leaves no trace in the history.
    The interruption of a job by its consumer's shutdown (grace_expiry) repeats the number too:
    the fault excuses it here, and check_interrupted requires it. A number never goes down. A job that ended dead shows the attempt of its last start, one
    fewer (its last claim taken back together before it was given back cancelled), or more (a
    claim taken back alone after it).
    """
    previous: Run | None = None
    expected = 1
    for r in runs:
        since = previous.start if previous is not None else enqueued_at
        if r.attempt < expected - 1 or (r.attempt == expected - 1 and previous is None):
            return f"attempt {r.attempt} at the start at {r.start:.3f}, expected {expected}"
        if r.attempt == expected - 1 and not duplicate_cause(previous, r, faults, lease_s):
            return (f"attempt {r.attempt} repeated at {r.start:.3f} on pid {r.pid}, "
                    "but nothing took the earlier claim back")
        if r.attempt > expected and (since is None or not faults.any_between(since - lease_s, r.start)):
            return f"attempt {r.attempt} at the start at {r.start:.3f}, expected {expected}, and no fault before it"
        previous, expected = r, r.attempt + 1
    if final_attempts is not None and previous is not None and final_attempts != previous.attempt:
        after_last = faults.any_between(previous.start - lease_s, float("inf"))
        if not after_last or final_attempts < previous.attempt - 1:
            return f"dead with attempts {final_attempts}, last start was attempt {previous.attempt}"
    return None


def lease_takeback_note(h: History, key: JobKey, earlier: Run, later: Run) -> str:
    """What a reaper's take-back of an expired lease says of the job between two of its starts
    (History.lease_takebacks): none is a fault, but it names what took the job from the earlier
    run's claim (its acks came late, or its lease was not pushed out while the consumer lived)."""
    notes = []
    for t in getattr(h, "lease_takebacks", ()):  # (a history pickled before the field: none)
        if t.deploy == key[0] and key[1] in t.jobs and earlier.start - LOG_SLACK_S <= t.at <= later.start + LOG_SLACK_S:
            ended = f", {t.at - earlier.end:.2f}s after the earlier run ended" if earlier.end is not None else ""
            owner = f"pid {t.owner}'s" if t.owner is not None else "an unknown consumer's"
            notes.append(f"; taken back from {owner} claim by pid {t.reaper}'s reaper at {t.at:.3f}, its lease "
                         f"expired{ended}")
    return "".join(notes)


def check_attempts(h: History, faults: Faults) -> list[Violation]:
    enqueued = {}
    for e in h.enqueues:
        enqueued[e.key] = min(enqueued.get(e.key, e.acked_at), e.acked_at)
    dead = {(row.deploy, row.job): row.attempts for row in h.final_rows if row.status in (DEAD, CANCELLED)}
    out = []
    for key, runs in h.runs_by_job().items():
        why = attempts_ok(runs, faults, h.lease_s, enqueued.get(key), dead.get(key))
        if why:
            notes = "".join(lease_takeback_note(h, key, a, b) for a, b in zip(runs, runs[1:]))
            out.append(Violation("attempts", key, f"{why}; attempts at each start: {[r.attempt for r in runs]}"
                                                  + notes))
    return out


def check_interrupted(h: History, faults: Faults) -> list[Violation]:
    """Interrupted is not failed (issue 39 item 7, issue 40 item 10): a job still running when
    its consumer's shutdown grace expired (a grace_expiry fault on its process, its run with no
    end: its command was killed) is given back by that live process uncharged, so its next start
    repeats the attempt number. A higher one charged the deploy to the job. Not judged when
    another fault came between the stop and the next start (a settle that failed leaves the job
    to the reaper, which charges a job taken back alone: a crash is no interruption)."""
    stops = [f for f in faults.all if f.kind == "grace_expiry" and f.pid is not None]
    out = []
    for key, runs in h.runs_by_job().items():
        for earlier, later in zip(runs, runs[1:]):
            stop = next((f for f in stops if f.pid == earlier.pid and earlier.end is None
                         and earlier.start <= f.start <= later.start), None)
            if stop is None or later.attempt == earlier.attempt:
                continue
            others = [f for f in faults.all if f is not stop and f.start <= later.start
                      and f.end >= earlier.start - h.lease_s]
            if others:
                continue
            out.append(Violation("charged_interrupt", key,
                                 f"attempt {earlier.attempt} on pid {earlier.pid} at {earlier.start:.3f} was "
                                 f"interrupted by its shutdown at {stop.start:.3f}, but the next start at "
                                 f"{later.start:.3f} is attempt {later.attempt}: the interruption was charged"))
    return out


def check_after_cancel(h: History) -> list[Violation]:
    """A deleted (pending) job never starts again. A running one ('requested') may still be
    started by the claim that held it at the cancel (its handler sees cancel_requested()), but
    by no later claim: at most one claim token starts it after the cancel, and it is the token
    of a run that had started before, if any had."""
    cancels = {f.job: f for f in h.faults if f.kind == "cancel" and f.detail in ("deleted", "requested")}
    out = []
    for key, runs in h.runs_by_job().items():
        cancel = cancels.get(key)
        if cancel is None:
            continue
        after = [r for r in runs if r.start > cancel.end]
        before_tokens = {r.token for r in runs
                         if r.start <= cancel.end and (r.end is None or r.end >= cancel.start)}
        tokens_after = {r.token for r in after}
        allowed = before_tokens if before_tokens else set(list(tokens_after)[:1])
        if cancel.detail == "deleted":
            allowed = set()
        bad = [r for r in after if r.token not in allowed]
        if bad or len(tokens_after) > 1:
            r = (bad or after)[0]
            out.append(Violation("after_cancel", key, f"attempt {r.attempt} started at {r.start:.3f} on pid {r.pid}, "
                                                      f"cancelled ({cancel.detail}) at {cancel.end:.3f}"))
    return out


# Faults during which no reaper can take anything back (the server, or the writer node, is gone):
# the recovery bound of a consumer killed meanwhile is extended by the time they overlap.
OUTAGES = ("server_restart", "server_crash", "writer_kill", "node_pause", "busy_restart", "busy_crash",
           "server_frozen")


def check_stranded(h: History) -> list[Violation]:
    out = [Violation("left_claimed", (r.deploy, r.job), f"claimed by {r.owner} after the drain")
           for r in h.final_rows if r.status == CLAIMED]
    for consumer, seconds in sorted(h.recovery_s.items()):
        # No reaper runs where no consumer does: a deployment's seconds without one (between two
        # cron-like runs) stretch the bound, as an outage's do
        bound = h.recovery_bound_s + h.recovery_unattended_s.get(consumer, 0.0)
        if seconds is not None:
            bound += _outage_overlap(h, consumer, seconds)
        if seconds is None or seconds > bound:
            shown = "came back never (until the drain)" if seconds is None else f"were still claimed {seconds:.1f}s after it"
            out.append(Violation("stranded", None, f"jobs of gone consumer {consumer} {shown}, "
                                                   f"bound {bound:g}s"))
    return out


def _outage_overlap(h: History, consumer: str, seconds: float) -> float:
    """Seconds of outage (OUTAGES) between the consumer's kill and its jobs' return."""
    pid = int(consumer.rsplit(" pid ", 1)[1]) if " pid " in consumer else None
    killed = next((f.start for f in h.faults if f.kind == "sigkill" and f.pid == pid), None)
    if killed is None:
        return 0.0
    back = killed + seconds
    return sum(max(0.0, min(back, f.end) - max(killed, f.start)) for f in h.faults if f.kind in OUTAGES)


# ------------------------------------------------------------------ claim order


def _rank(r: Run) -> tuple:
    return (-r.priority, r.run_at, r.job)


def _batches(h: History) -> dict[tuple, list[Run]]:
    batches: dict[tuple, list[Run]] = collections.defaultdict(list)
    for r in sorted(h.runs, key=lambda r: r.start):
        if r.token:
            batches[(r.deploy, r.pid, r.token)].append(r)
    return batches


def check_batch_order(h: History) -> list[Violation]:
    """Within one claim, jobs run in claim order: priority, then run_at, then id."""
    out = []
    for (deploy, pid, token), runs in _batches(h).items():
        for a, b in zip(runs, runs[1:]):
            if _rank(b) < _rank(a):
                out.append(Violation("priority", b.key, f"ran after job {a.job} (priority {a.priority}) in the "
                                                        f"same batch of pid {pid}, with priority {b.priority}"))
                break
    return out


def _claims_by_job(h: History, batches: dict[tuple, list[Run]]) -> dict[JobKey, list[tuple]]:
    """Each job's claims in time order, as (its run, or a stand-in for a claim it never started
    under; the claim's batch key; when the job was claimable again after it, or None).

    A job handed back unstarted (HandBack) was claimed by a batch that started other jobs: it
    was held from before that batch's first start until the hand-back, a claim no start line
    shows. The stand-in carries the job's priority and run_at from any run of it, and the
    hand-back's time as its start (the latest its hold can have ended). A run without a batch
    (no token) has None for it: it is never judged, but what comes after it is."""
    batch_of = {id(r): bkey for bkey, runs in batches.items() for r in runs}
    by_job = h.runs_by_job()
    claims: dict[JobKey, list[tuple]] = collections.defaultdict(list)
    for key, runs in by_job.items():
        for r in runs:
            released = r.end if r.outcome == "fail" else None
            claims[key].append((r.start, r, batch_of.get(id(r)), released))
    by_token = {(bkey[0], bkey[2]): bkey for bkey in batches}
    for hb in h.hand_backs:
        bkey = by_token.get((hb.deploy, hb.token))
        # Ordered by its batch's first start: its claim came before it, and a run after the
        # hand-back starts after it (the hand-back's logged time may come a little late). A batch
        # that started nothing: by the hand-back, and never judged (its claim time is unknown).
        order = batches[bkey][0].start if bkey is not None else hb.at
        for job in hb.jobs:
            seen = by_job.get((hb.deploy, job))
            if not seen:
                continue  # never ran: never judged, nor anything after it
            like = seen[0]
            stand_in = dataclasses.replace(like, attempt=0, pid=bkey[1] if bkey else hb.pid, token=hb.token,
                                           start=hb.at, wall_start=hb.at + (like.wall_start - like.start),
                                           end=None, outcome=None)
            claims[(hb.deploy, job)].append((order, stand_in, bkey, hb.at))
    return {key: [c[1:] for c in sorted(items, key=lambda c: c[0])] for key, items in claims.items()}


def check_claim_priority(h: History, faults: Faults) -> tuple[list[Violation], int]:
    """No claim takes a lower-priority job while a higher one is claimable and left waiting.

    Claim times are not recorded, so they are bounded: a worker (one per process) claims its
    next batch after the previous batch's last handler returned and before its first handler
    starts. A batch k is an inversion when a job H of higher priority than k's lowest was
    claimable (acknowledged and due, failed and due again, or handed back unstarted) before k's
    claim could start, and H's own claim (one that handed it back too) cannot have started
    before k's first handler. Any fault between the two
    claims excuses it (H may have been locked by a claim that then died)."""
    enq_at: dict[JobKey, float] = {}
    for e in h.enqueues:
        enq_at[e.key] = min(enq_at.get(e.key, e.acked_at), e.acked_at)
    batches = _batches(h)
    lower: dict[tuple, float] = {}
    per_pid: dict[tuple, list[tuple]] = collections.defaultdict(list)
    for bkey, runs in batches.items():
        per_pid[bkey[:2]].append(bkey)
    for keys in per_pid.values():
        keys.sort(key=lambda k: batches[k][0].start)
        for prev, cur in zip(keys, keys[1:]):
            ends = [r.end for r in batches[prev]]
            if all(e is not None for e in ends):
                lower[cur] = max(ends)
    # Claimable jobs H: (deploy, priority) -> sorted [(claimable_since, lower bound of H's claim, H)]
    waiting: dict[tuple, list[tuple]] = collections.defaultdict(list)
    held = _held(h)
    for key, claims in _claims_by_job(h, batches).items():
        for i, (r, bkey, released) in enumerate(claims):
            prev = claims[i - 1] if i else None
            if prev is None and key in enq_at:
                since = enq_at[key]
            elif prev is not None and prev[2] is not None:
                since = prev[2]  # failed, or handed back unstarted: claimable again from then
            else:
                continue
            if r.flow_key and h.key_limits.get(r.deploy):
                continue  # its key's limit may hold it back: a lower job of another key may go first
            for lock_start, lock_end in held.get(key, ()):
                if lock_start <= r.start and lock_end >= since:
                    since = max(since, lock_end)  # its row was held: claimable once the lock went
            claim_lo = lower.get(bkey)
            if claim_lo is not None:
                waiting[(r.deploy, r.priority)].append((max(since, r.run_at_mono), claim_lo, r))
    index = {}
    for k, items in waiting.items():
        items.sort(key=lambda t: t[0])
        best, prefix = None, []
        for item in items:
            if best is None or item[1] > best[1]:
                best = item
            prefix.append(best)
        index[k] = ([t[0] for t in items], prefix)
    out, judged = [], 0
    for bkey, runs in batches.items():
        lo = lower.get(bkey)
        if lo is None:
            continue
        judged += 1
        first = runs[0].start
        lowest = min(runs, key=lambda r: r.priority)
        for (deploy, priority), (since, prefix) in index.items():
            if deploy != bkey[0] or priority <= lowest.priority:
                continue
            n = bisect.bisect_left(since, lo - CLOCK_SLACK_S)
            if not n:
                continue
            h_since, h_claim_lo, h_run = prefix[n - 1]
            if h_claim_lo <= first or faults.any_between(lo - h.lease_s, h_run.start):
                continue
            out.append(Violation("priority", h_run.key, f"priority {priority}, claimable since {h_since:.3f}, "
                                                        f"waited while pid {bkey[1]} claimed job {lowest.job} "
                                                        f"(priority {lowest.priority}) after {lo:.3f}"))
            break
    return out, judged


# ------------------------------------------------------------------ issue 26


def check_key_limit(h: History, faults: Faults) -> list[Violation]:
    """key_limit: never more runs of one key at once than its deployment's limit_per_key."""
    by_key: dict[tuple[str, str], list[Run]] = collections.defaultdict(list)
    for r in h.runs:
        if r.flow_key and h.key_limits.get(r.deploy):
            by_key[(r.deploy, r.flow_key)].append(r)
    out: list[Violation] = []
    settled = settled_by(h.runs)
    for (deploy, key), runs in by_key.items():
        limit = h.key_limits[deploy]
        events = []
        for r in runs:
            until = min(claim_held_until(r, faults), settled[id(r)])
            if r.commit_at is not None and r.outcome == "ok":
                # Completed by its own job.transaction() block: the slot went with that
                # COMMIT, before the end line (a peer's claim may start the next job between)
                until = min(until, r.commit_at)
            if until > r.start:  # a job started after its claim was gone holds no slot
                events += [(r.start, 1, r), (until, -1, r)]
        events.sort(key=lambda e: (e[0], e[1]))  # a run that ends at an instant frees it for one that starts
        holding: dict[int, Run] = {}
        for at, step, r in events:
            if step == -1:
                holding.pop(id(r), None)
                continue
            holding[id(r)] = r
            if len(holding) > limit:
                who = ", ".join(f"job {o.job} pid {o.pid} from {o.start:.3f}" for o in holding.values())
                out.append(Violation("key_limit", r.key, f"{len(holding)} runs of key {key!r} at once "
                                     f"(limit_per_key {limit}) at t={at:.3f}: {who}"))
    return out


def settled_by(runs: list[Run]) -> dict[int, float]:
    """For each run (by id()), a moment by which its claim was surely settled, whether or not
    its handler had returned: the next start of the same job (anywhere: it was retried, given
    back or taken back), or the first start of a later claim in its process (the fleet runs one
    worker per process, which claims again only once its batch is settled: acked, failed (a
    handler past its timeout_s fails and runs on in its thread), given back)."""
    out: dict[int, float] = {}
    by_job: dict[JobKey, list[Run]] = collections.defaultdict(list)
    by_pid: dict[int, list[Run]] = collections.defaultdict(list)
    for r in runs:
        by_job[r.key].append(r)
        by_pid[r.pid].append(r)
    for group in (*by_job.values(), *by_pid.values()):
        group.sort(key=lambda r: r.start)
    for r in runs:
        until = float("inf")
        same_job = by_job[r.key]
        later = [o.start for o in same_job if o.start > r.start]
        if later:
            until = later[0]
        mine = by_pid[r.pid]
        i = bisect.bisect_right([o.start for o in mine], r.start)
        for o in mine[i:]:
            if o.token != r.token:
                until = min(until, o.start)
                break
        out[id(r)] = until
    return out


def claim_held_until(r: Run, faults: Faults) -> float:
    """Until when a run surely held its claim: its end, or sooner the first fault that could
    have cost it the claim (on its process or the server, or a peer's take-back of its
    process's claims) since the claim began (its batch's first start: a job started after its
    claim was taken back holds nothing), or the end of its lease unless it kept it."""
    until = r.end if r.end is not None else float("inf")
    if not r.keeps_lease:
        until = min(until, faults.lease_out.get(run_id(r), until))
    claimed = faults.claimed_at.get((r.pid, r.token), r.start) if r.token else r.start
    for f in [*faults.by_pid.get(r.pid, ()), *(faults.by_pid.get(r.proc, ()) if r.proc else ()), *faults.server]:
        if f.kind != "sighup" and (claimed <= f.start < until or f.start <= claimed <= f.end):
            until = min(until, max(f.start, r.start))
    for t in faults.taken_by_peer.get(r.pid, ()):
        # The reaper logs its take-back after its COMMIT, when a peer may have claimed and started
        # the freed slot's next job already: the line can come late on a loaded machine.
        if claimed - TAKEBACK_LOG_SLACK_S <= t < until + TAKEBACK_LOG_SLACK_S:
            until = min(until, max(r.start, t - TAKEBACK_LOG_SLACK_S))
    return until


# A stall that lands between a worker's last check before a start and the handler's first line
# (the loop's few Python statements after the previous job ended) cannot be seen by the worker:
# on SIGCONT it starts the job it had checked. Such a start comes at the stall's end, from a stall
# that began just after the same claim's previous job ended (docs/delivery-contract.md).
MID_START_STALL_S = 0.25


def _stalled_between_check_and_start(h: History, r, ends: dict[tuple, list[float]]) -> bool:
    for f in h.faults:
        if f.kind != "stall" or f.pid != r.pid or not (f.end - MID_START_STALL_S <= r.start <= f.end + MID_START_STALL_S):
            continue
        if any(0.0 <= f.start - e <= MID_START_STALL_S for e in ends.get((r.deploy, r.pid, r.token), ())):
            return True
    return False


def check_stale_starts(h: History) -> list[Violation]:
    """A worker never starts a job it no longer owns (item 4): a start under claim (pid, token)
    after another claim had started the same job since this claim's first start. That other
    claim came while this one was live, so this one had been taken back before the start.
    Except a start the worker had checked before a stall froze it (MID_START_STALL_S)."""
    first: dict[tuple, float] = {}
    ends: dict[tuple, list[float]] = {}
    for r in h.runs:
        if r.token:
            ident = (r.deploy, r.pid, r.token)
            first[ident] = min(first.get(ident, r.start), r.start)
            if r.end is not None:
                ends.setdefault(ident, []).append(r.end)
    out = []
    for key, runs in h.runs_by_job().items():
        for i, r in enumerate(runs):
            if not r.token:
                continue
            mine = first[(r.deploy, r.pid, r.token)]
            other = next((o for o in runs[:i] if o.token and (o.pid, o.token) != (r.pid, r.token)
                          and o.start > mine), None)
            if other is not None and not _stalled_between_check_and_start(h, r, ends):
                out.append(Violation("stale_start", key, f"pid {r.pid} started it at {r.start:.3f} under claim "
                                                         f"{r.token} (its first start {mine:.3f}), after pid "
                                                         f"{other.pid} had started it at {other.start:.3f} "
                                                         f"under claim {other.token}"))
                break
    return out


def check_orphans(h: History) -> list[Violation]:
    """A consumer's exit ends its handlers (item 9): no run ends after its consumer exited."""
    exited = {e.pid: e.at for e in h.exits}
    runs_of = h.runs_by_job()
    out = []
    for r in h.runs:
        gone = exited.get(r.pid)
        if gone is None or r.end is None or r.end <= gone + CLOCK_SLACK_S:
            continue
        peers = [o for o in runs_of[r.key] if o is not r and o.start < r.end and (o.end is None or o.end > gone)]
        overlap = f", overlapping pid {peers[0].pid}'s run from {peers[0].start:.3f}" if peers else ""
        out.append(Violation("orphaned_run", r.key, f"run {r.proc or r.pid} of consumer pid {r.pid} ended at "
                                                    f"{r.end:.3f}, {r.end - gone:.1f}s after the consumer "
                                                    f"exited{overlap}"))
    return out


def check_exits(h: History) -> list[Violation]:
    """No consumer dies of a job (item 10): every exit is the schedule's doing."""
    return [Violation("consumer_exit", None, f"pid {e.pid} exited {e.code} at {e.at:.3f}: {e.why}")
            for e in h.exits if not e.expected]


def check_strays(h: History) -> list[Violation]:
    """Only consumer processes start jobs (item 11): a forked child that starts one runs
    consumer code it must not."""
    if not h.consumer_pids:
        return []
    return [Violation("stray_process", r.key, f"started at {r.start:.3f} by pid {r.pid}, not a consumer "
                                              "process the harness started")
            for r in h.runs if r.pid not in h.consumer_pids]


def check_grace_restarts(h: History) -> list[Violation]:
    """grace_restart: what a consumer ran when it was stopped, the server restarting during its
    grace (a grace_restart record: pid, from the SIGTERM to its exit as the harness saw it,
    detail "shutdown_grace_s=N"); grace_outage the same, the server away across the grace's end
    (a grace_outage record; the rule of that name). Each run of that process under way at the
    SIGTERM either ended within the grace, and was acked (no later run of its job, nothing of it
    left in the table), or still ran at the grace's end, and was given back: run again to its
    end by another process, after the grace, at the same attempt (unless a server fault as the
    stop came may have lost the stop's mark). The process exits 0 within the grace and its GRACE_STOPS bound."""
    exits = {e.pid: e for e in h.exits}
    left = {(f.deploy, f.job): f for f in h.final_rows if f.status != DONE}
    runs_of = h.runs_by_job()
    out: list[Violation] = []
    for stop in (f for f in h.faults if f.kind in GRACE_STOPS and f.pid is not None):
        rule = stop.kind
        grace_s = float(stop.detail.split("shutdown_grace_s=", 1)[1].split()[0])
        grace_end = stop.start + grace_s
        gone = exits.get(stop.pid)
        exited_at = min(stop.end, gone.at) if gone is not None else None
        if gone is None or exited_at > grace_end + GRACE_STOPS[rule]:
            when = "never" if gone is None else f"{exited_at - stop.start:.1f} s after it"
            out.append(Violation(rule, None, f"pid {stop.pid}, stopped at {stop.start:.3f} with a {grace_s:g} s "
                                             f"grace, exited {when} (bound: {GRACE_STOPS[rule]:g} s past the grace)"))
        elif gone.code != 0:
            out.append(Violation(rule, None, f"pid {stop.pid}, stopped at {stop.start:.3f}, exited "
                                             f"{gone.code}, not 0 (a stop exits 0: docs/deploys.md)"))
        # A server fault as the stop came may have lost its mark (the registration's "stopping",
        # which a reaper's take-back needs to leave the job uncharged): a charge is then the
        # reaper's usual rule, no violation
        unmarked = any(f.kind in SERVER_CAUSES and f.detail != f"in the grace of pid {stop.pid}"
                       and stop.start - STOP_MARK_S <= f.start <= stop.start + STOP_MARK_S for f in h.faults)
        lead = FROZEN_LEAD_S if rule == "frozen_at_stop" else 0.0
        if rule == "frozen_at_stop":
            out += [Violation(rule, r.key, f"started at {r.start:.3f} on pid {r.pid}, after its SIGTERM "
                                           f"({stop.start:.3f}): a stopping consumer starts nothing")
                    for r in h.runs if r.pid == stop.pid and r.start > stop.start + CLOCK_SLACK_S]
        for r in (r for r in h.runs if r.pid == stop.pid and r.start <= stop.start
                  and (r.end is None or r.end > stop.start - lead)):
            if r.outcome == "fail":
                continue  # a failure is retried: the retry rules judge it
            later = [o for o in runs_of[r.key] if o.start > r.start]
            row = left.get(r.key)
            acked = r.outcome == "ok" and not later and row is None
            if r.end is not None and r.end <= grace_end - GRACE_ACK_SLACK_S:
                if not acked:
                    again = (f"ran again on pid {later[0].pid} at {later[0].start:.3f}" if later
                             else f"was left in the table with status {row.status}")
                    out.append(Violation(rule, r.key, f"ended at {r.end:.3f} on pid {r.pid}, within its "
                                                      f"grace (to {grace_end:.3f}), but {again}: not acked"))
                continue
            if acked:
                continue  # it ended at the grace's very end, and its ack made it
            done = [o for o in later if o.pid != r.pid and o.end is not None and o.outcome == "ok"]
            if not done:
                out.append(Violation(rule, r.key, f"still ran on pid {r.pid} at the end of its grace "
                                              f"({grace_end:.3f}), and no other process ran it to "
                                              "its end after"))
            elif later[0].start < grace_end - CLOCK_SLACK_S:
                out.append(Violation(rule, r.key, f"ran again on pid {later[0].pid} at "
                                              f"{later[0].start:.3f}, while pid {r.pid} ran it in its "
                                              f"grace (to {grace_end:.3f})"))
            elif later[0].attempt != r.attempt and not unmarked:
                out.append(Violation(rule, r.key, f"given back at the end of pid {r.pid}'s grace, but "
                                              f"its next start at {later[0].start:.3f} is attempt "
                                              f"{later[0].attempt}, not {r.attempt}: charged"))
    return out


def check_tagged_puts(h: History) -> list[Violation]:
    """A put() that returned stored its job, one that raised stored nothing (item 1): the tag of
    every put (payload "u") is on the start line of the job it stored."""
    refused = {(x.deploy, x.tag): x for x in h.refused}
    returned = {e.key: e.tag for e in h.enqueues if e.tag}
    out, seen = [], set()
    for r in h.runs:
        if not r.tag or r.key in seen:
            continue
        seen.add(r.key)
        if (r.deploy, r.tag) in refused:
            out.append(Violation("stored_after_raise", r.key, f"put {r.tag} raised "
                                                              f"{refused[(r.deploy, r.tag)].error} but its job ran"))
        elif r.key in returned and returned[r.key] != r.tag:
            out.append(Violation("wrong_id", r.key, f"put {returned[r.key]} returned this id; "
                                                    f"the job holds put {r.tag}'s payload"))
    return out


DEDUP_METHODS = ("dedup", "rr_dedup")  # puts with a dedup key: they may return another put's id


def check_shared_ids(h: History) -> list[Violation]:
    """An id that put() returned is its own job's: two acknowledged enqueues without a dedup key
    never got one id. One that did stored nothing of its own: its job is lost, and the lost rule
    cannot see it (the id has its runs, the other put's). Seen after a server crash: an
    enqueue whose COMMIT lost its reply asks whether its first id is stored
    (inserts.jobs_stored), and crash recovery may have given that id to another put since."""
    by_id: dict[JobKey, list] = collections.defaultdict(list)
    for e in h.enqueues:
        if e.method not in DEDUP_METHODS and not e.dedup:
            by_id[e.key].append(e)
    return [Violation("shared_id", key, "returned to " + " and to ".join(
                f"a {e.method} acknowledged at {e.acked_at:.3f}" for e in sorted(es, key=lambda e: e.acked_at)))
            for key, es in sorted(by_id.items()) if len(es) > 1]


def check_dedup(h: History) -> list[Violation]:
    """Never two pending jobs with one dedup key (item 12): a keyed put called while an earlier
    job with that key was acknowledged and had not started yet returns that job's id."""
    first_start = {key: runs[0].start for key, runs in h.runs_by_job().items()}
    keyed: dict[tuple, list] = collections.defaultdict(list)
    for e in h.enqueues:
        if e.dedup and e.called_at is not None:
            keyed[(e.deploy, e.dedup)].append(e)
    out = []
    for (deploy, key), puts in keyed.items():
        puts.sort(key=lambda e: e.acked_at)
        for i, later in enumerate(puts):
            holder = next((e for e in puts[:i] if e.job != later.job and e.acked_at < later.called_at
                           and first_start.get(e.key, float("inf")) > later.called_at), None)
            if holder is not None:
                out.append(Violation("dedup_twice", later.key, f"key {key}: put at {later.called_at:.3f} stored "
                                                               f"job {later.job} while job {holder.job} (acked "
                                                               f"{holder.acked_at:.3f}) was pending"))
    return out


# ------------------------------------------------------------------ all of it


def check_effects(h: History) -> list[Violation]:
    """Exactly one effect row per acked fx job; none for one that ended dead or was cancelled."""
    # A job's kind is its first enqueue's: a dedup put that found the key held returns the
    # holder's id, and that job runs the holder's payload, not the one this put carried
    first: dict[JobKey, str] = {}
    for e in h.enqueues:
        first.setdefault(e.key, e.kind)
    fx = {key for key, kind in first.items() if kind == "fx"}
    final = {(f.deploy, f.job): f for f in h.final_rows}
    cancelled = {f.job for f in h.faults if f.kind == "cancel" and f.detail == "deleted"}
    out = []
    for key in sorted(fx | {k for k, n in h.effects.items() if n > 1}):
        n, row = h.effects.get(key, 0), final.get(key)
        if n > 1:
            out.append(Violation("double_effect", key, f"{n} effect rows: the completion committed {n} times"))
        elif row is not None and row.status == DEAD and n:
            out.append(Violation("effect_of_dead", key, f"dead ({row.last_error}) with its effect stored"))
        elif row is None and key in cancelled and n:
            out.append(Violation("effect_of_cancelled", key, "deleted by a cancel with its effect stored"))
        elif row is not None and row.status == CANCELLED and n:
            out.append(Violation("effect_of_cancelled", key, f"cancelled ({row.last_error}) with its effect stored"))
        elif ((row is None and key not in cancelled) or (row is not None and row.status == DONE)) and n != 1:
            out.append(Violation("missing_effect", key, "acked without its effect row"))
    return out


def check_self_reaps(h: History) -> list[Violation]:
    """Issue 26 item 3: a process's reaper never takes back its own process's claims (its
    workers may be running them)."""
    return [Violation("self_reap", None, f"pid {f.pid}'s own reaper took its claims back at {f.start:.3f}")
            for f in h.faults if f.kind == "taken_back" and f.detail == str(f.pid)]


def check_rates(h: History, faults: Faults) -> list[Violation]:
    """rate: at most N starts in any window of the period, each start at its claim's time.

    That time is the rate log's own for the claim (Run.spent_at: the server's clock, read by
    the handler from nq_rate under the claim's token), exact; where the handler could not read
    it (its connection was killed, or the slots were spent again a period later), the claim's
    first start line, which comes after the spend (its mark, COMMIT and the worker's hand-off:
    up to RATE_SLACK_S on a loaded machine). Both are epoch seconds on the machine's one clock
    (the wall clock, not the monotonic: the spends are compared with each other, and a handler
    preempted between its two clock reads would skew a conversion)."""
    out: list[Violation] = []
    first_wall: dict[tuple[int, int], float] = {}
    for r in h.runs:
        ident = (r.pid, r.token)
        first_wall[ident] = min(first_wall.get(ident, r.wall_start), r.wall_start)
    for deploy, limits in h.rates.items():
        runs = [r for r in h.runs if r.deploy == deploy]
        for count, period_s, per_key in limits:
            budgets: dict[str, list[tuple[float, float, Run]]] = collections.defaultdict(list)
            for r in runs:
                budget = h.job_keys.get(r.key) if per_key else ""
                if budget is None:  # a job without a key spends no key's budget
                    continue
                if r.spent_at:
                    budgets[budget].append((r.spent_at, RATE_EXACT_SLACK_S, r))
                else:
                    budgets[budget].append((first_wall.get((r.pid, r.token), r.wall_start), RATE_SLACK_S, r))
            for budget, starts in sorted(budgets.items()):
                starts.sort(key=lambda s: s[0])
                for (t0, late0, first), (t1, _, last) in zip(starts, starts[count:]):
                    # only the first's time can make the window look shorter than it was: it
                    # is the spend's, or later by at most its slack
                    if t1 - t0 >= period_s - late0:
                        continue
                    lo, hi = t0 - (first.wall_start - first.start), t1 - (last.wall_start - last.start)
                    if faults.cause({first.pid, last.pid}, lo - period_s, hi) is not None:
                        continue
                    whose = f"of key {budget!r}" if per_key else "of the queue"
                    exact = "spent" if first.spent_at and last.spent_at else "claimed (first start line)"
                    out.append(Violation("rate", last.key, f"{count + 1} starts {whose} {exact} within {t1 - t0:.3f} s, "
                                                           f"above {count} per {period_s:g} s"))
    return out


def locked_pickups(h: History) -> list[tuple]:
    """Each row lock judged (the job still ready when it went, not cancelled, started after it):
    (the lock, the job's first start after it, when that start's claim began to run (its
    batch's first start), the job's runs before the lock)."""
    by_job = h.runs_by_job()
    batch_first: dict[tuple, float] = {}
    for r in h.runs:
        if r.token:
            ident = (r.deploy, r.pid, r.token)
            batch_first[ident] = min(batch_first.get(ident, r.start), r.start)
    cancelled = {f.job for f in h.faults if f.kind == "cancel"}
    out = []
    for lock in h.row_locks:
        if lock.status != READY or lock.key in cancelled:
            continue  # a server fault ended the lock at a moment not known, or the operator took the job
        runs = by_job.get(lock.key, [])
        after = [r for r in runs if r.start >= lock.start]
        if not after:
            continue  # never run again: the lost rule's
        first = after[0]
        picked = batch_first.get((first.deploy, first.pid, first.token), first.start) if first.token else first.start
        if any(again.key == lock.key and lock.end <= again.start < picked for again in h.row_locks):
            continue  # the next lock took the same job before a claim did: that lock is judged
        out.append((lock, first, picked, [r for r in runs if r.start < lock.start]))
    return out


def check_locked_pickup(h: History) -> list[Violation]:
    """locked_pickup: a job whose row an application held is claimed soon after the lock went,
    unless a backlog ahead of it in claim order kept the fleet busy meanwhile (claims take the
    queue in order: its turn comes when theirs is done). Late is a violation when the fleet sat
    idle longer than the bound while it waited (the lost pick-up: nothing woke a consumer for
    it), or when a claim that began past the bound took a job ranked after it (passed over).
    A key_lock's outcome waiting on its key row is no idleness (_longest_idle)."""
    if not h.row_locks:
        return []
    faults = [f for f in h.faults if f.kind not in EVIDENCE and f.kind not in ("kill_query", "sighup")]
    batches = _batches(h)
    out: list[Violation] = []
    for lock, first, picked, before in locked_pickups(h):
        poll_max_s = h.poll_max_s.get(lock.deploy, WakeupConfig().poll_max_s)
        bound = poll_max_s + LOCKED_PICKUP_SLACK_S
        if picked - lock.end <= bound:
            continue
        expected_attempt = before[-1].attempt + 1 if before else 1
        excused = (
            any(f.kind in SERVER_CAUSES and f.start <= first.start and f.end >= lock.start for f in faults)
            or any(f.pid == first.pid and f.start <= first.start and f.end >= lock.end - h.lease_s for f in faults)
            or any(f.kind == "stall" and f.start <= lock.end + poll_max_s and f.end >= lock.end for f in faults)
            or first.attempt > expected_attempt  # a claim of it charged, never started: lost to a fault
            # a reaper took a claim back meanwhile (several jobs of a claim come back uncharged:
            # the job may have been in a gone consumer's claim)
            or any(f.kind == "taken_back" and lock.end <= f.start <= first.start for f in h.faults)
            or any(hb.deploy == lock.deploy and lock.job in hb.jobs and lock.end <= hb.at <= first.start
                   for hb in h.hand_backs))
        if excused:
            continue
        idle = _longest_idle(h, lock.deploy, lock.end, picked)
        rank = _rank(first)
        passed = next((runs for (deploy, pid, token), runs in batches.items()
                       if deploy == lock.deploy and (pid, token) != (first.pid, first.token)
                       and lock.end + bound < runs[0].start < picked - LOCKED_PICKUP_SLACK_S
                       and any(_rank(r) > rank for r in runs)), None)
        if idle <= bound and passed is None:
            continue  # the fleet worked through jobs ahead of it in claim order
        why = (f"the fleet idle {idle:.1f} s meanwhile" if idle > bound else
               f"passed over by pid {passed[0].pid}'s claim started t={passed[0].start:.3f}")
        out.append(Violation("locked_pickup", lock.key,
                             f"claimed {picked - lock.end:.1f} s after the lock on its row (held t={lock.start:.3f}"
                             f"-{lock.end:.3f}) went, past poll_max_s {poll_max_s:g} + {LOCKED_PICKUP_SLACK_S:g} s, "
                             f"{why}; first start by pid {first.pid} at t={first.start:.3f}"))
    return out


def _longest_idle(h: History, deploy: str, lo: float, hi: float) -> float:
    """The longest span within [lo, hi] in which no handler of the deployment ran (a run without
    an end counts its start only) and no session of it waited for a key row an outside session
    held (the key_lock class: an outcome waiting on a key row is a worker at work, maybe the
    one watcher, its claim behind that outcome; only the spans the holder saw a waiter count)."""
    spans = [(r.start, r.end if r.end is not None else r.start) for r in h.runs
             if r.deploy == deploy and r.start <= hi and (r.end if r.end is not None else r.start) >= lo]
    spans += [(a, b) for lock in h.key_locks if lock.deploy == deploy for a, b in lock.waits if a <= hi and b >= lo]
    spans.sort()
    longest, free_from = 0.0, lo
    for start, end in spans:
        if start > free_from:
            longest = max(longest, min(start, hi) - free_from)
        free_from = max(free_from, end)
    return max(longest, hi - free_from)


def _held(h: History) -> dict[JobKey, list[tuple[float, float]]]:
    """Each row-locked job's held spans (start, end)."""
    held: dict[JobKey, list[tuple[float, float]]] = collections.defaultdict(list)
    for lock in h.row_locks:
        held[lock.key].append((lock.start, lock.end))
    return held


def check_bystander(h: History) -> list[Violation]:
    """bystander_killed: a bystander session that died while the server stayed up."""
    server = [f for f in h.faults if f.kind in SERVER_CAUSES]
    return [Violation("bystander_killed", None,
                      f"the bystander's session {loss.conn_id} (opened t={loss.opened_at:.3f}) died between "
                      f"t={loss.last_ok:.3f} and t={loss.seen_at:.3f} with the server up: {loss.error}")
            for loss in h.bystander_losses
            if not any(f.start <= loss.seen_at and f.end >= loss.last_ok for f in server)]


def check_progress(h: History) -> list[Violation]:
    """no_progress: a sweep over the ready jobs' spans (put() returned to first start) and the
    runs' (start to end; a run without an end counts only its start: its process died or stopped,
    a fault): a span with a job ready, no handler running and none starting, longer than
    STALL_BOUND_S and with no excusing fault near, is a stall."""
    first: dict[JobKey, float] = {}
    for r in h.runs:
        first[r.key] = min(first.get(r.key, r.start), r.start)
    cancelled = {f.job for f in h.faults if f.kind == "cancel"}
    held = _held(h)
    events: list[tuple[float, int, int]] = []  # (time, ready change, running change)
    for e in h.enqueues:
        if e.delay_s == 0 and e.key in first and e.key not in cancelled and first[e.key] > e.acked_at:
            events += [(e.acked_at, 1, 0), (first[e.key], -1, 0)]
            for start, end in held.get(e.key, ()):
                if e.acked_at < start and end < first[e.key]:  # its row held: no claim could take it
                    events += [(start, -1, 0), (end, 1, 0)]
    for r in h.runs:
        events.append((r.start, 0, 1))
        events.append((r.end if r.end is not None else r.start, 0, -1))
    excusing = Faults(f for f in h.faults if f.kind not in ("kill_query", "sighup"))  # neither may stall a fleet
    out: list[Violation] = []
    ready = running = 0
    since: float | None = None
    most = 0  # the most jobs ready at once in the span
    for at, d_ready, d_running in sorted(events, key=lambda e: (e[0], -e[2])):  # a start before an end
        ready, running = ready + d_ready, running + d_running
        if ready > 0 and running == 0:
            since, most = (at, ready) if since is None else (since, max(most, ready))
            continue
        if since is not None and at - since > STALL_BOUND_S \
                and not excusing.any_between(since - h.lease_s - STALL_BOUND_S, at):
            out.append(Violation("no_progress", None, f"{at - since:.1f} s from t={since:.1f} with up to {most} "
                                 "job(s) ready and no handler running or starting, no fault near"))
        since = None
    return out


def check_signal_gap(h: History) -> list[Violation]:
    """signal_gap: each hold's put on a new queue back without an error within GAP_PUT_BOUND_S of
    the hold's end, its consumer on a new queue gone by itself (status 0) within
    GAP_CONSUMER_BOUND_S of its start, unless a fault explains it (the module's docstring)."""
    server = [f for f in h.faults if f.kind in SERVER_CAUSES]
    producer = server + [f for f in h.faults if f.kind == "kill_connection" and f.pid not in h.consumer_pids]
    exits = {e.pid: e for e in h.exits}
    out: list[Violation] = []
    for hold in h.signal_gaps:
        for put in hold.puts:
            if any(f.start <= put.end and f.end >= put.start for f in producer):
                continue
            if put.error:
                out.append(Violation("signal_gap", None, f"a put on new queue {put.queue} during the gap lock of "
                                     f"t={hold.start:.3f}-{hold.end:.3f} raised {put.error}"))
            elif put.end > hold.end + GAP_PUT_BOUND_S:
                out.append(Violation("signal_gap", None, f"a put on new queue {put.queue} returned "
                                     f"{put.end - hold.end:.2f} s after the gap lock of t={hold.start:.3f}-"
                                     f"{hold.end:.3f} went (bound {GAP_PUT_BOUND_S:g} s)"))
        if hold.consumer is None:
            continue
        gone = exits.get(hold.consumer)
        if gone is None or gone.code != 0 or gone.why != "exit when empty":
            how = "never exited" if gone is None else f"exited {gone.code} ({gone.why})"
            out.append(Violation("signal_gap", None, f"the consume --exit-when-empty (pid {hold.consumer}) on a new "
                                 f"queue during the gap lock of t={hold.start:.3f}-{hold.end:.3f} {how}"))
        elif gone.at > hold.start + GAP_CONSUMER_BOUND_S and not any(
                f.start <= gone.at and f.end >= hold.start and (f.pid == hold.consumer or f.kind in SERVER_CAUSES)
                for f in h.faults):
            out.append(Violation("signal_gap", None, f"the consume --exit-when-empty (pid {hold.consumer}) on a new "
                                 f"queue during the gap lock of t={hold.start:.3f}-{hold.end:.3f} exited "
                                 f"{gone.at - hold.start:.1f} s after it began (bound {GAP_CONSUMER_BOUND_S:g} s)"))
    return out


def check(h: History) -> Report:
    """Every rule; the lease-bound ones on each deployment with its own lease (lease_of)."""
    deploys = sorted({r.deploy for r in h.runs} | {e.deploy for e in h.enqueues} | {f.deploy for f in h.final_rows}
                     | {k.split("/", 1)[0] for k in h.recovery_s})
    parts = [_check_deploy(_only(h, d)) for d in deploys] or [_check_deploy(h)]
    violations = [v for p in parts for v in p.violations]
    violations += check_stale_starts(h) + check_orphans(h) + check_exits(h) + check_strays(h)
    violations += check_tagged_puts(h) + check_shared_ids(h) + check_dedup(h) + check_effects(h)
    violations += check_self_reaps(h)
    violations += check_grace_restarts(h)
    violations += [Violation("invalid_result", key, "a kept result is not valid JSON") for key in h.invalid_results]
    violations += check_progress(_only(h, STALL_DEPLOY)) + check_bystander(h) + check_locked_pickup(h)
    violations += check_signal_gap(h)
    duplicates: collections.Counter = collections.Counter()
    for p in parts:
        duplicates.update(p.duplicates)
    recoveries = [p.max_recovery_s for p in parts if p.max_recovery_s is not None]
    return Report(violations=violations, jobs=sum(p.jobs for p in parts), runs=sum(p.runs for p in parts),
                  lost=sum(p.lost for p in parts), innocent_dead=sum(p.innocent_dead for p in parts),
                  dead=sum(p.dead for p in parts), duplicates=dict(duplicates),
                  concurrent=sum(p.concurrent for p in parts),
                  priority_checked=sum(p.priority_checked for p in parts), max_recovery_s=max(recoveries, default=None),
                  effect_jobs=len({e.key for e in h.enqueues if e.kind == "fx"}), effect_rows=sum(h.effects.values()))


def _only(h: History, deploy: str) -> History:
    """One deployment's part of the history, with its lease; faults are everyone's."""
    return dataclasses.replace(
        h, runs=[r for r in h.runs if r.deploy == deploy], enqueues=[e for e in h.enqueues if e.deploy == deploy],
        final_rows=[f for f in h.final_rows if f.deploy == deploy], lease_s=h.lease_of(deploy),
        recovery_s={k: v for k, v in h.recovery_s.items() if k.startswith(f"{deploy}/")}, lease_by_deploy={})


def _check_deploy(h: History) -> Report:
    faults = Faults(h.faults, h.runs, h.lease_s)
    violations: list[Violation] = []
    violations += check_lost(h)
    violations += check_innocent_dead(h, faults)
    dup_violations, causes, concurrent = check_duplicates(h, faults)
    violations += dup_violations
    violations += check_attempts(h, faults)
    violations += check_interrupted(h, faults)
    violations += check_after_cancel(h)
    violations += check_stranded(h)
    violations += check_batch_order(h)
    violations += check_rates(h, faults)
    violations += check_key_limit(h, faults)
    prio_violations, judged = check_claim_priority(h, faults)
    violations += prio_violations
    lost = sum(1 for v in violations if v.rule == "lost")
    recoveries = [s for s in h.recovery_s.values() if s is not None]
    return Report(
        violations=violations,
        jobs=len({e.key for e in h.enqueues}),
        runs=len(h.runs),
        lost=lost,
        innocent_dead=sum(1 for v in violations if v.rule == "innocent_dead"),
        dead=sum(1 for r in h.final_rows if r.status == DEAD),
        duplicates=causes,
        concurrent=concurrent,
        priority_checked=judged,
        max_recovery_s=max(recoveries, default=None),
    )


# ------------------------------------------------------------------ workflows (issue 39)

@dataclasses.dataclass(frozen=True)
class WorkflowRun:
    """One run of a workflow's job, from the handler's lines: start, and its end if it wrote one
    (ok: the handler returned; its completion may still have been lost to a fault)."""
    job: int
    pid: int
    start: float
    end: float | None = None
    ok: bool = False


def check_workflow(runs: Iterable[WorkflowRun], edges: Iterable[tuple[int, int]], final: dict[int, int | None],
                   callbacks: dict[int, int], effects: dict[int, int]) -> list[Violation]:
    """The workflow rules:
    - early_start: a child starts only after every parent is done: an ok end of each parent
      came before the child's first start (a release that counted a parent twice, or one not
      done, starts it early);
    - waits_forever: once the run has drained, no child waits (status 6) whose parents all ended;
    - released_twice: a child is released once, and completes once: the effect its handler
      commits with its completion (job.transaction()) lands once;
    - callback_twice: a batch's callback commits its effect once (the effect rows of its job);
    - callback_missing: a batch whose members all ended done has its on_success effect.
    final: job -> its status at the end (None: gone, acked). callbacks: batch callback job ->
    its member count. effects: job -> effect rows its handler committed."""
    by_job: dict[int, list[WorkflowRun]] = collections.defaultdict(list)
    for r in runs:
        by_job[r.job].append(r)
    parents: dict[int, list[int]] = collections.defaultdict(list)
    for parent, child in edges:
        parents[child].append(parent)
    out: list[Violation] = []
    for child, ps in parents.items():
        starts = sorted(r.start for r in by_job.get(child, ()))
        if starts:
            for p in ps:
                done_at = [r.end for r in by_job.get(p, ()) if r.ok and r.end is not None]
                if not done_at or min(done_at) > starts[0]:
                    out.append(Violation("early_start", None, f"job {child} started at {starts[0]:.3f} before "
                                                               f"parent {p} was done"))
        ended = all(final.get(p) in (None, DONE, DEAD, CANCELLED) for p in ps)
        if final.get(child) == 6 and ended:
            out.append(Violation("waits_forever", None, f"job {child} still waits; its parents {ps} all ended"))
        if effects.get(child, 0) > 1:
            out.append(Violation("released_twice", None, f"job {child} committed its effect "
                                                         f"{effects[child]} times"))
    for job, members in callbacks.items():
        n = effects.get(job, 0)
        if n > 1:
            out.append(Violation("callback_twice", None, f"callback {job} of {members} members committed {n} times"))
        if n == 0 and final.get(job) in (None, DONE):
            out.append(Violation("callback_missing", None, f"callback {job} is done with no effect"))
    return out
