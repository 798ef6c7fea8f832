#!/usr/bin/env python3
"""notifyq fault schedule, the long run: real consumers, a real private server, a seeded schedule
of faults, and the history checker's verdict on the delivery contract (issue 13).

    .venv/bin/python benchmarks/fault_schedule.py [--minutes 10] [--jobs 100000] [--seed N]
        [--classes all|ci|sigkill,stall,...|all,-polling] [--consumers N] [--lease 4]
        [--seconds S (instead of --minutes)] [--json out.json] [--keep]
    .venv/bin/python benchmarks/fault_schedule.py --galera [--minutes 5] [--jobs 15000] [--seed N]
        [--consumers 3] [--lease 20] [--node-every 30] [--fast-eviction]

The same seed replays the same schedule (tests/fault/schedule.py lists the fault classes).
Prints a table (jobs, consumers, faults by kind, lost, duplicates by cause, innocent dead, the
longest time a gone consumer's jobs stayed claimed, violations by rule) and one JSON document.
Exit 0 when the checker finds nothing.

--galera runs it on a 3-node Galera cluster through one multi-host DSN (tests/cluster/fault_run.py):
the writer node SIGKILLed and restarted, a node (the writer 60 % of the time) paused and resumed,
by turns every --node-every seconds, and consumers SIGKILLed in between (--classes is ignored).
It adds the failover table (fault -> first job enqueued after it handled, p50/max per kind),
false reclaims and the consumers still running at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for path in (REPO, REPO / "tests", REPO / "tests" / "helpers"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from fault.harness import FaultRun, RunResult  # noqa: E402
from fault.schedule import make_cluster_plan, make_plan, parse_classes  # noqa: E402

# The main deployment's consumer slots. The long run's workload (100,000 jobs in 10 minutes,
# 167 jobs/s, and the due_priority bursts' 40/s) outran eight single-worker consumers: most of a
# job's time on a loaded machine is its claim's and ack's round trips and the CPU it waits for,
# not its handler, so a run that puts more than BUSY_RATE jobs/s gets BUSY_CONSUMERS.
CONSUMERS, BUSY_CONSUMERS, BUSY_RATE = 8, 16, 50.0


def as_json(r: RunResult) -> dict:
    rep = r.report
    return {
        "seed": r.plan.seed, "classes": list(r.plan.classes), "minutes": round(r.plan.duration_s / 60, 2),
        "jobs": rep.jobs, "runs": rep.runs, "consumers": r.plan.consumers,
        "consumer_processes": r.consumers_started, "lease_s": r.plan.lease_s,
        "faults": dict(sorted(r.faults.items())), "lost": rep.lost, "innocent_dead": rep.innocent_dead,
        "dead": rep.dead, "duplicates": dict(sorted(rep.duplicates.items())), "concurrent_runs": rep.concurrent,
        "max_recovery_s": rep.max_recovery_s, "priority_batches_judged": rep.priority_checked,
        "violations": rep.by_rule(), "violation_examples": [str(v) for v in rep.examples()],
        "drained": r.drained, "producer_errors": r.producer_errors, "outcome_unknown": r.outcome_unknown,
        "unexpected_exits": r.unexpected_exits, "wall_s": round(r.wall_s, 1),
        "effect_jobs": rep.effect_jobs, "effect_rows": rep.effect_rows,
        "episodes": r.episode_note,  # which were played, and any play that missed its point
        "ok": rep.ok and r.drained,
    }


def print_table(d: dict) -> None:
    fmt = lambda m: ", ".join(f"{k} {v}" for k, v in m.items()) or "0"  # noqa: E731
    rows = [
        ("seed / classes", f"{d['seed']} / {','.join(d['classes'])}"),
        ("jobs (acknowledged) / handler runs", f"{d['jobs']} / {d['runs']}"),
        ("consumers (slots / processes)", f"{d['consumers']} / {d['consumer_processes']}"),
        ("faults by kind", fmt(d["faults"])),
        ("lost", d["lost"]),
        ("duplicates by cause (extra runs)", fmt(d["duplicates"])),
        ("  of them concurrent", d["concurrent_runs"]),
        ("innocent dead / dead", f"{d['innocent_dead']} / {d['dead']}"),
        ("max recovery of a gone consumer's jobs",
         "-" if d["max_recovery_s"] is None else f"{d['max_recovery_s']:.2f}s"),
        ("fx jobs / effect rows (job.transaction())", f"{d['effect_jobs']} / {d['effect_rows']}"),
        ("violations by rule", fmt(d["violations"])),
        ("drained / wall", f"{d['drained']} / {d['wall_s']}s"),
        ("verdict", "OK" if d["ok"] else "FAILED"),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=None, help="instead of --minutes (replays print it)")
    ap.add_argument("--jobs", type=int, default=None, help="default 100000 (--galera: 15000)")
    ap.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    ap.add_argument("--classes", default="all")
    ap.add_argument("--consumers", type=int, default=None,
                    help=f"default {CONSUMERS}, {BUSY_CONSUMERS} when the workload puts more than "
                         f"{BUSY_RATE} jobs/s (--galera: 3)")
    ap.add_argument("--lease", type=float, default=None, help="the consumers' lease_s: 4 (--galera: 20)")
    ap.add_argument("--fault-every", type=float, default=1.5, help="seconds between timed faults (jittered)")
    ap.add_argument("--json", help="also write the JSON result here")
    ap.add_argument("--galera", action="store_true", help="on a 3-node Galera cluster, with node faults")
    ap.add_argument("--node-every", type=float, default=30.0, help="--galera: seconds between node faults")
    ap.add_argument("--fast-eviction", action="store_true",
                    help="--galera: the test fixture's 2 s suspect timeout instead of Galera's defaults")
    ap.add_argument("--keep", action="store_true",
                    help="keep the work directory (logs, handler records) also when the run passes")
    args = ap.parse_args(argv)
    duration_s = args.seconds if args.seconds is not None else args.minutes * 60
    for name, single, cluster in (("jobs", 100_000, 15_000), ("consumers", None, 3), ("lease", 4.0, 20.0)):
        if getattr(args, name) is None:
            setattr(args, name, cluster if args.galera else single)
    if args.consumers is None:
        args.consumers = BUSY_CONSUMERS if args.jobs / max(duration_s, 1.0) > BUSY_RATE else CONSUMERS
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    workdir = Path(tempfile.mkdtemp(prefix="nq-fault-"))
    keep = True if args.keep else None  # a failure keeps its logs
    if args.galera:
        return run_on_cluster(args, seed, duration_s, workdir, keep)
    plan = make_plan(seed, parse_classes(args.classes), duration_s, args.jobs, args.consumers,
                     args.lease, args.fault_every)
    print(plan.describe(), flush=True)
    result = FaultRun(plan, workdir, keep=keep).run()
    data = as_json(result)
    print_table(data)
    if not data["ok"]:
        print(result.summary())
    elif data["episodes"]:
        print(data["episodes"])
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data))
    return 0 if data["ok"] else 1


def run_on_cluster(args, seed: int, duration_s: float, workdir: Path, keep: bool | None) -> int:
    from cluster.conftest import FAST_EVICTION
    from cluster.fault_run import ClusterFaultRun, failover_summary, verdict

    plan = make_cluster_plan(seed, duration_s, args.jobs, args.consumers, args.lease, args.node_every,
                             max(args.fault_every, 2.0))
    print(plan.describe() + (", fast eviction" if args.fast_eviction else ", Galera's default eviction"),
          flush=True)
    settings = {"provider_options": FAST_EVICTION} if args.fast_eviction else {}
    run = ClusterFaultRun(plan, workdir, keep=keep, **settings)
    result = run.run()
    data = as_json(result)
    failovers = run.failovers(result.history)
    problems = verdict(result)
    data.update(galera=True, eviction="fast" if args.fast_eviction else "Galera defaults", failovers=failovers,
                failover_summary=failover_summary(failovers), false_reclaims=len(result.false_reclaims),
                consumers_running_at_end=result.running_at_end, problems=problems)
    data["ok"] = data["ok"] and not problems
    print_table(data)
    print("| fault | failovers | fault -> first job enqueued after it handled, p50 / max | lost | "
          "duplicates (by cause) | innocent dead | false reclaims | consumers running at the end |")
    print("|---|---|---|---|---|---|---|---|")
    dup = ", ".join(f"{k} {v}" for k, v in sorted(result.report.duplicates.items())) or "0"
    for kind, s in data["failover_summary"].items():
        print(f"| {kind} (writer) | {s['count']} | {s['p50_s']} s / {s['max_s']} s | {result.report.lost} | {dup} | "
              f"{result.report.innocent_dead} | {len(result.false_reclaims)} | "
              f"{result.running_at_end} of {plan.consumers} |")
    for f in failovers:
        print(f"  {f}")
    if not data["ok"]:
        print(result.summary())
        print("\n".join(problems))
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data))
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
