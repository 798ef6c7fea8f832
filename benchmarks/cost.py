#!/usr/bin/env python3
"""What each option costs a drain: N quick jobs with the defaults, then with one option on at a
time, and the seed floor, in one sitting on one server.

    .venv/bin/python benchmarks/cost.py [--n 20000] [--consumers 4] [--rounds 3] [--only A,B] [--json F]

Every variant is bench.py's drain (K `notifyq consume --exit-when-empty` processes, a no-op
handler, every job checked to run exactly once), with one thing changed: a setting in the
consumers' config file, a flag, the handler, or how the jobs were put (a dedup key, a
priority, a delay now past). Within a round every variant runs once, the order reversed every
other round; a ratio to the defaults is taken within each round and reported as the median
[min-max] over the rounds. Reported per variant: jobs/s from the first to the last handled job,
wall µs per job (1 / that rate), consumer CPU µs per job (the processes' rusage, first to last
job), server CPU µs per job, statements per job (the server's Questions).

"no attempt records" is not an option: it runs the defaults with the ack's attempt record left
out (a bench-only patch applied in the consumer process, _nq_no_records.py), to price what
every ack pays for it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (puts the repository and tests/ on sys.path too)
from bench import QUEUE, Bench, numbers  # noqa: E402

import _seed  # noqa: E402
from _stats import alternate, compare  # noqa: E402


@dataclass(frozen=True)
class Variant:
    """One drain: what differs from the defaults."""
    what: str  # the table's words
    config: dict = field(default_factory=dict)  # [defaults] keys of the consumers' config file
    flags: tuple[str, ...] = ()  # `notifyq consume` flags
    handler: str = "noop"  # _bench_handlers' function
    fill: str = "ready"  # how the jobs were put: ready, priority, due, dedup, task
    processes: int | None = None  # None: --consumers
    default_on: bool = False  # the defaults already have it (the row prices turning it off)


VARIANTS: dict[str, Variant] = {
    "defaults": Variant("defaults (no option on)"),
    "no_records": Variant("attempt records left out (bench-only patch; on in every ack)", default_on=True),
    "batch_target_off": Variant("batch_target_s = 0 (claims of batch_size, no hand-back)",
                                config={"batch_target_s": 0.0}, default_on=True),
    "keep_done": Variant("keep_done = true", config={"keep_done": True}),
    "result_ttl": Variant("result_ttl_s = 3600, the handler returns a small result",
                          config={"result_ttl_s": 3600.0}, handler="returns"),
    "returns": Variant("the handler returns a small result, not kept", handler="returns"),
    "timeout": Variant("timeout_s = 30", config={"timeout_s": 30.0}),
    "dedup": Variant("every job put with a dedup key", fill="dedup"),
    "priority": Variant("jobs put with priorities 0-9", fill="priority"),
    "due": Variant("jobs put with a delay, now due (run_at)", fill="due"),
    "transaction": Variant("handler completes in job.transaction() (empty block)",
                           handler="in_transaction"),
    "per_batch": Variant("--per-batch handler", flags=("--per-batch",), handler="noop_batch"),
    "coroutine": Variant("async def handler, --concurrency 1", handler="noop_async"),
    "concurrency": Variant("async def handler, --concurrency 10", flags=("--concurrency", "10"),
                           handler="noop_async"),
    "tasks": Variant("@notifyq.task (--tasks) instead of --handler", fill="task"),
    "workers": Variant("1 process, --workers 4 (not 4 processes of 1)", flags=("--workers", "4"),
                       processes=1),
}
SEED = "seed"
PAYLOAD = ("CONCAT('{\"user_id\":', seq, ',\"event\":\"signup\",\"email\":\"user', seq, "
           "'@example.com\"}')")
# How each fill's rows differ: (status, priority, run_at, dedup_key) as SQL over `seq`.
FILLS = {
    "ready": ("0", "0", "NOW(6)", "NULL"),
    "priority": ("0", "MOD(seq, 10)", "NOW(6)", "NULL"),
    "due": ("1", "0", "NOW(6) - INTERVAL 1 SECOND - INTERVAL seq MICROSECOND", "NULL"),
    "dedup": ("0", "0", "NOW(6)", "CONCAT('signup-', seq)"),
    "task": ("0", "0", "NOW(6)", "NULL"),
}


class CostBench(Bench):
    """bench.py's drain with the consumers' command, config and handler set per variant."""

    variant: Variant = VARIANTS["defaults"]

    def fill_variant(self, n: int, fill: str) -> None:
        status, priority, run_at, dedup = FILLS[fill]
        for start in range(0, n, bench.FILL_CHUNK):
            self.sql("INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload, dedup_key) "
                     f"SELECT %s, {status}, {priority}, {run_at}, 5, {PAYLOAD}, {dedup} FROM "
                     + numbers(min(n, start + bench.FILL_CHUNK), start + 1), (QUEUE,))
        if fill == "task":  # the task's argument is its own job's id (_bench_tasks.py)
            self.sql("UPDATE nq_job SET payload = CONCAT('{\"task\":\"bench.noop\",\"args\":[', id, ']}') "
                     "WHERE queue = %s", (QUEUE,))
        self.sql("INSERT INTO nq_signal (queue, slot, seq) VALUES (%s, 0, %s) "
                 "ON DUPLICATE KEY UPDATE seq = seq + VALUES(seq)", (QUEUE, n))

    def waiting_ids(self, table: str) -> set[int]:
        if table == _seed.TABLE:
            return super().waiting_ids(table)
        return {r[0] for r in self.sql("SELECT id FROM nq_job WHERE queue = %s AND status IN (0, 1)", (QUEUE,))}

    def unfinished(self, table: str, ids: list[int]) -> int:
        if table == _seed.TABLE:
            return super().unfinished(table, ids)
        return self.scalar("SELECT COUNT(*) FROM nq_job WHERE id IN (%s) AND status <> 3" % ",".join(map(str, ids)))

    def consumer_argv(self, side: str, handler: str, *extra: str) -> list[str]:
        if side == SEED:
            return super().consumer_argv(side, handler, *extra)
        v = self.variant
        argv = super().consumer_argv(side, v.handler, *extra, *v.flags)
        if v.fill == "task":
            at = argv.index("--handler")
            argv[at:at + 2] = ["--tasks", "_bench_tasks"]
        if v is VARIANTS["no_records"]:
            argv[1:3] = [str(HERE / "_nq_no_records.py")]  # in place of -m notifyq
        return argv

    def drain_variant(self, name: str, n: int, k: int) -> dict:
        self.reset()
        if name == SEED:
            self.fill(n, _seed.TABLE)
            return self.drain_once(SEED, n, k)
        v = self.variant = VARIANTS[name]
        self.fill_variant(n, v.fill)
        config = self.workdir / f"{name}.toml"
        config.write_text("[defaults]\n" + "".join(f"{key} = {json.dumps(val)}\n" for key, val in v.config.items()))
        saved = self.env
        self.env = {**saved, "NOTIFYQ_CONFIG": str(config)}
        try:
            result = self.drain_once("notifyq", n, v.processes or k)
        finally:
            self.env = saved
        records = self.scalar("SELECT COUNT(*) FROM nq_attempt")
        if records != (0 if name == "no_records" else n):
            raise RuntimeError(f"{name}: {records} attempt records after {n} jobs")
        return result


METRICS = ("jobs_s", "cpu_us_per_job", "server_cpu_us_per_job", "statements_per_job")


def run(cb: CostBench, names: list[str], n: int, k: int, rounds: int) -> dict:
    sides = ["defaults", *[x for x in names if x != "defaults"], SEED]
    rows = {side: [] for side in sides}
    orders = []
    for rnd in range(rounds):
        orders.append(alternate(list(sides), rnd))
        for side in orders[-1]:
            t = time.monotonic()
            rows[side].append(cb.drain_variant(side, n, k))
            print(f"#   round {rnd + 1} {side}: {rows[side][-1]['jobs_s']:,.0f} jobs/s "
                  f"({time.monotonic() - t:.0f}s)", flush=True)
    return compare(rows, orders, METRICS, [(side, "defaults") for side in sides if side != "defaults"])


def table(res: dict, n: int, k: int) -> str:
    def med(side, metric):
        return res["sides"][side][metric]["median"]

    def ratio(side, metric):
        if side == "defaults":
            return "1"
        r = res["ratios"][f"{side}/defaults"][metric]
        return f"{r['median']:.2f} [{r['min']:.2f}–{r['max']:.2f}]"

    lines = [f"drain of {n:,} quick jobs, {k} consumer processes; medians over {len(res['orders'])} rounds, "
             "ratios to the defaults taken within each round",
             "",
             "| variant | jobs/s | wall µs/job | ratio jobs/s | consumer CPU µs/job | ratio | "
             "server CPU µs/job | statements/job |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for side in res["sides"]:
        what = VARIANTS[side].what if side in VARIANTS else "seed floor (_seed.py), same run"
        jobs_s = med(side, "jobs_s")
        lines.append(f"| {what} | {jobs_s:,.0f} | {1e6 / jobs_s:.1f} | {ratio(side, 'jobs_s')} | "
                     f"{med(side, 'cpu_us_per_job'):.1f} | {ratio(side, 'cpu_us_per_job')} | "
                     f"{med(side, 'server_cpu_us_per_job') or 0:.1f} | {med(side, 'statements_per_job'):.3f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20_000, help="jobs per drain (default 20000)")
    ap.add_argument("--consumers", type=int, default=4, help="consumer processes (default 4)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the order reversed every other one (default 3)")
    ap.add_argument("--only", help=f"comma-separated variants besides the defaults: {','.join(VARIANTS)}")
    ap.add_argument("--json", dest="json_path", help="write the results (every round too) here")
    ap.add_argument("--dsn", help="use this server (root-like user) instead of a private LocalServer")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (children.log, raw records)")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(VARIANTS)
    unknown = set(names) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants: {', '.join(sorted(unknown))}")
    with bench.bench_server(args.dsn, args.keep, "nqcost-") as (workdir, url, server_pid, where):
        size = {**bench.SIZES["full"], "drain_n": args.n, "consumers": args.consumers}
        cb = CostBench(url, "nq_cost", size, workdir, server_pid)
        cb.create()
        cb.compile()
        meta = cb.meta(argv=[sys.argv[0], *argv], server=where)
        started = time.monotonic()
        res = run(cb, names, args.n, args.consumers, args.rounds)
        meta["elapsed_s"] = round(time.monotonic() - started, 1)
        print()
        print(table(res, args.n, args.consumers))
        print(f"\ncommand: {meta['command']}  (rev {meta['notifyq_rev']}, {meta['elapsed_s']} s)")
        if args.json_path:
            Path(args.json_path).write_text(json.dumps({"meta": meta, "drain": res}, indent=2, default=str))
        cb.drop()
        return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
