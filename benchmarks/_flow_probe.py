"""The flow benchmark's probe (benchmarks/flow.py --account), installed in each consumer process by
_flow_handlers when NQB_PROBE is set: where a drain's time goes, per claim.

It wraps queries.claim (each claim: its start and end on CLOCK_MONOTONIC, jobs taken, whether it
drained the queue, whether peers' key locks left it jobs, how many keys' rows they held, the
round trips it waited for and the statements it sent), the worker's batch run and idle wait
(their spans), the process's CPU time at each claim's start and end, and the driver's sends (query, send_query) and waits (query, read_query_result,
next_result) per thread. Written once at exit to $NQB_OUT/probe-<pid>.json. Costs a few
microseconds a statement: compare accounted runs with each other, not with plain ones.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time

_claims: list[dict] = []
_spans: list[tuple[str, str, float, float]] = []  # (thread, what, start, end)
_local = threading.local()
_lean: dict = {}
_prof = None
if os.environ.get("NQB_PROFILE"):  # the claims' Python, profiled (cProfile) into that directory
    import cProfile
    _prof = cProfile.Profile()


def _counters() -> dict:
    c = getattr(_local, "c", None)
    if c is None:
        c = _local.c = {"sends": 0, "statements": 0, "wait_s": 0.0}
    return c


def _install() -> None:
    import MySQLdb.connections as conns

    from notifyq.consume import worker
    from notifyq.store import queries

    conn_cls = conns.Connection
    base_query, base_send = conn_cls.query, conn_cls.send_query
    base_read, base_next = conn_cls.read_query_result, conn_cls.next_result

    def statements(q) -> int:
        return (bytes(q) if isinstance(q, (bytes, bytearray)) else str(q).encode()).count(b";\n") + 1

    def query(self, q):
        c = _counters()
        c["sends"] += 1
        c["statements"] += statements(q)
        t = time.monotonic()
        try:
            return base_query(self, q)
        finally:
            c["wait_s"] += time.monotonic() - t

    def send_query(self, q):
        c = _counters()
        c["sends"] += 1
        c["statements"] += statements(q)
        return base_send(self, q)

    def waited(base):
        def call(self, *a):
            c = _counters()
            t = time.monotonic()
            try:
                return base(self, *a)
            finally:
                c["wait_s"] += time.monotonic() - t
        return call

    conn_cls.query, conn_cls.send_query = query, send_query
    conn_cls.read_query_result, conn_cls.next_result = waited(base_read), waited(base_next)

    base_claim = queries.claim

    def claim(session, queue, owner, batch_size, lease_s, as_watcher=False, acks=None, rates=None,
              version=0, flow=None):
        c = _counters()
        before = dict(c)
        t, cpu = time.monotonic(), time.process_time()
        out = None
        if _prof is not None:
            _prof.enable()
        try:
            out = base_claim(session, queue, owner, batch_size, lease_s, as_watcher, acks, rates,
                             version=version, flow=flow)
            return out
        finally:
            if _prof is not None:
                _prof.disable()
            end = time.monotonic()
            last = flow.last if flow is not None else None
            read = flow.read if flow is not None else None
            if flow is not None and getattr(flow, "lean_stats", None) is not None:
                _lean.update(flow.lean_stats)  # (this tree's lean claims: how many decided, why not)
            _claims.append({
                "thread": threading.current_thread().name, "start": t, "end": end,
                "cpu_start": cpu, "cpu_end": time.process_time(),
                "jobs": len(out.jobs) if out is not None else None,
                "drained": out.drained if out is not None else None,
                "watcher": as_watcher, "acks": len(acks.ids) if acks is not None else 0,
                "contended": bool(last.contended) if last is not None else None,
                "granted": len(last.ids) if last is not None else None,
                "skipped_keys": len(read.skipped) if read is not None else None,
                "sends": c["sends"] - before["sends"], "statements": c["statements"] - before["statements"],
                "wait_s": c["wait_s"] - before["wait_s"], "failed": out is None})

    queries.claim = claim

    def spanned(name, base):
        def call(self, *a, **kw):
            t = time.monotonic()
            try:
                return base(self, *a, **kw)
            finally:
                _spans.append((threading.current_thread().name, name, t, time.monotonic()))
        return call

    worker.Worker._run = spanned("run", worker.Worker._run)
    worker.Worker._idle = spanned("idle", worker.Worker._idle)


def _dump() -> None:
    out = os.environ.get("NQB_OUT")
    if out:
        with open(os.path.join(out, f"probe-{os.getpid()}.json"), "w") as f:
            json.dump({"claims": _claims, "spans": _spans, "lean": _lean}, f)
    if _prof is not None:
        _prof.dump_stats(os.path.join(os.environ["NQB_PROFILE"], f"claims-{os.getpid()}.prof"))
    if _lean and os.environ.get("NQB_LEAN_STATS"):
        with open(os.path.join(os.environ["NQB_LEAN_STATS"], f"lean-{os.getpid()}.json"), "w") as f:
            json.dump(_lean, f)


if os.environ.get("NQB_PROBE"):
    _install()
    atexit.register(_dump)
