"""The real `notifyq consume` processes of a fault-schedule run, in numbered slots.

Every process this harness starts is kept in `started`, and `reap_all` ends each by its own
pid: nothing is found by name, so other people's consumers and servers are never touched.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CONSUMER_HANDLER = "nqfault:handle"


@dataclasses.dataclass
class Consumer:
    popen: subprocess.Popen
    slot: int  # -1: not in a slot (exit-when-empty runs, drain helpers)
    mode: str  # locks | polling
    deploy: str
    started_at: float
    err: Path  # its log (stderr)
    stopped: bool = False  # SIGSTOPped right now
    retiring: bool = False  # SIGTERMed by a rolling restart: its exit is expected
    killed_at: float | None = None  # when the schedule (or a poison job) ended it
    expect: str = ""  # why its exit is the schedule's doing (SIGKILL, SIGTERM ...); "": a death
    exit_noted: bool = False  # its Exit is in the history
    args: tuple[str, ...] = ()  # its queue, handler and extra arguments
    started_consuming: bool = False  # its log said "consumer started" (ready())
    config: Path | None = None  # its NOTIFYQ_CONFIG (a SIGHUP reads it again)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def ready(self) -> bool:
        """It says it started consuming (its registration row may already be reaped: polling mode).
        Read until it does, then remembered: a long run's logs grow, and the schedule asks often."""
        if not self.started_consuming:
            self.started_consuming = "consumer started" in self.err.read_text()
        return self.started_consuming


# issue 38: the main queue's keyed jobs (workload.KEYS) run at most this many at once per key,
# under every fault class (the checker's key_limit)
KEY_LIMIT = 2


def write_config(path: Path, lease_s: float, polling: bool, keep_results: bool = False,
                 main_section: str = "fq") -> Path:
    """The consumers' config: a short lease (stalls outlast it), quick reaping, default attempts;
    keep_results: the queues keep results an hour (the effects class: its unenc jobs' results
    cannot be encoded, and must be dropped, their jobs done once). The main queue (fq) limits
    its keys to KEY_LIMIT running jobs each. main_section: that queue's section name (the
    reload_drop class mistypes it)."""
    defaults = (f"lease_s = {lease_s}\nmax_attempts = 5\nretry_base_s = 0.5\nretry_max_s = 4.0\n"
                + ("result_ttl_s = 3600\n" if keep_results else ""))
    text = (f"[defaults]\n{defaults}"
            + f"[queue.{main_section}]\n{defaults}limit_per_key = {KEY_LIMIT}\n"
            + f"[consumer]\nreap_interval_s = 0.5\nshutdown_grace_s = {lease_s * 3}\n")
    if polling:
        text += "[wakeup]\nuse_locks = false\npoll_max_s = 0.2\n"
    tmp = path.with_name(path.name + ".new")  # a reload never reads it half written
    tmp.write_text(text)
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


class Fleet:
    def __init__(self, logdir: Path, out: Path):
        self.logdir, self.out = logdir, out
        self.started: list[Consumer] = []
        self.slots: list[Consumer] = []

    def spawn(self, env: dict[str, str], deploy: str, queue: str, mode: str, config: Path, batch_size: int,
              slot: int = -1, *extra: str, handler: tuple[str, ...] = ("--handler", CONSUMER_HANDLER)) -> Consumer:
        n = len(self.started)
        env = {**env, "NOTIFYQ_CONFIG": str(config), "NQF_OUT": str(self.out), "NQF_DEPLOY": deploy}
        err_path = self.logdir / f"consumer{n}.err"
        with err_path.open("w") as err:
            popen = subprocess.Popen(
                [sys.executable, "-m", "notifyq", "consume", "-q", queue, *handler,
                 "--batch-size", str(batch_size), *extra],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        consumer = Consumer(popen, slot, mode, deploy, time.monotonic(), err_path, args=(queue, *handler, *extra),
                            config=config)
        with (self.logdir / "fleet.txt").open("a") as fleet_log:  # which log is which pid, for a post-mortem
            fleet_log.write(f"consumer{n}.err pid {popen.pid} slot {slot} mode {mode} deploy {deploy} "
                            f"args {' '.join(extra) or '-'}\n")
        self.started.append(consumer)
        return consumer

    def by_pid(self, pid: int) -> Consumer | None:
        return next((c for c in self.started if c.pid == pid), None)

    def signal(self, consumer: Consumer, sig: int) -> None:
        if consumer.alive():
            consumer.popen.send_signal(sig)
        if sig == signal.SIGTERM:
            consumer.expect = consumer.expect or "SIGTERM"
        if sig == signal.SIGSTOP:
            consumer.stopped = True
        elif sig == signal.SIGCONT:
            consumer.stopped = False

    def kill(self, consumer: Consumer) -> float:
        """SIGKILL and wait for the kernel to close its sockets; returns the kill time."""
        at = time.monotonic()
        consumer.expect = "SIGKILL"
        if consumer.alive():
            consumer.popen.send_signal(signal.SIGKILL)
        consumer.popen.wait(30)
        consumer.killed_at = at
        consumer.stopped = False
        return at

    def stop_all(self, timeout_s: float) -> dict[int, int | str]:
        """SIGTERM (a graceful drain) every live process, then wait; returns pid -> exit code."""
        live = [c for c in self.started if c.alive()]
        for c in live:
            if c.stopped:
                self.signal(c, signal.SIGCONT)
            self.signal(c, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        codes: dict[int, int | str] = {}
        for c in live:
            try:
                codes[c.pid] = c.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.expect = ""  # a drain that hangs is no exit the schedule asked for
                c.popen.kill()
                c.popen.wait(30)
                codes[c.pid] = "hung"
        return codes

    def reap_all(self) -> None:
        for c in self.started:
            if c.alive():
                try:
                    os.kill(c.pid, signal.SIGCONT)
                    c.popen.kill()
                except ProcessLookupError:
                    pass
            c.popen.wait(30)
