"""Small statistics for the benchmark: medians, percentiles, and side-by-side rounds."""

from __future__ import annotations

import statistics


def median(xs):
    return statistics.median(xs) if xs else None


def pct(xs, p):
    """Nearest-rank percentile, p in 0..100."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * len(s) + 0.5)) - 1))]


def summary(xs):
    xs = [x for x in xs if x is not None]
    return {"median": median(xs), "min": min(xs) if xs else None, "max": max(xs) if xs else None,
            "reps": xs}


def alternate(sides: list[str], rnd: int) -> list[str]:
    """The order of the sides in round `rnd`: reversed every other round, so a machine that
    drifts over minutes favours no side."""
    return sides if rnd % 2 == 0 else sides[::-1]


def compare(rows: dict[str, list[dict]], orders: list[list[str]], metrics, pairs) -> dict:
    """Per side and metric, median [min-max] over rounds; per (a, b) pair, the same of a / b
    taken round by round (both measured within minutes of each other)."""
    out = {"raw": rows, "orders": orders, "sides": {}, "ratios": {}}
    for side, reps in rows.items():
        out["sides"][side] = {m: summary([r.get(m) for r in reps]) for m in metrics}
    for a, b in pairs:
        out["ratios"][f"{a}/{b}"] = {
            m: summary([x[m] / y[m] for x, y in zip(rows[a], rows[b])
                        if x.get(m) is not None and y.get(m)]) for m in metrics}
    return out
