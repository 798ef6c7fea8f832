#!/usr/bin/env python3
"""What tracing costs put() and a drain, and what its hook costs when it is off: CPU µs per job,
code trees side by side in one sitting on one private server.

    .venv/bin/python benchmarks/otel_cost.py [--n 5000] [--rounds 3] [--tree LABEL=PATH ...] [--json F]

Each --tree is a directory holding a `notifyq` package (a clean `git archive` of another commit,
say); this checkout is always one, "this". Per round, each tree runs untraced, and this checkout
traced too (notifyq.contrib.otel and the SDK, spans to an exporter that drops them), each in a
process of its own (_otel_cost_child.py), the order reversed every other round. Reported: the
median [min-max] over the rounds of the producer's CPU µs per put() and per job of put_many(100),
and of an in-process drain (testing.drain, batches of 100, a no-op handler), the drain's wall µs
per job, and whether anything of OpenTelemetry was loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from notifyq.config import DSN  # noqa: E402
from notifyq.run.localserver import LocalServer  # noqa: E402
from notifyq.store import schema  # noqa: E402

FIGURES = ("put_cpu_us", "put_many_cpu_us", "drain_cpu_us", "drain_wall_us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", action="append", default=[], help="LABEL=PATH of another notifyq tree")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    trees = [("this", str(REPO))] + [tuple(t.split("=", 1)) for t in args.tree]
    variants = [(label, path, "untraced") for label, path in trees] + [("this", str(REPO), "traced")]
    with tempfile.TemporaryDirectory(prefix="nq-otel-cost-") as tmp:
        server = LocalServer(Path(tmp) / "server", redo_log_mb=96)
        server.start()
        try:
            dsn = DSN.parse(server.dsn + "nq_otel_cost")
            schema.init(dsn)
            results: dict[str, list[dict]] = {}
            for r in range(args.rounds):
                order = variants if r % 2 == 0 else variants[::-1]
                for label, path, mode in order:
                    env = {**os.environ, "PYTHONPATH": path, "NOTIFYQ_CONFIG": "/dev/null",
                           "NOTIFYQ_DSN": server.dsn + "nq_otel_cost"}
                    done = subprocess.run([sys.executable, str(HERE / "_otel_cost_child.py"), str(args.n), mode,
                                           f"q{r}"], env=env, capture_output=True, text=True, timeout=1800)
                    if done.returncode != 0:
                        sys.exit(f"{label} {mode}: {done.stderr.strip()[-2000:]}")
                    results.setdefault(f"{label} {mode}", []).append(json.loads(done.stdout))
        finally:
            server.cleanup()
    print(f"\nCPU µs per job, median [min-max] of {args.rounds} rounds, n={args.n}, load {os.getloadavg()[0]:.1f}\n")
    print("| variant | " + " | ".join(FIGURES) + " | opentelemetry loaded |")
    print("|---|" + "---:|" * len(FIGURES) + "---|")
    summary = {}
    for name, runs in results.items():
        cells = {}
        for f in FIGURES:
            values = [run[f] for run in runs]
            cells[f] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        loaded = any(run["opentelemetry_loaded"] for run in runs)
        summary[name] = {**cells, "opentelemetry_loaded": loaded}
        print(f"| {name} | " + " | ".join(f"{c['median']:.1f} [{c['min']:.1f}-{c['max']:.1f}]" for c in cells.values())
              + f" | {'yes' if loaded else 'no'} |")
    doc = {"n": args.n, "rounds": args.rounds, "results": summary, "raw": results}
    print(json.dumps(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
