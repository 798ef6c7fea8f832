"""Issue 26's long fault classes: episodes played one at a time, in a thread, on a second
deployment ("long") whose settings let the holes show: lease 30 s (a worker's ownership check
between starts comes every 10 s), session_idle_s 4 (a stop of 9 s frees a liveness lock),
--command queues with a 6 s lease and a 60 s command timeout.

Each episode enqueues its own jobs, waits until the consumers are where the fault must find
them (watching the handlers' start lines), injects the fault and records it, then waits for
its jobs to finish. What it proves is the checker's (checker.py, issue 26's rules).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from notifyq.consume.service import SETTLE_AT_EXIT_S

from .fleet import Consumer
from .history import Fault, read_runs

DEPLOY = "long"
PY_QUEUE, CMD_QUEUE, GRACE_QUEUE = "fl", "fc", "fg"
RESTART_QUEUE = "fr"  # grace_restart's: only its grace consumer and that one's peer serve it
# grace_outage's, the same; its lease (the defaults', 30 s) outlasts the outage: a lease that
# runs out comes back whoever holds it, and with fr's 6 s the peer's reaper, not the stop, would
# decide what becomes of a job that ended in the outage, its ack pending
OUTAGE_QUEUE = "fo"
# frozen_at_stop's: a Python handler's consumer (one worker) and, once the server answers again,
# its peer; the defaults' 30 s lease outlasts the freeze
FROZEN_QUEUE = "fz"
LONG_LEASE_S, CMD_LEASE_S, SESSION_IDLE_S = 30.0, 6.0, 4
PY_CONSUMERS, CMD_CONSUMERS = 3, 2
# grace_restart: the grace consumer's shutdown_grace_s, its short command (it ends after the
# server is back, within the grace: acked) and its long one (it outlasts the grace: given back)
RESTART_GRACE_S, RESTART_SHORT_S, RESTART_LONG_S = 7.0, 5.0, 11.0
# grace_outage: the same stop, the server stopped once the registration says stopping and held
# down across the short command's end and the grace's end; started again this long after the
# grace's end (back a second or two later: well within the SETTLE_AT_EXIT_S, 12 s, for which
# the stop waits for its server to settle what it held)
OUTAGE_PAST_GRACE_S = 2.0
# frozen_at_stop: the stopped consumer's shutdown_grace_s, its first job's length (the server
# freezes FROZEN_LEAD_S before that job ends), and how long past the grace's end the server stays
# frozen (past the old exit's 2 s, well within SETTLE_AT_EXIT_S)
FROZEN_GRACE_S, FROZEN_JOB_S, FROZEN_LEAD_S, FROZEN_PAST_GRACE_S = 3.0, 2.0, 0.4, 3.0
COMMAND = f"{sys.executable} {Path(__file__).resolve().parent.parent / 'helpers' / 'nqfault_cmd.py'}"


def long_config(path: Path, session_idle_s: int = SESSION_IDLE_S, py_lease_s: float = LONG_LEASE_S,
                grace_s: float = 30.0, grace_command: bool = False) -> Path:
    """The long deployment's config. grace_command: queue fg's command comes from the config
    (a reload then makes a new handler for it), not from the --command flag."""
    command = f"command = {json.dumps(COMMAND)}\n" if grace_command else ""
    text = (f"[defaults]\nlease_s = {LONG_LEASE_S}\nmax_attempts = 5\nretry_base_s = 0.5\nretry_max_s = 4.0\n"
            f"command_timeout_s = 60\n"
            f"[queue.{PY_QUEUE}]\nlease_s = {py_lease_s}\n"
            f"[queue.{CMD_QUEUE}]\nlease_s = {CMD_LEASE_S}\n[queue.{RESTART_QUEUE}]\nlease_s = {CMD_LEASE_S}\n"
            f"[queue.{OUTAGE_QUEUE}]\nlease_s = {LONG_LEASE_S}\n[queue.{FROZEN_QUEUE}]\nlease_s = {LONG_LEASE_S}\n"
            f"[queue.{GRACE_QUEUE}]\nlease_s = {CMD_LEASE_S}\n{command}"
            f"[consumer]\nreap_interval_s = 0.5\nshutdown_grace_s = {grace_s}\nsession_idle_s = {session_idle_s}\n")
    path.write_text(text)
    path.chmod(0o600)
    return path


class Episodes(threading.Thread):
    """Plays plan.episodes against the harness's long deployment (FaultRun.long_*)."""

    def __init__(self, run, order: tuple[str, ...]):
        super().__init__(name="episodes", daemon=True)
        self.run_, self.order = run, order
        self.stop = threading.Event()
        self.played: list[str] = []
        self.missed: list[str] = []  # plays that did not do what they are for (in the run's note)
        self.crash_next = False  # busy_restart: clean and crash by turns
        self.error: str | None = None

    def run(self) -> None:
        try:
            for name in self.order:
                if self.stop.is_set():
                    return
                getattr(self, f"_{name}")()
                self.played.append(name)
                self.stop.wait(3.0)  # schedule.EPISODE_GAP_S: the queue empties between episodes
        except Exception as e:  # noqa: BLE001 - reported in the run's summary, not swallowed
            where = traceback.extract_tb(e.__traceback__)[-1]
            self.error = f"{type(e).__name__}: {e} ({Path(where.filename).name}:{where.lineno})"

    # ------------------------------------------------------------ helpers

    def _put(self, queue: str, payloads: list[dict]) -> list[int]:
        return self.run_.long_put(queue, payloads)

    def _wait_started(self, jobs: list[int], timeout_s: float, pids: int = 1, every: bool = False) -> dict[int, int]:
        """Wait until `pids` distinct processes started some of `jobs` (every: and each of them
        started); job -> pid of its first start."""
        deadline = time.monotonic() + timeout_s
        wanted = set(jobs)
        while time.monotonic() < deadline and not self.stop.is_set():
            first: dict[int, int] = {}
            mine = [c.pid for c in self.run_.fleet.started if c.deploy == DEPLOY]
            for r in sorted(read_runs(self.run_.out, mine), key=lambda r: r.start):
                if r.deploy == DEPLOY and r.job in wanted:
                    first.setdefault(r.job, r.pid)
            if len(set(first.values())) >= pids and (not every or len(first) == len(wanted)):
                return first
            time.sleep(0.1)  # poll interval inside a deadline
        return {}

    def _until(self, predicate, timeout_s: float) -> bool:
        """Whether `predicate()` came true within the deadline (False too once the run stops)."""
        deadline = time.monotonic() + timeout_s
        while not self.stop.is_set():
            if predicate():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)  # poll interval inside a deadline
        return False

    def _consumer(self, pid: int) -> Consumer | None:
        return self.run_.fleet.by_pid(pid)

    def _fault(self, kind: str, start: float, end: float, pid: int | None = None, detail: str = "") -> None:
        self.run_.faults.append(Fault(kind, start, end, pid, detail=detail))

    # ------------------------------------------------------------ the episodes

    def _stall_idle(self) -> None:
        """Item 4: a batch of six 2 s jobs; its consumer stopped 9 s (> session_idle_s) in job 1."""
        jobs = self._put(PY_QUEUE, [{"s": 2.0}] * 6)
        victim = self._consumer(next(iter(self._wait_started(jobs, 20).values()), -1))
        if victim is None or not victim.alive():
            return
        self.run_.fleet.signal(victim, signal.SIGSTOP)
        stopped = time.monotonic()
        self.stop.wait(SESSION_IDLE_S + 5.0)
        self.run_.fleet.signal(victim, signal.SIGCONT)
        self._fault("stall", stopped, time.monotonic(), victim.pid, detail="stall_idle")
        self.stop.wait(14.0)

    def _busy_restart(self) -> None:
        """Item 5: two consumers in 20 s jobs (they extend their leases), the third idle."""
        # One at a time: put together, one claim would take both and run them one after the other
        first = self._put(PY_QUEUE, [{"k": "long", "s": 20.0, "x": 3.0}])
        if not self._wait_started(first, 20):
            return
        jobs = first + self._put(PY_QUEUE, [{"k": "long", "s": 20.0, "x": 3.0}])
        if not self._wait_started(jobs, 20, pids=2):
            return
        kind = "busy_crash" if self.crash_next else "busy_restart"
        self.crash_next = not self.crash_next
        at, back = self.run_.restart_server(crash=kind == "busy_crash")
        self._fault(kind, at, back)
        self.stop.wait(24.0)

    def _sighup_reload(self) -> None:
        """Item 6: session_idle_s raised 4 -> 40 and fl's lease lowered 30 -> 8, live, while a
        30 s job (extending its lease) and a batch of twelve 1.5 s jobs run; then back."""
        jobs = self._put(PY_QUEUE, [{"k": "long", "s": 30.0, "x": 3.0}])
        jobs += self._put(PY_QUEUE, [{"s": 1.5}] * 12)
        if not self._wait_started(jobs, 20, pids=2):
            return
        self._reload(session_idle_s=40, py_lease_s=8.0, detail="session_idle_s 4->40, fl lease_s 30->8")
        self.stop.wait(40.0)
        self._reload(session_idle_s=SESSION_IDLE_S, py_lease_s=LONG_LEASE_S, detail="back")

    def _reload(self, session_idle_s: int, py_lease_s: float, detail: str) -> None:
        long_config(self.run_.long_config_path, session_idle_s, py_lease_s)
        for consumer in list(self.run_.long_slots):
            if consumer.alive() and "--command" not in consumer.args:
                at = time.monotonic()
                self.run_.fleet.signal(consumer, signal.SIGHUP)
                self._fault("sighup", at, at, consumer.pid, detail=detail)

    def _long_command(self) -> None:
        """Item 7: two 14 s commands on a 6 s lease, within the 60 s command timeout; no fault."""
        self._put(CMD_QUEUE, [{"s": 14.0}, {"s": 14.0}])
        self.stop.wait(22.0)

    def _grace_expiry(self) -> None:
        """Item 9: SIGTERM a command consumer (shutdown_grace_s 2) while its 10 s command runs;
        a peer serves the queue from then on. Every other time (the first time on an odd seed) the
        command is the config's and the consumer reloads it (SIGHUP) while it runs, first: the
        command the grace kills must still be the running one (a reload once left it running
        on, orphaned, while a peer ran its job again)."""
        run = self.run_
        play = f"grace_expiry #{self.played.count('grace_expiry') + 1}"
        reload = (self.played.count("grace_expiry") + run.plan.seed) % 2 == 1
        self._retire_grace_peer()  # else the last play's peer, idle, may take the job
        config = long_config(run.workdir / "grace.toml", grace_s=2.0, grace_command=reload)
        grace = run.spawn_long(GRACE_QUEUE, command=True, config=config, handler_from_config=reload)
        deadline = time.monotonic() + 30
        while not grace.ready() and time.monotonic() < deadline:
            time.sleep(0.1)  # poll interval inside a deadline
        jobs = self._put(GRACE_QUEUE, [{"s": 10.0}])
        started = self._wait_started(jobs, 20)
        if started.get(jobs[0] if jobs else -1) != grace.pid:
            self.missed.append(f"{play}: its job did not start on the grace consumer ({started or 'not at all'})")
        if not started:
            return
        if reload:
            at = time.monotonic()
            run.fleet.signal(grace, signal.SIGHUP)
            self._fault("sighup", at, at, grace.pid, detail="while its command runs")
            deadline = time.monotonic() + 5
            while "reloaded config" not in grace.err.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)  # poll interval inside a deadline
            if "reloaded config" not in grace.err.read_text():
                self.missed.append(f"{play}: the grace consumer did not say it reloaded within 5 s")
        at = time.monotonic()
        run.fleet.signal(grace, signal.SIGTERM)
        try:
            grace.popen.wait(15)
        except Exception:  # noqa: BLE001 - still running: the exit rule and the drain will say
            pass
        self._fault("grace_expiry", at, time.monotonic(), grace.pid, detail="shutdown_grace_s 2")
        run.long_slots.append(run.spawn_long(GRACE_QUEUE, command=True))  # the peer, to the next play
        self.stop.wait(15.0)

    def _retire_grace_peer(self, queue: str = GRACE_QUEUE) -> None:
        """The last play's peer on `queue` leaves (SIGTERM, idle: it exits at once) before
        the next play's grace consumer starts."""
        run = self.run_
        for peer in [c for c in run.long_slots if c.args and c.args[0] == queue]:
            run.long_slots.remove(peer)  # not respawned
            run.fleet.signal(peer, signal.SIGTERM)
            try:
                peer.popen.wait(15)
            except Exception:  # noqa: BLE001 - still running: the exit rule and the drain will say
                pass

    def _grace_restart(self) -> None:
        """The server restarts during a consumer's shutdown grace: SIGTERM a command consumer
        (two workers, shutdown_grace_s 7) while its two commands run, a 5 s and an 11 s one, and
        restart the server (clean) once its registration says it is stopping. The short command
        ends after the server is back, within the grace: it must be acked. The long one outlasts
        the grace: killed and given back uncharged, it must run again on the peer (started idle
        before the stop, so its reaper runs through the restart). The consumer must exit 0
        within the grace and a few seconds (checker.check_grace_restarts)."""
        self._grace_stop("grace_restart")

    def _grace_outage(self) -> None:
        """grace_restart's stop, the server away across its grace's end: stopped (clean, or a
        crash every other play: the first on an odd seed) once the registration says stopping,
        held down while the short command ends (its handler's cancel check, once a second,
        retrying the server then) and while the grace ends (the long command killed, the short
        one's ack and the long one's give-back meeting no server), started again
        OUTAGE_PAST_GRACE_S after the grace's end. On a queue of its own (OUTAGE_QUEUE), whose
        lease outlasts the outage. The short command must be acked (its exit is
        its outcome, the stop settles it once the server answers), the long one given back
        uncharged and run again by the peer, the consumer exit 0 once it settled, within the
        grace and service.SETTLE_AT_EXIT_S (checker.check_grace_restarts)."""
        self._grace_stop("grace_outage")

    def _frozen_at_stop(self) -> None:
        """An outside attack's stop: the server frozen (SIGSTOP) just before a Python handler's
        job ends, the consumer (one worker, a claim of one job or of two by turns: the first on
        an even seed) SIGTERMed once that job ended (its ack on the wire, or waiting to ride the
        next claim), the server thawed FROZEN_PAST_GRACE_S after the grace's end, within
        service.SETTLE_AT_EXIT_S; then a peer starts. The finished job must be acked once (never
        run again), the other given back unstarted (run by the peer), nothing started by the
        stopping consumer after the SIGTERM, and the exit 0 within the grace, SETTLE_AT_EXIT_S
        and a few seconds (checker.check_grace_restarts, its frozen_at_stop rule)."""
        run, name = self.run_, "frozen_at_stop"
        play = f"{name} #{self.played.count(name) + 1}"
        batch = 1 + (self.played.count(name) + run.plan.seed) % 2
        self._retire_grace_peer(FROZEN_QUEUE)
        config = long_config(run.workdir / f"{name}.toml", grace_s=FROZEN_GRACE_S)
        grace = run.spawn_long(FROZEN_QUEUE, config=config, batch_size=batch, extra=("--workers", "1"))
        deadline = time.monotonic() + 30
        while not grace.ready() and time.monotonic() < deadline:
            time.sleep(0.1)  # poll interval inside a deadline
        jobs = self._put(FROZEN_QUEUE, [{"s": FROZEN_JOB_S}, {"s": 1.0}])
        if not jobs:
            return
        started = self._wait_started(jobs[:1], 20)
        if started.get(jobs[0]) != grace.pid:
            self.missed.append(f"{play}: its first job did not start on the grace consumer ({started or 'not at all'})")
            return
        [first] = [r for r in read_runs(run.out, [grace.pid]) if r.deploy == DEPLOY and r.job == jobs[0]]
        freeze_at = first.start + FROZEN_JOB_S - FROZEN_LEAD_S
        self.stop.wait(max(0.0, freeze_at - time.monotonic()))  # the fault's moment, not a wait for a state
        ended = lambda: [r for r in read_runs(run.out, [grace.pid])  # noqa: E731
                         if r.deploy == DEPLOY and r.job == jobs[0] and r.end is not None]
        with run.server_lock:
            server_pid = run.server._proc.pid
            os.kill(server_pid, signal.SIGSTOP)
            frozen = time.monotonic()
            at = None
            try:
                # no database in here: the server is frozen
                if self._until(ended, 5):
                    at = time.monotonic()
                    run.fleet.signal(grace, signal.SIGTERM)
                    self.stop.wait(FROZEN_GRACE_S + FROZEN_PAST_GRACE_S)  # the freeze's length past the grace
            finally:
                os.kill(server_pid, signal.SIGCONT)
                thawed = time.monotonic()
        self._fault("server_frozen", frozen, thawed, detail=f"in the grace of pid {grace.pid}")
        if at is None:
            self.missed.append(f"{play}: its first job did not end within 5 s of the freeze")
            run.fleet.signal(grace, signal.SIGTERM)
            at = time.monotonic()
        elif ended()[0].end <= frozen:
            self.missed.append(f"{play}: its first job ended {frozen - ended()[0].end:.2f} s before the freeze")
        run.long_slots.append(run.spawn_long(FROZEN_QUEUE))  # the peer: what was given back is its
        try:
            grace.popen.wait(FROZEN_GRACE_S + SETTLE_AT_EXIT_S + 20)
        except Exception:  # noqa: BLE001 - still running: the checker's rule says so
            pass
        self._fault(name, at, time.monotonic(), grace.pid, detail=f"shutdown_grace_s={FROZEN_GRACE_S:g}")
        root = run.roots[DEPLOY]
        if not self._until(lambda: not root.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = %s",
                                                   (FROZEN_QUEUE,)), 20) and not self.stop.is_set():
            self.missed.append(f"{play}: its jobs were not done 20 s after the exit")

    def _grace_stop(self, name: str) -> None:
        """grace_restart and grace_outage: `name` is the episode, and the record of the stop."""
        run = self.run_
        play = f"{name} #{self.played.count(name) + 1}"
        outage = name == "grace_outage"
        crash = outage and (self.played.count(name) + run.plan.seed) % 2 == 1
        queue = OUTAGE_QUEUE if outage else RESTART_QUEUE
        self._retire_grace_peer(queue)
        config = long_config(run.workdir / f"{name}.toml", grace_s=RESTART_GRACE_S)
        grace = run.spawn_long(queue, command=True, config=config, batch_size=1, extra=("--workers", "2"))
        deadline = time.monotonic() + 30
        while not grace.ready() and time.monotonic() < deadline:
            time.sleep(0.1)  # poll interval inside a deadline
        jobs = self._put(queue, [{"s": RESTART_SHORT_S}, {"s": RESTART_LONG_S}])
        started = self._wait_started(jobs, 20, every=True)
        if set(started.values()) != {grace.pid}:
            self.missed.append(f"{play}: its jobs did not both start on the grace consumer ({started or 'not at all'})")
        if not started:
            return
        run.long_slots.append(run.spawn_long(queue, command=True))  # the peer, idle until the give-back
        at = time.monotonic()
        run.fleet.signal(grace, signal.SIGTERM)
        root = run.roots[DEPLOY]
        grace_end = at + RESTART_GRACE_S
        outage_s: tuple[float, float] | None = None  # (down, back) of grace_outage's server
        if self._until(lambda: root.scalar("SELECT stopping FROM nq_consumer WHERE pid = %s", (grace.pid,)), 5):
            if outage:
                down_at, down, back = run.server_outage(crash, start_at=grace_end + OUTAGE_PAST_GRACE_S)
                self._fault("busy_crash" if crash else "busy_restart", down_at, back,
                            detail=f"in the grace of pid {grace.pid}")
                outage_s = (down, back)
            else:
                down_at, back = run.restart_server(crash=False)
                self._fault("busy_restart", down_at, back, detail=f"in the grace of pid {grace.pid}")
                if back > grace_end:
                    self.missed.append(f"{play}: the server came back {back - at:.1f} s after the stop, "
                                       f"past the {RESTART_GRACE_S:g} s grace")
        elif not self.stop.is_set():
            self.missed.append(f"{play}: the grace consumer's registration did not say stopping within 5 s")
        try:
            grace.popen.wait(RESTART_GRACE_S + (SETTLE_AT_EXIT_S if outage else 0.0) + 20)
        except Exception:  # noqa: BLE001 - still running: the checker's rule says so
            pass
        self._fault(name, at, time.monotonic(), grace.pid, detail=f"shutdown_grace_s={RESTART_GRACE_S:g}")
        if outage_s is not None:
            self._missed_outage(play, grace.pid, jobs[0], at, *outage_s)
        # Until the peer has run the long command again (its jobs gone from the table)
        if not self._until(lambda: not root.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = %s",
                                                   (queue,)), RESTART_LONG_S + 10) \
                and not self.stop.is_set():
            self.missed.append(f"{play}: its jobs were not done {RESTART_LONG_S + 10:g} s after the exit")

    def _missed_outage(self, play: str, pid: int, short_job: int, stopped: float, down: float, back: float) -> None:
        """grace_outage's point: the server was down (its stop or kill done) when the short
        command ended and when the grace ended, and back within SETTLE_AT_EXIT_S of the grace's end."""
        grace_end = stopped + RESTART_GRACE_S
        if not down < grace_end < back <= grace_end + SETTLE_AT_EXIT_S:
            self.missed.append(f"{play}: the server was down {down - stopped:.1f}-{back - stopped:.1f} s after the "
                               f"stop, not across the grace's end ({RESTART_GRACE_S:g} s) and back within "
                               f"{SETTLE_AT_EXIT_S:g} s of it")
        short = [r for r in read_runs(self.run_.out, [pid])
                 if r.deploy == DEPLOY and r.job == short_job and r.pid == pid]
        ended = short[0].end if short else None
        if ended is None or not down < ended < back:
            shown = "never" if ended is None else f"{ended - stopped:.1f} s after the stop"
            self.missed.append(f"{play}: the short command ended {shown}, not while the server was down "
                               f"({down - stopped:.1f}-{back - stopped:.1f} s)")
