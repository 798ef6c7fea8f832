"""Phase marks for benchmarks/pickup.py: the moments a job passes on its way from the enqueue to
its handler, stamped with CLOCK_MONOTONIC (one clock for every process of the machine) and sent
over a Unix datagram socket ($NQB_MARKS) to the benchmark, which matches them to its jobs.

Installed by wrapping notifyq's own functions in the measured process, so that no code of the
package changes for the benchmark:

  producer side (install_producer)
    commit    a put's COMMIT came back (Pipeline.commit_then_read: the put's COMMIT with its look)
    wake      the wake-up was sent: the bell's ring (bells.ring) or the instant wake's KILL QUERY
              (advisory.kill_query; bells.interrupt in older checkouts; stamped as it goes out)
    read      `notifyq produce` read bytes of its input (LineSource._read)
  consumer side (install_consumer, and the handler `announce`)
    the watch statements' returns since the worker's last claim, the claim's start and end, and
    the handler's first line: one datagram per job, from the handler.
"""

from __future__ import annotations

import os
import socket
import threading
import time

_sock: socket.socket | None = None
_local = threading.local()
_last_claim: tuple[list[float], float, float] | None = None  # a handler on another thread


def send(text: str) -> None:
    global _sock
    if _sock is None:
        _sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    _sock.sendto(text.encode(), os.environ["NQB_MARKS"])


def mark(kind: str, at: float | None = None) -> None:
    send(f"{kind} {os.getpid()} {time.monotonic() if at is None else at:.9f}")


def _wrap(owner, name: str, before: str | None = None, after: str | None = None) -> None:
    """Mark `before` as owner.name is called and `after` as it returns; nothing where an older
    checkout (benchmarks/pickup.py --code) has no such function."""
    original = getattr(owner, name, None)
    if original is None:
        return

    def marked(*a, **kw):
        if before:
            mark(before)
        result = original(*a, **kw)
        if after:
            mark(after)
        return result

    setattr(owner, name, marked)


def install_producer() -> None:
    from notifyq.produce import lines
    from notifyq.store import advisory, bells

    try:
        from notifyq.store.pipeline import Pipeline
    except ImportError:  # older checkouts: the Session's own
        from notifyq.store.db import Session as Pipeline
    _wrap(Pipeline, "commit_then_read", after="commit")
    _wrap(bells, "ring", after="wake")  # sent, its reply not waited for
    _wrap(bells, "ring_if_watched", after="wake")  # wake()'s look and ring in one, not waited for
    _wrap(advisory, "kill_query", before="wake")  # the KILL QUERY goes out
    _wrap(bells, "interrupt", before="wake")  # the same in older checkouts
    read = lines.LineSource._read

    def marked_read(self, timeout):
        chunk = read(self, timeout)
        if chunk:
            mark("read")
        return chunk

    lines.LineSource._read = marked_read


def install_consumer() -> None:
    from notifyq.store import bells, queries

    watch, claim = bells.watch, queries.claim

    def marked_watch(*a, **kw):
        try:
            return watch(*a, **kw)
        finally:
            _watches().append(time.monotonic())

    def marked_claim(*a, **kw):
        global _last_claim
        watches, _local.watches = _watches(), []
        start = time.monotonic()
        result = claim(*a, **kw)
        _local.claim = _last_claim = (watches, start, time.monotonic())
        return result

    bells.watch, queries.claim = marked_watch, marked_claim


def _watches() -> list[float]:
    try:
        return _local.watches
    except AttributeError:
        _local.watches = []
        return _local.watches


def announce(job) -> None:
    """The consumers' handler: "job ID PID handler_start claim_start claim_end TAG watch,watch,..."
    (TAG: the payload's "tag", which the produce path finds its jobs by, else "-")."""
    now = time.monotonic()
    watches, start, end = getattr(_local, "claim", None) or _last_claim or ([], 0.0, 0.0)
    tag = job.payload.get("tag", "-") if isinstance(job.payload, dict) else "-"
    send(f"job {job.id} {os.getpid()} {now:.9f} {start:.9f} {end:.9f} {tag} "
         + ",".join(f"{w:.9f}" for w in watches))
