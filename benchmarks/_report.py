"""bench.py's table: every notifyq figure beside the seed floor and the same-schema floor.

Columns: notifyq; the seed floor (the seed's own table and statements, _seed.py) and notifyq /
seed; the same-schema floor (_floor.py, notifyq's table) and notifyq / floor. A ratio is taken
round by round (the two ran minutes apart at most, in alternating order) and shown as median
[min-max]. Targets are issue 15's, against the seed floor.
"""

from __future__ import annotations

import os

HEADER = ("case", "metric", "notifyq median [min-max]", "seed floor", "nq/seed", "same-schema floor",
          "nq/floor", "target", "met")


def fmt(x, digits=None) -> str:
    if x is None:
        return "-"
    if digits is None:
        digits = 0 if abs(x) >= 100 else 2 if abs(x) < 10 else 1
    return f"{x:,.{digits}f}"


def cell(s: dict | None, digits=None) -> str:
    if not s or s.get("median") is None:
        return "-"
    return f"{fmt(s['median'], digits)} [{fmt(s['min'], digits)}-{fmt(s['max'], digits)}]"


def check(value, op: str, target: float) -> str:
    if value is None:
        return "?"
    return "yes" if (value >= target if op == ">=" else value <= target) else "NO"


def mix(reps: list[dict]) -> str:
    """The kinds of statement per job (Com_* counters, median over rounds), most first."""
    per = [r["statements"] for r in reps if r.get("statements")]
    names = {k for p in per for k in p if k.startswith("Com_") and k != "Com_show_status"}
    values = {k[4:]: sorted(p.get(k, 0) for p in per)[len(per) // 2] for k in names}
    shown = sorted(((v, k) for k, v in values.items() if v), reverse=True)
    return " ".join(f"{k} {fmt(v, 3 if v < 0.1 else 2)}" for v, k in shown) or "-"


class Table:
    def __init__(self):
        self.rows: list[tuple] = []
        self.targets: list[dict] = []
        self.notes: list[str] = []

    def note(self, case: str, text: str) -> None:
        """A line under the table: the statement mix, too wide for a cell."""
        self.notes.append(f"  {case}: {text}")

    def add(self, case, metric, nq="", seed="", nq_seed="", floor="", nq_floor="", target="", met=""):
        self.rows.append((case, metric, nq, seed, nq_seed, floor, nq_floor, target, met))

    def target(self, case: str, label: str, value, op: str, limit: float, shown: str) -> str:
        met = check(value, op, limit)
        self.targets.append({"target": f"{case}: {label} {shown}", "value": value, "met": met})
        return met

    def compared(self, case: str, block: dict, side: str, metric: str, label: str, op: str | None = None,
                 limit: float | None = None, digits=None, floor: str | None = "floor") -> None:
        """One metric of `side` beside the seed and (when given) a same-schema floor side."""
        sides, ratios = block["sides"], block["ratios"]
        vs_seed = ratios.get(f"{side}/seed", {}).get(metric)
        vs_floor = ratios.get(f"{side}/{floor}", {}).get(metric) if floor else None
        met = ""
        if op:
            met = self.target(case, label, vs_seed and vs_seed["median"], op, limit, f"nq/seed {op} {limit}")
        self.add(case, label, cell(sides[side][metric], digits), cell(sides["seed"][metric], digits),
                 cell(vs_seed), cell(sides[floor][metric], digits) if floor and floor in sides else "",
                 cell(vs_floor), f"nq/seed {op} {limit}" if op else "", met)

    def render(self) -> str:
        widths = [max(len(str(r[i])) for r in [HEADER, *self.rows]) for i in range(len(HEADER))]
        lines = ["  ".join(h.ljust(w) for h, w in zip(HEADER, widths)), "  ".join("-" * w for w in widths)]
        last_case = None
        for r in self.rows:
            shown = list(r)
            if r[0] == last_case:
                shown[0] = ""
            last_case = r[0]
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(shown, widths)).rstrip())
        if self.notes:
            lines += ["", "statements per job by kind (Com_* counters, median over the rounds):", *self.notes]
        return "\n".join(lines)


def _enqueue(t: Table, res: dict) -> None:
    for key, what, bulk in (("enqueue_single", "put() per job", False),
                            ("enqueue_bulk", "put_many() x100", True)):
        if key not in res:
            continue
        e = res[key]
        seed_what = "seed: 100-row INSERT + COMMIT" if bulk else "seed: INSERT + COMMIT per job"
        for side, mode in (("notifyq_ring", "ring=True, the README's long-lived producer"),
                           ("notifyq", "no ring")):
            case = f"enqueue, {what}, {mode}"
            goal = (">=", 0.8) if bulk else (">=", 0.9) if side == "notifyq_ring" else (None, None)
            t.compared(case, e, side, "jobs_s", f"jobs/s ({seed_what})", *goal)
            t.compared(case, e, side, "cpu_us_per_job", "producer CPU us/job")
            if e["sides"][side].get("server_cpu_us_per_job", {}).get("median") is not None:
                t.compared(case, e, side, "server_cpu_us_per_job", "server CPU us/job (its whole run)")
            t.compared(case, e, side, "statements_per_job", "statements/job (Questions)", digits=2)
            t.note(case, f"notifyq {mix(e['raw'][side])}; seed {mix(e['raw']['seed'])}")
        f = e["ratios"].get("notifyq/floor_signal", {}).get("jobs_s")
        t.add(f"enqueue, {what}, no ring", "jobs/s vs same-schema floor + signal bump",
              floor=cell(e["sides"]["floor_signal"]["jobs_s"]), nq_floor=cell(f))
        if "notifyq_ring_attached" in e["sides"]:
            _attached(t, e, what)


def _attached(t: Table, e: dict, what: str) -> None:
    """The ring with one idle consumer attached, against the seed with one polling consumer."""
    case = f"enqueue, {what}, ring=True, 1 idle consumer attached"
    sides, ratios = e["sides"], e["ratios"]["notifyq_ring_attached/seed_attached"]
    for metric, label, goal in (("jobs_s", "jobs/s (seed: INSERT + COMMIT, 1 consumer polling)", 0.9),
                                ("cpu_us_per_job", "producer CPU us/job", None),
                                ("statements_per_job", "statements/job, the consumer's included", None)):
        met = t.target(case, label, ratios[metric]["median"], ">=", goal, f"nq/seed >= {goal}") if goal else ""
        t.add(case, label, cell(sides["notifyq_ring_attached"][metric], 2 if "statements" in metric else None),
              cell(sides["seed_attached"][metric], 2 if "statements" in metric else None), cell(ratios[metric]),
              target=f"nq/seed >= {goal}" if goal else "", met=met)


def _drain(t: Table, res: dict) -> None:
    if "drain" not in res:
        return
    d = res["drain"]
    case = "drain, 4 consumer processes"
    t.compared(case, d, "notifyq", "jobs_s", "jobs/s first..last handler", ">=", 0.9)
    t.compared(case, d, "notifyq", "jobs_s_with_startup", "jobs/s incl. start-up", ">=", 0.9)
    t.compared(case, d, "notifyq", "cpu_us_per_job_with_startup", "consumer CPU us/job (rusage)", "<=", 1.2)
    t.compared(case, d, "notifyq", "cpu_us_per_job", "consumer CPU us/job first..last handler")
    if d["sides"]["notifyq"]["server_cpu_us_per_job"]["median"] is not None:
        t.compared(case, d, "notifyq", "server_cpu_us_per_job", "server CPU us/job")
    t.compared(case, d, "notifyq", "statements_per_job", "statements/drained job (Questions)", digits=3)
    t.note(case, f"notifyq {mix(d['raw']['notifyq'])}; seed {mix(d['raw']['seed'])}; "
                 f"same-schema floor {mix(d['raw']['floor'])}")
    t.compared(case, d, "notifyq", "first_job_s", "first job after spawn, s (median of the 4)", digits=3)
    two = d["ratios"]["notifyq/floor_two_step"]["jobs_s"]
    t.add(case, "jobs/s vs two-step same-schema floor",
          floor=cell(d["sides"]["floor_two_step"]["jobs_s"]), nq_floor=cell(two))


def _start(t: Table, res: dict) -> None:
    if "start" not in res:
        return
    s = res["start"]
    case = "start: 1 consumer process, a batch waiting"
    first = s["sides"]["notifyq"]["first_job_s"]
    met = t.target(case, "first job", first["median"], "<=", 0.15, "<= 0.15 s")
    t.add(case, "first job handled after spawn, s", cell(first, 3), cell(s["sides"]["seed"]["first_job_s"], 3),
          cell(s["ratios"]["notifyq/seed"]["first_job_s"]), target="<= 0.15 s", met=met)
    t.compared(case, s, "notifyq", "exit_after_last_s", "last handled job to exit, s", floor=None, digits=3)
    t.compared(case, s, "notifyq", "process_cpu_ms", "process CPU, ms", floor=None)
    counts = s.get("instructions")
    if counts:  # one run per side under callgrind: a count, not a time, so no spread to show
        nq, seed = counts["process"]["notifyq"], counts["process"]["seed"]
        t.add(case, "process instructions, millions (callgrind)", fmt(nq / 1e6), fmt(seed / 1e6),
              fmt(nq / seed, 2))
        base = counts["interpreter"]
        t.add(case, "… beyond the bare interpreter's", fmt((nq - base) / 1e6), fmt((seed - base) / 1e6),
              fmt((nq - base) / (seed - base), 2))


def _pickup(t: Table, res: dict) -> None:
    if "pickup" not in res:
        return
    p = res["pickup"]
    seed = p.get("seed")
    labels = {"put_ring": ("put(), ring=True", "from_return", "from put() returning"),
              "put": ("put(), no ring", "from_return", "from put() returning"),
              "produce": ("notifyq produce, line by line", "from_call", "from the line's write")}

    def p50_ratio(s, seed_s):
        return f"{fmt(s['p50_ms'] / seed_s['p50_ms'])} (p50)" if seed_s and seed_s["p50_ms"] else ""

    def three(s):
        return "-" if not s else f"{fmt(s['p50_ms'], 2)} / {fmt(s['p95_ms'], 2)} / {fmt(s['p99_ms'], 2)}"

    for mode, (what, key, since) in labels.items():
        if mode not in p:
            continue
        case = f"pick-up from idle, {what}"
        s = p[mode][key]
        seed_s = seed and (seed["from_return"] if key == "from_return" else seed["from_call"])
        met50 = t.target(case, "p50", s["p50_ms"], "<=", 1.0, "<= 1 ms")
        met99 = t.target(case, "p99", s["p99_ms"], "<=", 5.0, "<= 5 ms")
        t.add(case, f"{since}: p50 / p95 / p99 ms", three(s), three(seed_s), p50_ratio(s, seed_s),
              target="p50 <= 1, p99 <= 5", met=f"{met50}/{met99}")
        if key == "from_return":
            t.add(case, "from the put() call: p50 / p95 / p99 ms", three(p[mode]["from_call"]),
                  three(seed and seed["from_call"]), p50_ratio(p[mode]["from_call"], seed and seed["from_call"]))


def _sessions(t: Table, res: dict) -> None:
    for mix in res.get("sessions", {}).values():
        case = f"sessions: {mix['command']}"
        met = t.target(case, "sessions", mix["peak"], "<=", mix["limit"],
                       f"<= {mix['limit']} (worker threads + queues + 1)")
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(mix["settled_kinds"].items()))
        t.add(case, "peak sessions of the process", str(mix["peak"]),
              f"{mix['worker_threads']} (1 per worker process)", fmt(mix["peak"] / mix["worker_threads"]),
              target=f"<= {mix['limit']}", met=met)
        t.add(case, f"when idle: {mix['settled']} ({kinds})")


def _e2e(t: Table, res: dict) -> None:
    for load, b in res.get("e2e", {}).items():
        case = f"end-to-end at {load} of drain"
        t.add(case, "offered / achieved jobs/s", cell(b["offered_jobs_s"]))
        t.add(case, "", cell(b["achieved_jobs_s"]))
        t.add(case, f"machine CPU busy, cores of {os.cpu_count()}", cell(b.get("cpu_busy_cores"), 2))
        if b.get("server_cores") and b["server_cores"]["median"] is not None:
            t.add(case, "  of which the server", cell(b["server_cores"], 2))
        t.add(case, "max latency during warm-up, ms", cell(b["warmup_max_ms"], 0))
        for m in ("p50_ms", "p95_ms", "p99_ms"):
            t.add(case, f"commit->handler {m[:-3]} ms", cell(b[m], 1))


def _backlog(t: Table, res: dict) -> None:
    if "backlog" not in res:
        return
    base = None
    for size, b in res["backlog"].items():
        case = f"backlog {int(size):,} queued"
        nq = b["notifyq_claim_ms"]
        base = base or nq["median"]
        ratio = fmt(nq["median"] / b["floor_claim_ms"]["median"]) if b["floor_claim_ms"]["median"] else ""
        t.add(case, "claim of 100, ms (median of claims)", cell(nq, 2), floor=cell(b["floor_claim_ms"], 2),
              nq_floor=ratio, target="flat within 2x", met=f"{nq['median'] / base:.2f}x of smallest")
        t.add(case, "claim p95 ms", cell(b["notifyq_claim_p95_ms"], 2), floor=cell(b["floor_claim_p95_ms"], 2))
        t.add(case, "ack of 100, ms", cell(b["notifyq_ack_ms"], 2), floor=cell(b["floor_ack_ms"], 2))
        t.add(case, "index reads per claim", cell(b.get("notifyq_index_reads_per_claim"), 0))
        t.add(case, "drain jobs/s (4 procs)", cell(b["notifyq_drain_jobs_s"]))
    meds = [b["notifyq_claim_ms"]["median"] for b in res["backlog"].values()]
    sizes = list(res["backlog"])
    t.target("backlog", f"claim time flat ({int(sizes[0]):,}..{int(sizes[-1]):,} queued)",
             max(meds) / min(meds), "<=", 2, "within 2x")


def _idle(t: Table, res: dict) -> None:
    if "idle" not in res:
        return
    i = res["idle"]
    rate = i["questions_s"]["median"]
    per_queue = rate / i["queues"] if rate is not None else None
    met = t.target(f"idle, {i['consumers']} consumers, 1 queue", "queries/s per queue", per_queue, "<=", 1,
                   "<= 1")
    t.add(f"idle, {i['consumers']} consumers, 1 queue", "server Questions/s", cell(i["questions_s"], 2),
          target="<= 1 /s per queue", met=met)


def _wakeup(t: Table, res: dict) -> None:
    if "wakeup" not in res:
        return
    w = res["wakeup"]
    case = "pick-up from idle (wakeup.py)"
    if "result" not in w:
        t.add(case, w.get("status") or f"not measured: exit {w.get('exit')}, see the JSON")
        return
    for r in w["result"].get("latency", []):
        t.add(case, f"{r['mode']}, {r['producer']}: p50/p95/p99 ms",
              f"{fmt(r['p50_ms'], 1)} / {fmt(r['p95_ms'], 1)} / {fmt(r['p99_ms'], 1)}")


def report(res: dict) -> tuple[str, list[dict]]:
    t = Table()
    for part in (_enqueue, _drain, _start, _pickup, _sessions, _e2e, _backlog, _idle, _wakeup):
        part(t, res)
    return t.render(), t.targets
