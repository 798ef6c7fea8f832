#!/usr/bin/env python3
"""What a batch's progress costs with a huge batch: `Producer.progress` (and `notifyq jobs show`,
which runs the same statement, job_progress) against the reads a cheaper count would make.

    .venv/bin/python benchmarks/progress.py [--members 99999] [--calls 7] [--covering-index] [--json out.json]

A private MariaDB/MySQL server (LocalServer in a temp dir). One `wf.batch` of --members jobs
(the largest a put takes is 100,000 edges) with its callback, put once; then timed, --calls
times each, the reads taking turns (ms: median and max, warm), in three states of the batch
(set by statements on the server, not by a drain): every member pending (just put), every
member done and kept (keep_done: its row there), every member done and deleted (its row gone,
its edge counted done). The reads:

- progress: `Producer.progress(callback)` end to end (job_progress: each parent's edge on the
  child index, then its row by primary key: exact, a parent counted as it is now);
- edges by state: the edges alone counted by state (what the statement was before parents were
  read by their rows; not the same answer once a done parent kept is retried);
- edges counted: the child index's entries counted, index-only (a lower bound for any exact count
  that walks the edges);
- console (capped): the job page's count (web_job_progress), its first 10,000 parents.

--covering-index also adds KEY (child_id, state) to nq_edge and times job_progress on it (the
edge's state read from the index instead of its row). Prints a table and the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import MySQLdb  # noqa: E402

import notifyq  # noqa: E402
from notifyq import config as config_mod  # noqa: E402
from notifyq.produce.producer import Producer  # noqa: E402
from notifyq.run.localserver import LocalServer  # noqa: E402
from notifyq.store import admin_queries, schema  # noqa: E402
from notifyq.store.sql import QUERIES as Q  # noqa: E402

EDGES_BY_STATE = "SELECT state, COUNT(*) FROM nq_edge FORCE INDEX (ix_child) WHERE child_id = %(id)s GROUP BY state"
EDGES_COUNTED = "SELECT COUNT(*) FROM nq_edge FORCE INDEX (ix_child) WHERE child_id = %(id)s"
COVERING = Q["job_progress"].replace("FORCE INDEX (ix_child)", "FORCE INDEX (ix_child_state)")


def timed(reads: dict, calls: int) -> dict:
    """Each read `calls` times, the reads taking turns (a loaded machine drifts: each read sees
    the same drift), after one warm call each: {name: {median_ms, max_ms}}."""
    times: dict[str, list[float]] = {name: [] for name in reads}
    for read in reads.values():
        read()
    for _ in range(calls):
        for name, read in reads.items():
            t0 = time.perf_counter()
            read()
            times[name].append((time.perf_counter() - t0) * 1000)
    return {name: {"median_ms": statistics.median(t), "max_ms": max(t)} for name, t in times.items()}


def purged(cur, deadline_s: float = 120) -> float:
    """Wait for InnoDB's purge to catch up with the state change (its 100,000 row versions would
    otherwise be walked by every read of the rows): the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        cur.execute("SHOW ENGINE INNODB STATUS")
        status = cur.fetchone()[2]
        history = int(status.split("History list length")[1].split()[0])
        if history < 100:
            break
        time.sleep(0.2)  # (a benchmark's wait for the server's background work, not a test)
    return time.monotonic() - t0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=99_999)
    ap.add_argument("--calls", type=int, default=7)
    ap.add_argument("--covering-index", action="store_true")
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args(argv)
    out: dict = {"members": a.members, "calls": a.calls, "states": {}}
    with tempfile.TemporaryDirectory(prefix="nq-progress-bench-") as tmp:
        server = LocalServer(Path(tmp) / "server", redo_log_mb=96)
        server.start()
        try:
            dsn = config_mod.DSN.parse(server.dsn + "nq_progress")
            schema.init(dsn)
            admin = MySQLdb.connect(**dsn.connect_args(), autocommit=True)
            cur = admin.cursor()
            cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"}, overrides={"dsn": server.dsn + "nq_progress"})
            with Producer("bench", cfg) as producer:
                wf = notifyq.Workflow()
                members = [wf.add("bench", {"i": i}) for i in range(a.members)]
                wf.batch(members, on_success=("bench", {"callback": True}))
                t0 = time.perf_counter()
                producer.put_workflow(wf)
                out["put_s"] = time.perf_counter() - t0
                cur.execute("SELECT child_id FROM nq_edge LIMIT 1")
                callback = int(cur.fetchone()[0])

                def statement(sql: str, params: dict):
                    def run():
                        cur.execute(sql, params)
                        return cur.fetchall()
                    return run

                reads = {
                    "progress": lambda: producer.progress(callback),
                    "edges by state": statement(EDGES_BY_STATE, {"id": callback}),
                    "edges counted": statement(EDGES_COUNTED, {"id": callback}),
                    "console (capped)": statement(Q["web_job_progress"],
                                                  {"id": callback, "cap": admin_queries.WEB_PROGRESS_CAP}),
                }
                if a.covering_index:
                    cur.execute("ALTER TABLE nq_edge ADD KEY ix_child_state (child_id, state)")
                    reads["progress, covering index"] = statement(COVERING, {"id": callback})
                for state, change in (("pending", None),
                                      ("done, kept", ("UPDATE nq_job SET status = 3 WHERE id <> %(id)s",
                                                      "UPDATE nq_edge SET state = 2")),
                                      ("done, deleted", ("DELETE FROM nq_job WHERE id <> %(id)s",))):
                    for sql in change or ():
                        cur.execute(sql, {"id": callback})
                    out.setdefault("purge_wait_s", {})[state] = purged(cur)
                    figures = timed(reads, a.calls)
                    figures["answer"] = producer.progress(callback)
                    out["states"][state] = figures
        finally:
            server.stop()
            server.cleanup()
    names = [n for n in next(iter(out["states"].values())) if n != "answer"]
    print(f"progress of a batch of {a.members:,} members (ms, median / max of {a.calls} warm calls)")
    print(f"{'read':<28}" + "".join(f"{s:>22}" for s in out["states"]))
    for name in names:
        print(f"{name:<28}" + "".join(f"{f[name]['median_ms']:>13.1f} / {f[name]['max_ms']:<6.1f}"
                                      for f in out["states"].values()))
    for state, f in out["states"].items():
        print(f"answer, {state}: {f['answer']}")
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:
        Path(a.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
