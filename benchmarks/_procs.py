"""CPU of the benchmark's processes: a child's own rusage, the server's, the whole machine's."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def wait_rusage(proc: subprocess.Popen, timeout: float):
    """Wait for a child and return its resource usage (user+sys CPU of that process alone)."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage
        if time.monotonic() >= deadline:
            proc.kill()
            raise RuntimeError(f"child {proc.args!r} did not finish within {timeout:.0f}s")
        time.sleep(0.005)


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat (idle and iowait are idle)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def cpu_of(usage) -> float:
    return usage.ru_utime + usage.ru_stime


def proc_cpu_s(pid: int | None) -> float | None:
    """utime+stime of another process (the server), from /proc."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_idle(pids: list[int], window_s: float = 0.5, busy_s: float = 0.02, timeout_s: float = 90) -> None:
    """Until no process of `pids` used more than busy_s of CPU in window_s: started up (imports
    done, connected) and now waiting. Idle consumers poll, so idle is little CPU, not none."""
    deadline = time.monotonic() + timeout_s
    before = [proc_cpu_s(p) for p in pids]
    while time.monotonic() < deadline:
        time.sleep(window_s)
        after = [proc_cpu_s(p) for p in pids]
        if None in after:
            raise RuntimeError("a process exited while waiting for it to go idle")
        if all(a - b <= busy_s for a, b in zip(after, before)):
            return
        before = after
    raise RuntimeError(f"processes {pids} still busy after {timeout_s:.0f} s")


def stop_all(procs: list[subprocess.Popen], sig: int = signal.SIGTERM, timeout_s: float = 30) -> None:
    """Signal every child still running, then wait for each (killed past timeout_s)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
    for p in procs:
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
