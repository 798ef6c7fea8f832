"""Runs a fault schedule (schedule.py) against real `notifyq consume` processes and a real
throwaway server, then drains, collects the history and hands it to the checker.

    result = FaultRun(make_plan(seed, classes, duration_s, jobs), workdir).run()
    assert result.report.ok, result.summary()

One run owns one private server (a copy of a template datadir starts in a fraction of a second)
and every process it starts; it kills only those, by pid, and removes its directory unless kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import os
import pickle
import random
import re
import shutil
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import MySQLdb
from conftest import TestDB, admin_connect, client_ports, create_test_db, ensure_runtime_user, sessions_of

from notifyq import config as config_mod
from notifyq import errors
from notifyq.produce.producer import Producer
from notifyq.run.localserver import LocalServer
from notifyq.store import admin_queries
from notifyq.store.locks import QueueLocks
from notifyq.store.db import Session

from . import checker
from . import episodes as ep
from . import kill_query
from . import rated
from .bystander import Bystander
from .fleet import KEY_LIMIT, Consumer, Fleet, write_config
from .history import Enqueue, Exit, Fault, FinalRow, HandBack, History, LeaseTakeBack, poison_exits, read_runs
from .monitor import ClaimMonitor, Root
from .producers import DedupCaller, SharedProducer
from .reload_drop import ReloadDrop
from .key_lock import KeyLocker
from .row_lock import RowLocker
from .signal_gap import GAP_QUEUES, GapHolder, consumer_queue
from .schedule import EPISODES, Plan, Step
from .workload import Workload

QUEUE = "fq"
BATCH_QUEUE = "fb"
SLOT_BATCH_SIZES = (10, 25, 50, 5)
# kill_session: which session of a consumer, drawn by the step's pick; the liveness session of a
# busy consumer twice as often (issue 26 item 3). "other": its watcher, heartbeat or reaper session.
SESSION_KINDS = ("liveness", "liveness", "work", "other")
EWE_EVERY_S = 4.0  # a cron-like `--exit-when-empty` run this often on the second deployment
EWE_BURST = 30
EFFECTS_TABLE = "nqf_effect"  # tests/helpers/nqfault.py writes it (the consumers' import path)
STRANDED_TRACE_LINES = 40  # a stranded verdict's log lines in the summary, at most


def _tail(path: Path, lines: int = 3, chars: int = 600) -> str:
    """The last lines of a log, short enough for a violation's detail."""
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"(unreadable: {e})"
    return " | ".join(text.strip().splitlines()[-lines:])[-chars:]


@dataclasses.dataclass
class RunResult:
    plan: Plan
    report: checker.Report
    history: History
    faults: Counter
    consumers_started: int
    exit_codes: dict
    unexpected_exits: list[str]
    producer_errors: int
    outcome_unknown: int
    drained: bool
    wall_s: float
    workdir: Path
    running_at_end: int = 0  # consumer slots whose process still ran when the fleet was stopped
    false_reclaims: list[str] = dataclasses.field(default_factory=list)
    episode_note: str = ""  # which episodes were played (and an error that stopped them)

    def summary(self) -> str:
        lines = [self.plan.describe(),
                 f"replay: {self.plan.replay_command()}",
                 f"{self.report.jobs} jobs, {self.report.runs} runs, "
                 f"{self.report.priority_checked} claims judged for priority, drained={self.drained}, "
                 f"violations by rule: {self.report.by_rule() or 'none'}"]
        if self.report.effect_jobs:
            lines.append(f"effects: {self.report.effect_rows} rows committed for {self.report.effect_jobs} fx jobs "
                         "through job.transaction()")
        shown = self.report.examples()
        lines += [f"  {v}" for v in shown]
        if len(self.report.violations) > len(shown):
            lines.append(f"  ... {len(self.report.violations) - len(shown)} more of the same rules")
        if self.episode_note:
            lines.append(self.episode_note)
        lines.append(f"logs: {self.workdir}")
        return "\n".join(lines)


class FaultRun:
    def __init__(self, plan: Plan, workdir: Path, template: Path | None = None, keep: bool | None = None,
                 drain_s: float = 60.0):
        """keep: True keeps the work directory (server datadir, logs, handler records), False
        removes it, None (the default) keeps it only when the run failed."""
        self.plan, self.workdir, self.template, self.keep = plan, Path(workdir), template, keep
        self.drain_s = drain_s
        self.out = self.workdir / "runs"
        self.logs = self.workdir / "logs"
        # A template datadir keeps the redo log size it was made with; a fresh one gets the
        # server's default (the 16 MB of test servers stalls commits under sustained load).
        self.server = LocalServer(self.workdir / "srv", redo_log_mb=16 if template else 96)
        self.fleet = Fleet(self.logs, self.out)
        self.faults: list[Fault] = []
        self.unexpected: list[str] = []
        self.rng = random.Random(plan.seed + 7)  # the second deployment's cron runs
        self.batch_enqueues = []
        self.stalls: list[tuple[float, Consumer, float]] = []  # (SIGCONT due, consumer, SIGSTOP time)
        self.rolling_restarts = 0  # not faults (nothing excuses a second run), but shown
        self.ewe_kill: dict[int, bool] = {}  # pid -> to be SIGKILLed once it has started jobs
        # issue 26
        self.server_lock = threading.Lock()  # the episodes thread restarts the server too
        self.exits: list[Exit] = []
        self.long_slots: list[Consumer] = []
        self.long_enqueues: list[Enqueue] = []
        self.long_producers: dict[str, Producer] = {}
        self.async_consumer: Consumer | None = None
        self.episodes: ep.Episodes | None = None
        self.shared: SharedProducer | None = None
        self.dedup: DedupCaller | None = None
        self.long_config_path: Path | None = None
        self.rated: rated.RatedProducer | None = None  # the rate class's producer
        self.bystander: Bystander | None = None  # the bystander class's application
        self.row_lockers: list[RowLocker] = []  # the row_lock class's locks, one thread each
        self.key_lockers: list[KeyLocker] = []  # the key_lock class's locks, one thread each
        self.gap_holders: list[GapHolder] = []  # the signal_gap class's holds, one thread each
        self.reload_drops: list[ReloadDrop] = []  # the reload_drop class's plays, one thread each

    # ------------------------------------------------------------ the run

    def run(self) -> RunResult:
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self._start_server()
        ok = False
        try:
            with _library_log_to(self.logs / "harness.log"):  # the producer's retries during restarts
                result = self._run(t0)
            ok = result.report.ok and result.drained and not result.false_reclaims
            return result
        finally:
            self.fleet.reap_all()
            keep = self.keep or (self.keep is None and not ok)  # a failure keeps its evidence
            self._stop_server(keep)
            if not keep:
                shutil.rmtree(self.workdir, ignore_errors=True)

    # The server(s): one private server here; a Galera cluster in tests/cluster/fault_run.py.

    def _start_server(self) -> None:
        if self.template is not None:
            shutil.copytree(self.template, self.server.datadir)
        self.server.start()

    def _stop_server(self, keep: bool) -> None:
        if keep:
            self.server.stop()
        else:
            self.server.cleanup()

    def _server_dsn(self) -> str:
        return self.server.dsn

    def _run(self, t0: float) -> RunResult:
        plan = self.plan
        ensure_runtime_user(config_mod.DSN.parse(self._server_dsn()))
        self.dbs: dict[str, TestDB] = {"main": create_test_db(self._server_dsn())}
        if "effects" in plan.classes:
            self._create_effects_table(self.dbs["main"])
        ewe = "exit_when_empty" in plan.classes
        if ewe:
            self.dbs["batch"] = create_test_db(self._server_dsn())
        if "rate" in plan.classes:
            self.dbs[rated.DEPLOY] = create_test_db(self._server_dsn())
        self.runtime_user = self.dbs["main"].dsn.user
        self.configs = {mode: write_config(self.workdir / f"{mode}.toml", plan.lease_s, mode == "polling",
                                           keep_results="effects" in plan.classes)
                        for mode in ("locks", "polling")}
        self.roots = {d: Root(db.admin) for d, db in self.dbs.items()}
        self.monitor = ClaimMonitor(self.roots, self.fleet)
        for slot in range(plan.consumers):
            self.fleet.slots.append(self._spawn_slot(slot))
        self._start_long_deployment()
        if "async_handler" in plan.classes:
            self.async_consumer = self.fleet.spawn(self.dbs["main"].env, "main", QUEUE, "locks", self.configs["locks"],
                                                   10, handler=("--handler", "nqfault:handle_async"))
        self.roots["main"].wait_for(lambda r: all(c.ready() for c in self.fleet.slots + self.long_slots), 60,
                                    "the consumers started")
        self._start_rated()
        if "bystander" in plan.classes:
            self.bystander = Bystander(self.dbs["main"].dsn)
            self.bystander.start()
        workload = self._workload(self._config("main"))
        batch_producer = Producer(BATCH_QUEUE, self._config("batch")) if ewe else None
        self._play(workload, batch_producer)
        workload.join(30)
        self._join_issue26_threads()
        self._join_lock_reload()
        if self.rated is not None:
            self.rated.join(30)
        if batch_producer is not None:
            batch_producer.close()
        drained = self._drain()
        if self.bystander is not None:  # through the drain: a consumer's rerun may come late
            self.bystander.stop.set()
            self.bystander.join(30)
        running_at_end = sum(c.alive() for c in self.fleet.slots)
        codes = self.fleet.stop_all(plan.lease_s * 3 + 15 if not self.long_slots else ep.LONG_LEASE_S + 15)
        self._note_exits()
        history = self._history(workload)
        # For a post-mortem: the checker runs again on it offline (pickle.load, checker.check)
        (self.logs / "history.pickle").write_bytes(pickle.dumps(history))
        report = checker.check(history)
        kinds = Counter(f.kind for f in self.faults if f.kind != "cancel" or f.detail != "none")
        if history.row_locks:
            kinds["row_lock"] = len(history.row_locks)
        if history.signal_gaps:
            kinds["signal_gap"] = len(history.signal_gaps)
        kinds.update(f.kind for f in history.faults if f.kind == "poison_exit")
        if self.rolling_restarts:
            kinds["rolling_restart"] = self.rolling_restarts
        note = ""
        if self.row_lockers:
            locks = [t.lock for t in self.row_lockers if t.lock is not None]
            delays = sorted(picked - lock.end for lock, _, picked, _ in checker.locked_pickups(history))
            note += (f"row_lock: {len(locks)} rows held of {len(self.row_lockers)} tries "
                     f"({sum(lk.status is None for lk in locks)} ended by a server fault); claimed after the "
                     f"lock went: {', '.join(f'{d:.2f}' for d in delays) or '-'} s\n")
        if self.key_lockers:
            held = [t.lock for t in self.key_lockers if t.lock is not None]
            waited = [b - a for lk in held for a, b in lk.waits]
            note += (f"key_lock: {len(held)} keys held of {len(self.key_lockers)} tries, "
                     f"{sum(bool(lk.waits) for lk in held)} waited for; waits of "
                     f"{min(waited, default=0):.2f}-{max(waited, default=0):.2f} s\n")
        if self.gap_holders:
            note += self._signal_gap_note(history)
        if self.reload_drops:
            note += (f"reload_drop: {len(self.reload_drops)} plays, reloads of the bad config refused "
                     f"{sum(p.refused for p in self.reload_drops)}, applied {sum(p.applied for p in self.reload_drops)}, "
                     f"burst jobs {sum(len(p.enqueues) for p in self.reload_drops)}\n")
        if self.bystander is not None:
            on_targets = [k for _, k in self.bystander.fills[1:]]
            note += (f"bystander: {len(self.bystander.fills)} fills, after each restart "
                     f"{on_targets or 'none'} sessions on ids of before it, {len(self.bystander.losses)} sessions lost\n")
        note += self._stranded_trace(report)
        if self.episodes is not None:
            note += f"episodes played: {' '.join(self.episodes.played) or 'none'}"
            note += f"; stopped by {self.episodes.error}" if self.episodes.error else ""
            note += f"; missed: {'; '.join(self.episodes.missed)}" if self.episodes.missed else ""
        return RunResult(plan, report, history, kinds, len(self.fleet.started), codes, self.unexpected,
                         workload.errors, workload.unknown, drained, time.monotonic() - t0, self.workdir,
                         running_at_end, self._false_reclaims(), note.strip())

    def _signal_gap_note(self, history: History) -> str:
        """How the gap locks went: held, really a gap lock, the puts' and consumers' times."""
        holds = history.signal_gaps
        puts = [(p, hold) for hold in holds for p in hold.puts]
        after = sorted(p.end - hold.end for p, hold in puts if not p.error)
        took = sorted(p.end - p.start for p, _ in puts if not p.error)
        exits = {e.pid: e for e in history.exits}
        lived = sorted(exits[hold.consumer].at - hold.start for hold in holds
                       if hold.consumer in exits and exits[hold.consumer].code == 0)
        return (f"signal_gap: {len(holds)} gaps held of {len(self.gap_holders)} tries, {sum(h.gap for h in holds)} "
                f"refused the probe's INSERT; puts on new queues {len(puts)} ({sum(bool(p.error) for p, _ in puts)} "
                f"errors), each {min(took, default=0):.2f}-{max(took, default=0):.2f} s, back "
                f"{min(after, default=0):+.2f} to {max(after, default=0):+.2f} s from the hold's end; consumers on "
                f"new queues exited 0 {len(lived)} of {sum(h.consumer is not None for h in holds)}, "
                f"{min(lived, default=0):.1f}-{max(lived, default=0):.1f} s after the hold began\n")

    def _stranded_trace(self, report: checker.Report) -> str:
        """For each consumer judged stranded: its own last log lines, and the fleet's lines that
        name it or tell of a reaper pass that could not run (a CI run's work directory is gone by
        the time anyone reads its failure)."""
        gone = {}  # consumer id prefix -> pid
        for v in report.violations:
            if v.rule == "stranded":
                words = v.detail.split()
                gone[words[4].split("/", 1)[1]] = int(words[6])
        if not gone:
            return ""
        told = ("reaper lock", "pass failed", "reaper pass")
        lines = []
        for consumer in self.fleet.started:
            try:
                text = consumer.err.read_text().splitlines()
            except FileNotFoundError:
                continue
            own = text[-5:] if consumer.pid in gone.values() else []
            lines += [f"pid {consumer.pid}: {line}" for line in text
                      if line in own or any(i in line for i in gone) or any(t in line for t in told)]
        lines.sort(key=lambda line: line.split("ts=", 1)[-1][:23])
        shown = lines[-STRANDED_TRACE_LINES:]
        wall = time.time() - time.monotonic()  # the logs' clock, from the harness's
        killed = [f"{prefix} at {dt.datetime.fromtimestamp(c.killed_at + wall, dt.timezone.utc):%H:%M:%S.%f}"[:-3]
                  for prefix, pid in sorted(gone.items()) if (c := self.fleet.by_pid(pid)) and c.killed_at]
        return (f"stranded trace (killed: {', '.join(killed) or '?'}; {len(shown)} of {len(lines)} lines of "
                "or naming them, or of a reaper pass that could not run):\n"
                + "".join(f"  {line[:300]}\n" for line in shown))

    def _create_effects_table(self, db: TestDB) -> None:
        """The application's table the `fx` jobs write to (tests/helpers/nqfault.py): no unique
        key, so a second commit of one job's effect would show as a second row."""
        conn = admin_connect(db.admin, db.admin.database)
        try:
            cur = conn.cursor()
            cur.execute(f"CREATE TABLE {EFFECTS_TABLE} (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
                        "job_id BIGINT UNSIGNED NOT NULL, attempt INT NOT NULL, pid INT NOT NULL, "
                        "token BIGINT UNSIGNED NOT NULL)")
            for host in ("%", "localhost"):
                cur.execute(f"GRANT SELECT, INSERT ON `{db.admin.database}`.`{EFFECTS_TABLE}` "
                            f"TO '{db.dsn.user}'@'{host}'")
        finally:
            conn.close()

    def _reaps(self) -> list[tuple[float, int, str, int | None]]:
        """Every "jobs returned" line of a reaper naming a consumer: (monotonic time, the reaper's
        pid, the consumer id, that consumer's pid if the monitor saw it registered)."""
        line = re.compile(r"ts=(\S+) .*(?:consumer died|heartbeat stopped), jobs returned consumer=([0-9a-f]+)")
        to_monotonic = time.monotonic() - time.time()
        out = []
        for consumer in self.fleet.started:
            for ts, cid in line.findall(consumer.err.read_text()):
                pid = next((p for (_, c), p in self.monitor.pid_of.items() if c == cid), None)
                out.append((_epoch(ts) + to_monotonic, consumer.pid, cid, pid))
        return out

    def _hand_backs(self) -> list[HandBack]:
        """Every give-back of unstarted claimed jobs a consumer logged (the lineup watch's, a
        worker's at its batch's end): claims that no start line shows."""
        line = re.compile(r"ts=(\S+) .*(?:handed back jobs waiting behind a long one|gave back unstarted jobs) "
                          r".*token=(\d+) ids=([\d,]+)")
        to_monotonic = time.monotonic() - time.time()
        return [HandBack(consumer.deploy, consumer.pid, int(token), tuple(int(i) for i in ids.split(",")),
                         _epoch(ts) + to_monotonic)
                for consumer in self.fleet.started for ts, token, ids in line.findall(consumer.err.read_text())]

    def _lease_takebacks(self) -> list[LeaseTakeBack]:
        """Every "leases expired, jobs returned" line of a reaper: the jobs it named, by owner (that
        consumer's pid where the monitor saw it registered), one record per owner."""
        line = re.compile(r"ts=(\S+) .*leases expired, jobs returned jobs=\d+ from=([0-9a-f:,;]+)")
        to_monotonic = time.monotonic() - time.time()
        out = []
        for consumer in self.fleet.started:
            for ts, taken in line.findall(consumer.err.read_text()):
                for part in taken.split(";"):
                    owner, _, ids = part.partition(":")
                    pid = next((p for (d, c), p in self.monitor.pid_of.items() if c == owner and d == consumer.deploy),
                               None)
                    out.append(LeaseTakeBack(consumer.deploy, consumer.pid, pid, tuple(int(i) for i in ids.split(",")),
                                             _epoch(ts) + to_monotonic))
        return out

    def _takebacks(self) -> list[Fault]:
        """The reapers' take-backs, for the checker: a peer's excuses a process's own second run
        after a fault of its session (EXCUSE "peer"); a process's own is the self_reap rule. With
        them, when each process re-registered after its liveness session reconnected: its claims
        from then on were made under a lock the fault did not free."""
        line = re.compile(r"ts=(\S+) .*liveness session reconnected: liveness lock")
        to_monotonic = time.monotonic() - time.time()
        registered = [Fault("re_registered", _epoch(ts) + to_monotonic, _epoch(ts) + to_monotonic, consumer.pid)
                      for consumer in self.fleet.started for ts in line.findall(consumer.err.read_text())]
        return registered + [Fault("taken_back", at, at, pid, detail=str(reaper))
                             for at, reaper, _, pid in self._reaps() if pid is not None]

    def _false_reclaims(self) -> list[str]:
        """Live consumers a reaper judged dead: a consumer that logged it was judged stale, or a
        reaped registration whose process was never killed nor stopped by the schedule."""
        out = [f"pid {c.pid} says its heartbeat was judged stale" for c in self.fleet.started
               if "heartbeat was judged stale" in c.err.read_text()]
        for _, reaper, cid, pid in self._reaps():
            victim = self.fleet.by_pid(pid) if pid is not None else None
            if victim is not None and victim.killed_at is None and not victim.stopped and not any(
                    f.pid == pid for f in self.faults if f.kind == "stall"):
                out.append(f"consumer {cid[:8]} (pid {pid}, never killed) reaped, seen by pid {reaper}")
        return out

    def _play(self, workload: Workload, batch_producer: Producer | None) -> None:
        """The schedule: its faults at their offsets, the second deployment's cron runs, and a
        look at the fleet twice a second, until the time is up and the producers are done."""
        plan = self.plan
        started = time.monotonic()
        workload.start()
        self._start_issue26_threads()
        steps = list(plan.steps)
        next_tick = next_ewe = started
        while True:
            now = time.monotonic()
            elapsed = now - started
            if elapsed >= plan.duration_s and not workload.is_alive() and not self._episodes_running():
                return
            if elapsed >= plan.duration_s + 60:
                workload.stop.set()  # the server restarts slowed it down: stop where it is
                if self.episodes is not None:
                    self.episodes.stop.set()
            while steps and steps[0].at_s <= elapsed:
                self._inject(steps.pop(0), workload)
            self._resume_due_stalls(now)
            if batch_producer is not None and elapsed < plan.duration_s and now >= next_ewe:
                next_ewe = now + EWE_EVERY_S
                self._cron_run(batch_producer)
            self._kill_ewe_mid_batch()
            if now >= next_tick:
                next_tick = now + 0.5
                self._note_exits()
                self._respawn_exited()
                self.monitor.tick()
                self._tick()
            time.sleep(0.05)  # the driver's pace, not a synchronisation

    def _workload(self, config: config_mod.Config) -> Workload:
        plan = self.plan
        return Workload("main", config, QUEUE, plan.seed, plan.classes, plan.jobs, plan.duration_s, plan.lease_s)

    def _tick(self) -> None:
        """Twice a second while the schedule runs: the cluster harness follows its nodes here."""

    def _config(self, deploy: str) -> config_mod.Config:
        env = {k: v for k, v in self.dbs[deploy].env.items() if k.startswith("NOTIFYQ_")}
        path = self.long_config_path if deploy == ep.DEPLOY else self.configs["locks"]
        return config_mod.load(env={**env, "NOTIFYQ_CONFIG": str(path)})

    def _spawn_slot(self, slot: int) -> Consumer:
        mode = "polling" if "polling" in self.plan.classes and slot % 2 == 1 else "locks"
        config = self.configs[mode]
        if "reload_drop" in self.plan.classes:
            # A file of its own, fresh: the class rewrites a victim's file, and a successor
            # started meanwhile in the slot must not start from the bad one
            config = write_config(self.workdir / f"slot{slot}-{len(self.fleet.started)}.toml", self.plan.lease_s,
                                  mode == "polling", keep_results="effects" in self.plan.classes)
        return self.fleet.spawn(self.dbs["main"].env, "main", QUEUE, mode, config,
                                SLOT_BATCH_SIZES[slot % len(SLOT_BATCH_SIZES)], slot)

    # ------------------------------------------------------------ faults

    def _inject(self, step: Step, workload: Workload) -> None:
        slots = self.fleet.slots
        victim = slots[int(step.pick * len(slots))]
        if step.kind == "sigkill":
            at = self.fleet.kill(victim)
            self.faults.append(Fault("sigkill", at, at, victim.pid))
            slots[victim.slot] = self._spawn_slot(victim.slot)
        elif step.kind == "stall":
            if victim.stopped or not victim.alive():
                return
            self.fleet.signal(victim, signal.SIGSTOP)
            now = time.monotonic()
            self.stalls.append((now + step.length_s, victim, now))
        elif step.kind == "kill_connection":
            self._kill_connection(step.pick)
        elif step.kind == "kill_session":
            self._kill_session(step.pick)
        elif step.kind == "kill_query":
            self._kill_query(step.pick)
        elif step.kind == "row_lock":
            locker = RowLocker(self.dbs["main"].admin, "main", QUEUE, step.pick, step.length_s)
            self.row_lockers.append(locker)
            locker.start()
        elif step.kind == "key_lock":
            key_locker = KeyLocker(self.dbs["main"].admin, "main", QUEUE, step.pick, step.length_s)
            self.key_lockers.append(key_locker)
            key_locker.start()
        elif step.kind == "signal_gap":
            n = len(self.gap_holders) + 1
            holder = GapHolder(self.dbs["main"].admin, "main", self._config("main"), n, step.pick, step.length_s)
            # Its process starts (the interpreter, a second or more) while the holder takes its
            # lock (a round trip or two): it registers under the hold
            holder.consumer = self.fleet.spawn(self.dbs["main"].env, "main", consumer_queue(n), "locks",
                                               self.configs["locks"], 10, -1, "--exit-when-empty").pid
            self.gap_holders.append(holder)
            holder.start()
        elif step.kind == "reload_drop":
            play = ReloadDrop(self, step.pick, step.length_s)
            self.reload_drops.append(play)
            play.start()
        elif step.kind in ("server_restart", "server_crash"):
            at, back = self.restart_server(crash=step.kind == "server_crash")
            self.faults.append(Fault(step.kind, at, back))
        elif step.kind == "rolling_restart":
            if victim.alive() and victim.ready() and not victim.stopped and not victim.retiring:
                victim.retiring = True
                self.fleet.signal(victim, signal.SIGTERM)  # _respawn_exited starts its successor
                self.rolling_restarts += 1
        elif step.kind == "cancel":
            recent = workload.enqueues[-50:]
            if recent:
                self._cancel(recent[int(step.pick * len(recent))].job)
        else:
            self._inject_server_fault(step)

    def restart_server(self, crash: bool) -> tuple[float, float]:
        """A clean restart (SIGTERM) or a crash (SIGKILL) and a start; (when, back up)."""
        at, _, back = self.server_outage(crash)
        return at, back

    def server_outage(self, crash: bool, start_at: float | None = None) -> tuple[float, float, float]:
        """restart_server, the server held down until `start_at` (time.monotonic()) before its
        start: an outage of a length the caller chooses, not a restart's second or two. (When
        the stop or kill began, when the server was down, when it was back up.)"""
        with self.server_lock:
            before = self._runtime_ids() if self.bystander is not None else set()
            at = time.monotonic()
            if crash:
                self.server.kill()
            else:
                self.server.stop()
            down = time.monotonic()
            if start_at is not None and start_at > down:
                time.sleep(start_at - down)  # the outage's length: a fault's duration, not a wait for a state
            self.server.start()
            if self.bystander is not None:  # at once: before the consumers reconnect
                self.bystander.server_back(before)
            return at, down, time.monotonic()

    def _runtime_ids(self) -> set[int]:
        """The server ids of the runtime user's sessions but the bystander's: the ids a consumer
        may remember across a restart."""
        try:
            rows = self.roots["main"].query("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s",
                                            (self.runtime_user,), retry_s=2)
        except MySQLdb.Error:
            return set()
        return {int(cid) for (cid,) in rows} - self.bystander.ids()

    def _inject_server_fault(self, step: Step) -> None:
        raise ValueError(f"no such fault here: {step.kind}")

    def _resume_due_stalls(self, now: float, all_of_them: bool = False) -> None:
        for item in list(self.stalls):
            due, consumer, stopped_at = item
            if all_of_them or now >= due:
                self.stalls.remove(item)
                self.fleet.signal(consumer, signal.SIGCONT)
                end = consumer.killed_at if consumer.killed_at is not None else time.monotonic()
                self.faults.append(Fault("stall", stopped_at, end, consumer.pid))

    def _kill_connection(self, pick: float) -> None:
        """Consumers' sessions and the producers' (this process's own) alike."""
        owners = {port: os.getpid() for port in client_ports(os.getpid())}
        for c in self.fleet.started:
            if c.alive():
                for port in client_ports(c.pid):
                    owners[port] = c.pid
        rows = self.roots["main"].query(
            "SELECT ID, HOST FROM information_schema.PROCESSLIST WHERE USER = %s ORDER BY ID",
            (self.runtime_user,))
        innocent = self.bystander.ids() if self.bystander is not None else set()
        sessions = [(int(cid), owners[int(host.rsplit(":", 1)[1])]) for cid, host in rows
                    if ":" in host and int(host.rsplit(":", 1)[1]) in owners and int(cid) not in innocent]
        if not sessions:
            return
        conn_id, pid = sessions[int(pick * len(sessions))]
        at = time.monotonic()
        try:
            self.roots["main"].query(f"KILL CONNECTION {conn_id}")
        except MySQLdb.Error:
            return  # it closed meanwhile
        self.faults.append(Fault("kill_connection", at, at, pid, detail=str(conn_id)))

    def _kill_query(self, pick: float) -> None:
        """A burst of KILL QUERY at the main consumers' sessions (kill_query.py)."""
        main = self.dbs["main"]
        at = time.monotonic()
        try:
            live = [c for c in self.fleet.slots if c.alive() and not c.stopped and c.ready()]
            sessions = {cid: c.pid for c in live for cid in self._sessions_of(c.pid)}
            conn = admin_connect(main.admin, main.admin.database)
            try:
                sent, hit = kill_query.burst(conn, QueueLocks(main.dsn.database, QUEUE).watch, sessions,
                                             random.Random(pick))
            finally:
                conn.close()
        except MySQLdb.Error:
            return  # the server restarts: no burst
        end = time.monotonic()
        self.faults += [Fault("kill_query", at, end, pid, detail=f"{sent} KILL QUERY in the burst") for pid in sorted(hit)]

    def _cancel(self, job_id: int) -> None:
        session = Session(self.dbs["main"].dsn, retry_s=5, name="cancel")
        at = time.monotonic()
        try:
            result = admin_queries.cancel_job(session, job_id)
        except errors.NotifyqError:
            return
        finally:
            session.close()
        self.faults.append(Fault("cancel", at, time.monotonic(), job=("main", job_id), detail=result or "none"))

    def _respawn_exited(self) -> None:
        for consumer in list(self.fleet.slots):
            if consumer.alive() or consumer.stopped:
                continue
            if consumer.killed_at is None:  # not the schedule's doing: a poison job, or a crash
                consumer.killed_at = time.monotonic()
                code = consumer.popen.returncode
                if code != 70 and not (consumer.retiring and code == 0):
                    self.unexpected.append(f"slot {consumer.slot} pid {consumer.pid} exited {code}")
            self.fleet.slots[consumer.slot] = self._spawn_slot(consumer.slot)
        for i, consumer in enumerate(list(self.long_slots)):
            if not consumer.alive() and not consumer.stopped:  # a death (the exit rule judges it)
                consumer.killed_at = consumer.killed_at or time.monotonic()
                self.long_slots[i] = self.spawn_long(consumer.args[0], command="--command" in consumer.args)

    # ------------------------------------------------------------ the exit-when-empty deployment

    def _cron_run(self, producer: Producer) -> None:
        payloads = [{"s": 0.02} for _ in range(EWE_BURST)]
        try:
            ids = producer.put_many(payloads)
        except errors.NotifyqError:
            return
        acked = time.monotonic()
        self.batch_enqueues += [Enqueue("batch", i, "", "put_many", 0, 0.0, acked) for i in ids]
        consumer = self.fleet.spawn(self.dbs["batch"].env, "batch", BATCH_QUEUE, "locks", self.configs["locks"],
                                    10, -1, "--exit-when-empty")
        self.ewe_kill[consumer.pid] = self.rng.random() < 0.5

    def _kill_ewe_mid_batch(self) -> None:
        for pid, kill in list(self.ewe_kill.items()):
            consumer = self.fleet.by_pid(pid)
            if not kill or consumer is None or not consumer.alive():
                if consumer is not None and not consumer.alive():
                    del self.ewe_kill[pid]
                    consumer.killed_at = consumer.killed_at or time.monotonic()
                continue
            if _starts_in(self.out / f"{pid}.log") >= 3:
                at = self.fleet.kill(consumer)
                self.faults.append(Fault("sigkill", at, at, pid, detail="exit-when-empty"))
                del self.ewe_kill[pid]

    # ------------------------------------------------------------ issue 26's classes

    def _start_long_deployment(self) -> None:
        """The episodes' deployment (episodes.py): its own database, Python and --command consumers."""
        if not any(c in self.plan.classes for c in EPISODES):
            return
        self.dbs[ep.DEPLOY] = create_test_db(self._server_dsn())
        self.roots[ep.DEPLOY] = Root(self.dbs[ep.DEPLOY].admin)  # the monitor and the drain see it too
        self.long_config_path = ep.long_config(self.workdir / "long.toml")
        self.long_slots += [self.spawn_long(ep.PY_QUEUE) for _ in range(ep.PY_CONSUMERS)]
        self.long_slots += [self.spawn_long(ep.CMD_QUEUE, command=True) for _ in range(ep.CMD_CONSUMERS)]

    def spawn_long(self, queue: str, command: bool = False, config: Path | None = None,
                   handler_from_config: bool = False, batch_size: int = 10, extra: tuple[str, ...] = ()) -> Consumer:
        """A consumer of the long deployment: a command or a Python handler, given by its flag,
        or (handler_from_config) by the queue's entry in its config; extra: more flags."""
        handler = ("--command", ep.COMMAND) if command else ("--handler", "nqfault:handle")
        handler = () if handler_from_config else handler
        return self.fleet.spawn(self.dbs[ep.DEPLOY].env, ep.DEPLOY, queue, "locks", config or self.long_config_path,
                                batch_size, -1, *extra, handler=handler)

    def long_put(self, queue: str, payloads: list[dict]) -> list[int]:
        """Enqueue an episode's jobs; each acknowledged one is owed (the lost rule)."""
        producer = self.long_producers.get(queue)
        if producer is None:
            producer = self.long_producers[queue] = Producer(queue, self._config(ep.DEPLOY))
        try:
            ids = producer.put_many(payloads)
        except errors.NotifyqError:
            return []
        acked = time.monotonic()
        self.long_enqueues += [Enqueue(ep.DEPLOY, i, "", "episode", 0, 0.0, acked) for i in ids]
        return ids

    def _start_issue26_threads(self) -> None:
        plan = self.plan
        if "shared_producer" in plan.classes:
            self.shared = SharedProducer("main", self._config("main"), QUEUE, plan.seed, max(40, plan.jobs // 20),
                                         plan.duration_s)
            self.shared.start()
        if "rr_dedup" in plan.classes:
            self.dedup = DedupCaller("main", self._config("main"), QUEUE, plan.duration_s)
            self.dedup.start()
        if plan.episodes and self.long_slots:
            self.episodes = ep.Episodes(self, plan.episodes)
            self.episodes.start()

    def _episodes_running(self) -> bool:
        return self.episodes is not None and self.episodes.is_alive()

    def _start_rated(self) -> None:
        """The rate class: its consumers, and its producer, which runs as long as the schedule."""
        if rated.DEPLOY not in self.dbs:
            return
        path = rated.write_rated_config(self.workdir / "rated.toml", self.plan.lease_s)
        # the handler reads each claim's spend from the rate log, as the server's admin (nqfault)
        env = {**self.dbs[rated.DEPLOY].env, "NQF_RATE_DSN": self._server_dsn(),
               "NQF_RATE_DB": self.dbs[rated.DEPLOY].admin.database}
        for _ in range(rated.CONSUMERS):
            self.fleet.spawn(env, rated.DEPLOY, rated.QUEUE, "locks", path, 10)
        env = {k: v for k, v in self.dbs[rated.DEPLOY].env.items() if k.startswith("NOTIFYQ_")}
        self.rated = rated.RatedProducer(config_mod.load(env={**env, "NOTIFYQ_CONFIG": str(path)}),
                                         self.plan.seed, self.plan.duration_s)
        self.rated.start()

    def _join_issue26_threads(self) -> None:
        if self.shared is not None:
            self.shared.join(30)
        if self.dedup is not None:
            self.dedup.stop.set()
            self.dedup.join(30)
        if self.episodes is not None:
            self.episodes.stop.set()
            self.episodes.join(60)
        for producer in self.long_producers.values():
            producer.close()

    def _join_lock_reload(self) -> None:
        """The row, key and gap locks let go and the reload plays' files restored, before the
        drain: a held row keeps its job pending, a bad file would be a respawn's config. The gap
        holds' jobs on their new queues are deleted: nothing consumes them (the drain waits for
        every pending job, and no enqueue of the workload's names them)."""
        for t in [*self.row_lockers, *self.key_lockers, *self.gap_holders, *self.reload_drops]:
            t.join(30)
        for play in self.reload_drops:
            self.faults += play.faults
        self.faults += [t.fault for t in self.key_lockers if t.fault is not None]
        if self.gap_holders:
            self.roots["main"].query("DELETE FROM nq_job WHERE queue LIKE %s", (GAP_QUEUES,))

    def _poll_max_s(self) -> float:
        """The main deployment's wakeup.poll_max_s: the largest of its consumers' configs."""
        modes = ("locks", "polling") if "polling" in self.plan.classes else ("locks",)
        env = {k: v for k, v in self.dbs["main"].env.items() if k.startswith("NOTIFYQ_")}
        return max(config_mod.load(env={**env, "NOTIFYQ_CONFIG": str(self.configs[m])}).wakeup.poll_max_s
                   for m in modes)

    def _note_exits(self) -> None:
        """Every consumer's end, once, and whether the schedule explains it (checker: consumer_exit).
        `at` is when it was first seen gone (no earlier than the exit): a handler still running
        after it outlived its consumer (checker: orphaned_run)."""
        for c in self.fleet.started:
            if c.exit_noted or c.alive():
                continue
            c.exit_noted = True
            code = c.popen.returncode
            at = c.killed_at if c.expect == "SIGKILL" and c.killed_at is not None else time.monotonic()
            self.exits.append(Exit(c.pid, at, code, *self._exit_reason(c, code)))

    def _exit_reason(self, c: Consumer, code: int | None) -> tuple[bool, str]:
        if c.expect == "SIGKILL":
            return True, "SIGKILL"
        if code == 70:
            return True, "a poison job's os._exit"
        if code == 0 and (c.expect == "SIGTERM" or "--exit-when-empty" in c.args):
            return True, c.expect or "exit when empty"
        if code == -signal.SIGTERM and c.expect == "SIGTERM" and not c.ready():
            # Stopped while it started (the final stop can meet a successor just spawned): its
            # handlers were not installed yet, so the signal's default action; it had claimed
            # nothing (it registers after them), as a service stopped by systemd then.
            return True, "SIGTERM before it started"
        if code == 3 and c is self.async_consumer:
            return True, "refused an async handler at start"
        # The log's last lines say why (a CI run's logs are gone once its machine is)
        return False, (f"not the schedule's doing (signalled: {c.expect or 'no'}; log {c.err.name}, "
                       f"ending: {_tail(c.err)!r})")

    def _kill_session(self, pick: float) -> None:
        """KILL CONNECTION of one session of a main-deployment consumer, of the kind the pick draws:
        the liveness session (IS_USED_LOCK of its registration), the work session (the latest
        statement), or another one (watcher, heartbeat, reaper)."""
        kind = SESSION_KINDS[int(pick * len(SESSION_KINDS))]
        victim, busy = self._busy_consumer(pick)
        if victim is None:
            return
        sessions = self._sessions_of(victim.pid)
        lock = self.roots["main"].scalar("SELECT IS_USED_LOCK(lock_name) FROM nq_consumer WHERE pid = %s",
                                         (victim.pid,))
        lock = int(lock) if lock is not None else None
        others = {c: q for c, q in sessions.items() if c != lock}
        work = max(others, key=others.get) if others else None
        target = {"liveness": lock, "work": work}.get(kind, next((c for c in sorted(others) if c != work), None))
        if target is None or target not in sessions:
            return
        at = time.monotonic()
        try:
            self.roots["main"].query(f"KILL CONNECTION {target}")
        except MySQLdb.Error:
            return  # it closed meanwhile
        self.faults.append(Fault("kill_session", at, at, victim.pid,
                                 detail=f"{kind} of a {'busy' if busy else 'live'} consumer, connection {target}"))

    def _busy_consumer(self, pick: float) -> tuple[Consumer | None, bool]:
        """A lock-mode main consumer in a long job if there is one (by the pick), else any."""
        live = [c for c in self.fleet.slots if c.alive() and not c.stopped and c.mode == "locks" and c.ready()]
        open_long = {r.pid for r in read_runs(self.out, [c.pid for c in live]) if r.end is None and "L" in r.flags}
        busy = [c for c in live if c.pid in open_long]
        pool = busy or live
        return (pool[int(pick * len(pool))], bool(busy)) if pool else (None, False)

    def _sessions_of(self, pid: int) -> dict[int, int]:
        """{connection id: order of its latest statement} of process `pid`."""
        return {cid: order for cid, (_, order) in sessions_of(self.roots["main"].query, self.runtime_user, pid).items()}

    # ------------------------------------------------------------ drain and collect

    def _drain(self) -> bool:
        """Healthy consumers until nothing is pending. Bounded: False once `drain_s` pass
        without the pending count going down (a backlog left by a slow machine drains as long
        as it keeps moving; a job stuck for good does not hold the run forever)."""
        self._resume_due_stalls(time.monotonic(), all_of_them=True)
        self._respawn_exited()
        if "batch" in self.dbs:
            self.fleet.spawn(self.dbs["batch"].env, "batch", BATCH_QUEUE, "locks", self.configs["locks"], 10)
        patience = self.drain_s + 3 * self.plan.lease_s
        best, stalled_since = None, time.monotonic()
        while time.monotonic() - stalled_since < patience:
            self._respawn_exited()
            self.monitor.tick()
            pending = sum(root.scalar("SELECT COUNT(*) FROM nq_job WHERE status IN (0, 1, 2)")
                          for root in self.roots.values())
            if pending == 0:
                return True
            if best is None or pending < best:
                best, stalled_since = pending, time.monotonic()
            time.sleep(0.25)  # poll interval inside a deadline loop
        return False

    def _history(self, workload: Workload) -> History:
        runs = read_runs(self.out)
        enqueues = workload.enqueues + self.batch_enqueues + self.long_enqueues
        enqueues += (self.shared.enqueues if self.shared else []) + (self.dedup.enqueues if self.dedup else [])
        enqueues += self.rated.enqueues if self.rated else []
        enqueues += [e for play in self.reload_drops for e in play.enqueues]
        poison = {e.key for e in enqueues if e.kind == "poison"}
        rows = []
        for deploy, root in self.roots.items():
            for job, status, attempts, last_error, owner in root.query(
                    "SELECT id, status, attempts, last_error, owner FROM nq_job"):
                rows.append(FinalRow(deploy, int(job), int(status), int(attempts), last_error, owner))
        effects, invalid_results = {}, []
        if "effects" in self.plan.classes:
            effects = {("main", int(job)): int(n) for job, n in self.roots["main"].query(
                f"SELECT job_id, COUNT(*) FROM {EFFECTS_TABLE} GROUP BY job_id")}
            invalid_results = [("main", int(job)) for (job,) in self.roots["main"].query(
                "SELECT job_id FROM nq_attempt WHERE result IS NOT NULL AND NOT JSON_VALID(result)")]
        faults = self.faults + poison_exits(runs, poison)
        (self.logs / "faults.txt").write_text("".join(f"{f}\n" for f in sorted(faults, key=lambda f: f.start)))
        return History(runs, enqueues, faults + self._takebacks(), rows, self.plan.lease_s,
                       effects=effects, invalid_results=invalid_results,
                       recovery_s=self.monitor.recovery(), recovery_bound_s=self.plan.lease_s + 6.0,
                       recovery_unattended_s=self.monitor.unattended_s(),
                       exits=self.exits, refused=self.shared.refused if self.shared else [],
                       consumer_pids={c.pid for c in self.fleet.started},
                       lease_by_deploy={ep.DEPLOY: ep.LONG_LEASE_S},
                       rates={rated.DEPLOY: rated.limits()} if self.rated else {},
                       job_keys=self.rated.keys if self.rated else {}, hand_backs=self._hand_backs(),
                       key_limits={"main": KEY_LIMIT},
                       bystander_losses=self.bystander.losses if self.bystander else [],
                       row_locks=[t.lock for t in self.row_lockers if t.lock is not None],
                       key_locks=[t.lock for t in self.key_lockers if t.lock is not None],
                       signal_gaps=[t.lock for t in self.gap_holders if t.lock is not None],
                       poll_max_s={"main": self._poll_max_s()} if self.row_lockers else {},
                       lease_takebacks=self._lease_takebacks())


def _epoch(ts: str) -> float:
    """A log line's `ts=` (UTC, milliseconds) in epoch seconds."""
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _starts_in(log: Path) -> int:
    try:
        return sum(1 for line in log.read_text().splitlines() if line.startswith("S "))
    except FileNotFoundError:
        return 0


@contextlib.contextmanager
def _library_log_to(path: Path):
    logger = logging.getLogger("notifyq")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        handler.close()
