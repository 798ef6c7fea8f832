"""Pick-up from idle, for bench.py: from a job's enqueue to its handler's first line.

Idle consumer processes (one worker each) run _bench_handlers.announce, which reports the
payload's tag and its CLOCK_MONOTONIC start time over a datagram socket; the enqueue side
stamps the same clock. Between jobs the fleet sits idle for a random gap, so every job is
picked up from idle. Modes:

  put_ring  Producer(ring=True) in this process: the README's long-lived producer
  put       Producer() in this process, no ring and wakeup.instant_wake = false: the watcher's
            backoff poll finds the job
  produce   a long-running `notifyq produce` subprocess fed one JSON line at a time on its
            stdin; latency from the line's write (its batch wait and COMMIT included)
  seed      the seed floor: INSERT + COMMIT here, `_seed.py serve` consumers polling at 0.1 s

For put and the seed, latency is given both from the call (what the caller waits for plus the
rest) and from the call's return (its COMMIT done): the second is the wake-up path alone.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import _seed
from _procs import wait_idle
from _stats import pct

MODES = ("put_ring", "put", "produce", "seed")
RECV_TIMEOUT_S = 10.0  # a job's pick-up; the cap of the backoff poll is 1 s
START_TIMEOUT_S = 90.0  # the first job: K consumer processes starting on a busy machine


def _stats(values_s: list[float]) -> dict:
    ms = [v * 1e3 for v in values_s]
    return {"n": len(ms), "p50_ms": pct(ms, 50), "p95_ms": pct(ms, 95), "p99_ms": pct(ms, 99),
            "max_ms": max(ms) if ms else None}


class Receiver:
    """The benchmark's end of the handlers' datagram socket."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)

    def started(self, tag: int, timeout_s: float = RECV_TIMEOUT_S) -> float:
        """The handler start time of the job tagged `tag` (reports of earlier tags are skipped)."""
        self.sock.settimeout(timeout_s)
        while True:
            got, at = self.sock.recv(128).decode().split()
            if int(got) == tag:
                return float(at)

    def close(self) -> None:
        self.sock.close()
        os.unlink(self.path)


class Fleet:
    """K idle consumer processes of one side, announcing their handler starts."""

    def __init__(self, bench, side: str, k: int, sock: str):
        self.bench = bench
        self.procs = [bench.spawn(bench.consumer_argv(side, "announce"), env={"NQB_SOCK": sock})
                      for _ in range(k)]

    def check(self) -> None:
        dead = [p.returncode for p in self.procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"pick-up consumers exited with {dead}{self.bench.log_tail()}")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _put_sender(bench, ring: bool):
    from notifyq import config as config_mod
    from notifyq.produce.producer import Producer

    # Without the ring, the poll is what is measured: no instant wake (on by default).
    wakeup = {} if ring else {"wakeup": {"instant_wake": False}}
    cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"}, overrides={"dsn": bench.url, **wakeup})
    producer = Producer(bench.queue, cfg, ring=ring)

    def send(tag: int) -> tuple[float, float]:
        t0 = time.monotonic()
        producer.put({"n": tag})
        return t0, time.monotonic()

    return send, producer.close


def _seed_sender(bench):
    conn, cur = _seed.connect(bench.conn_args)
    sql = _seed.INSERT + _seed.INSERT_ROW

    def send(tag: int) -> tuple[float, float]:
        t0 = time.monotonic()
        cur.execute(sql, (bench.queue, json.dumps({"n": tag})))
        conn.commit()
        return t0, time.monotonic()

    return send, conn.close


def _produce_sender(bench):
    """A `notifyq produce` that lives for the whole run; each line is written whole, at once."""
    proc = bench.spawn([sys.executable, "-m", "notifyq", "produce", "-q", bench.queue], stdin=subprocess.PIPE)
    fd = proc.stdin.fileno()

    def send(tag: int) -> tuple[float, None]:
        line = (json.dumps({"n": tag}) + "\n").encode()
        t0 = time.monotonic()
        os.write(fd, line)
        return t0, None

    def close() -> None:
        proc.stdin.close()  # EOF: produce commits what it has and exits
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    return send, close


def run_mode(bench, mode: str, rx: Receiver, rounds: int, gap_s: tuple[float, float], k: int,
             settle_s: float, seed: int) -> dict:
    bench.reset()
    fleet = Fleet(bench, "seed" if mode == "seed" else "notifyq", k, rx.path)
    if mode == "seed":
        send, close = _seed_sender(bench)
    elif mode == "produce":
        send, close = _produce_sender(bench)
    else:
        send, close = _put_sender(bench, ring=mode == "put_ring")
    rng = random.Random(seed)
    from_call, from_return = [], []
    try:
        send(-1)  # warm-up: a consumer is up, the producer connected (and, ringing, armed)
        rx.started(-1, START_TIMEOUT_S)
        wait_idle([p.pid for p in fleet.procs], timeout_s=START_TIMEOUT_S)  # all started, all waiting
        time.sleep(settle_s)  # and the watcher's backoff reaches its cap, as after a quiet spell
        fleet.check()
        for tag in range(rounds):
            time.sleep(rng.uniform(*gap_s))
            t_call, t_return = send(tag)
            started = rx.started(tag)
            from_call.append(started - t_call)
            if t_return is not None:
                from_return.append(started - t_return)
        fleet.check()
    finally:
        close()
        fleet.stop()
    return {"mode": mode, "consumers": k, "rounds": rounds, "gap_s": list(gap_s),
            "from_call": _stats(from_call), "from_return": _stats(from_return) if from_return else None}


def run(bench, rounds: int, gap_s: tuple[float, float], k: int, settle_s: float) -> dict:
    rx = Receiver(bench.workdir / "pickup.sock")
    try:
        return {mode: run_mode(bench, mode, rx, rounds, gap_s, k, settle_s, seed=i)
                for i, mode in enumerate(MODES)}
    finally:
        rx.close()
