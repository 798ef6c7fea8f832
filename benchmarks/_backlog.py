"""Claim time against a standing backlog, for bench.py: 1k to 1M ready jobs, single claims
timed with the backlog topped up after each, then 4 consumers drain a slice of it."""

from __future__ import annotations

import collections
import time

from _stats import median, pct, summary


def top_up(bench, want: int) -> None:
    have = bench.ready_count()
    if have < want:
        bench.fill(want - have)

def backlog(bench) -> dict:
    out = {}
    bench.reset()
    m, batch, k = bench.size["claims_m"], bench.size["batch"], bench.size["consumers"]
    for size in bench.size["backlog"]:
        t0 = time.monotonic()
        top_up(bench, size)
        fill_s = time.monotonic() - t0
        rows = collections.defaultdict(list)
        for _ in range(bench.size["backlog_reps"]):
            for side in ("notifyq", "floor"):
                top_up(bench, size)
                r = bench.child(side, "claims", {"m": m, "batch": batch})
                rows[f"{side}_claim_ms"].append(median(r["claim_s"]) * 1e3)
                rows[f"{side}_claim_p95_ms"].append(pct(r["claim_s"], 95) * 1e3)
                rows[f"{side}_ack_ms"].append(median(r["ack_s"]) * 1e3)
                if "index_reads_per_claim" in r:
                    rows["notifyq_index_reads_per_claim"].append(r["index_reads_per_claim"])
            top_up(bench, size)
            d = min(size, bench.size["backlog_drain"])
            if d == size:  # the whole backlog: drain it with --exit-when-empty
                r = bench.drain_once("notifyq", d, k)
            else:
                r = bench.drain_once("notifyq", d, k, ("--max-jobs", str(d // k)), verify_all=False)
            rows["notifyq_drain_jobs_s"].append(r["jobs_s"])
        out[str(size)] = {"fill_s": fill_s, **{key: summary(v) for key, v in rows.items()}}
    return out
