"""Database sessions per consumer process, for bench.py, counted from the server's PROCESSLIST.

One `notifyq consume` process at a time runs as its own database user (given the runtime
grants `notifyq init --print-grants` prints), so every session of that user on the server is
one of that process's. The count is sampled while the process starts and then sits idle; the
peak and the last sample's make-up (idle, waiting in GET_LOCK, in SLEEP, other) are reported.
The seed runs one session per worker process, by construction.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.parse

from notifyq.store import schema

USER = "nqb_sessions"
MIXES = ((("bench",), 1), (("bench",), 4), (("a", "b", "c"), 4))
SAMPLE_S = 0.05
SESSIONS = ("SELECT COMMAND, COALESCE(INFO, '') FROM information_schema.PROCESSLIST "
            "WHERE USER = %s")


def _kind(command: str, info: str) -> str:
    """What a session is doing. The watcher's poll names both SLEEP and GET_LOCK (it waits in
    one or the other), so it is told apart first."""
    text = info.upper()
    if "SLEEP(" in text:
        return "watching"
    if "GET_LOCK" in text:
        return "in GET_LOCK"
    return "idle" if command == "Sleep" else "other"


def _user_url(bench) -> str:
    parts = urllib.parse.urlsplit(bench.url)
    netloc = f"{USER}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def create_user(bench) -> None:
    bench.sql(f"DROP USER IF EXISTS '{USER}'@'%'")
    bench.sql(f"CREATE USER '{USER}'@'%'")
    for grant in schema.grants(bench.dsn.database, f"'{USER}'@'%'"):
        bench.sql(grant.rstrip(";"))


def measure(bench, queues: tuple[str, ...], workers: int, settle_s: float) -> dict:
    bench.reset()
    argv = [sys.executable, "-m", "notifyq", "consume", "--handler", "_bench_handlers:noop",
            "--workers", str(workers)]
    for q in queues:
        argv += ["-q", q]
    proc = bench.spawn(argv, env={"NOTIFYQ_DSN": _user_url(bench)})
    peak, last = 0, []
    try:
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"consumer {' '.join(argv[3:])} exited with {proc.returncode}"
                                   f"{bench.log_tail()}")
            last = bench.sql(SESSIONS, (USER,))
            peak = max(peak, len(last))
            time.sleep(SAMPLE_S)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    kinds = {}
    for command, info in last:
        kind = _kind(command, info)
        kinds[kind] = kinds.get(kind, 0) + 1
    threads = workers * len(queues)  # today --workers is per queue
    return {"command": "notifyq consume " + " ".join(f"-q {q}" for q in queues) + f" --workers {workers}",
            "queues": len(queues), "workers": workers, "worker_threads": threads,
            "peak": peak, "settled": len(last), "settled_kinds": kinds,
            "limit": threads + len(queues) + 1}


def run(bench, settle_s: float) -> dict:
    create_user(bench)
    try:
        return {f"{len(q)}q x {w}w": measure(bench, q, w, settle_s) for q, w in MIXES}
    finally:
        bench.sql(f"DROP USER IF EXISTS '{USER}'@'%'")
