"""The `reload_drop` class: a reload whose config lost the section of the queue a consumer serves.

An operator mistypes the section's name ([queue.fqq] for [queue.fq]) and reloads (SIGHUP). The
queue would go on with the defaults, its limit_per_key gone in silence; a reload must instead be
refused whole, the old config running on (Supervisor._reload, check_sections_kept). With the
class, each main consumer reads a config file of its own (FaultRun._spawn_slot): the play
rewrites only its victims' files, so a consumer that starts meanwhile (a respawn, a cron run)
never starts from the bad one. While the bad files are in place jobs of one key, long enough to
overlap, are put one by one, faster than KEY_LIMIT consumers run them. A limited claim counts
the key's claimed jobs, whoever claimed them, so the runs past the limit are the victims' own,
one at a time each: the play takes KEY_LIMIT + 1 victims at least (half the consumers when
that is more), and puts the jobs one by one so that no claim of one victim takes them all.
A victim that applied the reload then runs them past the limit, and the checker's key_limit
rule catches it. Then the files are restored and the
victims SIGHUPed again (a reload that applies, and changes nothing).
"""

from __future__ import annotations

import random
import signal
import threading
import time

import MySQLdb

from notifyq import errors
from notifyq.produce.producer import Producer

from .fleet import KEY_LIMIT, Consumer, write_config
from .history import Enqueue, Fault

BAD_SECTION = "fqq"  # the mistyped [queue.fq]
BURST_KEY = "rd"  # a key of its own: the workload's keys (fk*) keep their pace
BURST_JOBS = 30
BURST_EVERY_S = 0.1  # one job of the key this often: ten a second, more than KEY_LIMIT run
BURST_JOB_S = 0.3  # each, so that runs of the key overlap (the limit lets KEY_LIMIT at once)
REFUSED = "reload failed, keeping the old config"
APPLIED = "reloaded config"
SEEN_S = 5.0  # a SIGHUP is read at the consumer's next main-loop tick (0.5 s), on a loaded box


def _reloads(c: Consumer) -> tuple[int, int]:
    text = c.err.read_text(errors="replace")
    return text.count(REFUSED), text.count(APPLIED)


class ReloadDrop(threading.Thread):
    """One play against some of the main deployment's live consumers (half of them, by the pick)."""

    def __init__(self, run, pick: float, length_s: float):
        super().__init__(name="reload-drop", daemon=True)
        self.run_, self.length_s = run, length_s
        self.rng = random.Random(pick)
        self.stop = threading.Event()
        self.faults: list[Fault] = []
        self.enqueues: list[Enqueue] = []
        self.refused = self.applied = 0  # the victims' reloads of the bad config, by outcome

    def _write(self, c: Consumer, section: str) -> None:
        plan = self.run_.plan
        write_config(c.config, plan.lease_s, c.mode == "polling", keep_results="effects" in plan.classes,
                     main_section=section)

    def _sighup(self, c: Consumer, detail: str) -> None:
        at = time.monotonic()
        self.run_.fleet.signal(c, signal.SIGHUP)
        self.faults.append(Fault("sighup", at, at, c.pid, detail=detail))

    def run(self) -> None:
        live = [c for c in self.run_.fleet.slots if c.alive() and c.ready() and not c.stopped and not c.retiring
                and c.config is not None and c.deploy == "main"]
        if not live:
            return
        victims = self.rng.sample(live, min(len(live), max(KEY_LIMIT + 1, len(live) // 2)))
        before = {c.pid: _reloads(c) for c in victims}
        try:
            for c in victims:
                self._write(c, BAD_SECTION)
                self._sighup(c, f"reload_drop: [queue.fq] mistyped [queue.{BAD_SECTION}]")
            deadline = time.monotonic() + SEEN_S
            while time.monotonic() < deadline and not self.stop.is_set() and any(
                    c.alive() and _reloads(c) == before[c.pid] for c in victims):
                self.stop.wait(0.05)  # a wait for the consumers' log lines, bounded by SEEN_S
            for c in victims:
                refused, applied = _reloads(c)
                self.refused += refused - before[c.pid][0]
                self.applied += applied - before[c.pid][1]
            started = time.monotonic()
            self._burst()
            self.stop.wait(max(0.0, self.length_s - (time.monotonic() - started)))  # the bad config's time
        finally:  # whatever happened, no file stays bad
            for c in victims:
                self._write(c, "fq")
                if c.alive() and not c.stopped:
                    self._sighup(c, "reload_drop: [queue.fq] restored")

    def _burst(self) -> None:
        """Jobs of one key, put one by one through a producer of the good config while the bad
        one is in place: each is claimed by whichever consumer is idle (a put_many's batch
        would go whole to one claim, run one at a time)."""
        try:
            producer = Producer("fq", self.run_._config("main"))
        except (errors.NotifyqError, MySQLdb.Error):
            return
        with producer:
            for _ in range(BURST_JOBS):
                if self.stop.wait(BURST_EVERY_S):  # the burst's pace, not a synchronisation
                    return
                try:
                    job = producer.put({"s": BURST_JOB_S}, key=BURST_KEY)
                except (errors.NotifyqError, MySQLdb.Error):
                    continue  # not acknowledged (a server fault): nothing is owed
                self.enqueues.append(Enqueue("main", job, "", "put", 0, 0.0, time.monotonic()))
