"""Templates and what they need: Jinja2 with autoescaping on for every template, so a payload,
an error or a queue name is text wherever it is shown (a `<script>` in a payload is displayed,
never run), and the page's small figures (ages, capped counts, the rate chart as inline SVG)."""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any

from notifyq import errors
from notifyq.ops.status import human_duration

CHART_W, CHART_H = 150, 28  # the rate chart: one pair of bars per minute, newest on the right


@functools.cache
def environment() -> Any:
    try:
        import jinja2  # an extra (notifyq[web]): its absence is one clear line, not an ImportError
    except ImportError:
        raise errors.ConfigError("the status pages need Jinja2: pip install 'notifyq[web]'") from None
    env = jinja2.Environment(loader=jinja2.PackageLoader("notifyq.web", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(age=human_duration, when=when, count=count)
    env.globals.update(chart=chart, history_chart=history_chart)
    return env


def render(name: str, **context: Any) -> bytes:
    return environment().get_template(name).render(**context).encode()


def when(value: Any) -> str:
    """A time as the pages show it: UTC to the second ('-' for none)."""
    if value is None:
        return "-"
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def count(n: int, capped: bool = False, approx: bool = False) -> str:
    return ("≈" if approx else "") + (f"{n:,}+" if capped else f"{n:,}")


def chart(rate: dict[str, list[int]]) -> dict[str, Any]:
    """Bars for the last minutes (index 0 is this minute, drawn rightmost): done up, dead down
    from the midline, each scaled to the busiest minute of either."""
    done, dead = rate["done"], rate["dead"]
    minutes = len(done)
    top = max([1, *done, *dead])
    step = CHART_W / minutes
    mid = CHART_H / 2
    bars = []
    for ago in range(minutes):
        x = round(CHART_W - (ago + 1) * step + 1, 1)
        up = round(done[ago] / top * (mid - 1), 1)
        down = round(dead[ago] / top * (mid - 1), 1)
        bars.append({"x": x, "w": round(step - 2, 1), "done_y": round(mid - up, 1), "done_h": up,
                     "dead_y": mid, "dead_h": down, "ago": ago, "done": done[ago], "dead": dead[ago]})
    return {"w": CHART_W, "h": CHART_H, "mid": mid, "bars": bars, "done": sum(done), "dead": sum(dead),
            "minutes": minutes}


HISTORY_W, HISTORY_H = 720, 90  # the history chart: stacked bars per minute, newest on the right


def history_chart(per_minute: dict[str, list[int]]) -> dict[str, Any]:
    """Stacked bars (done, failed, dead, cancelled from the bottom), one per minute (index 0 is
    this minute, drawn rightmost), scaled to the busiest minute."""
    outcomes = list(per_minute)
    minutes = len(per_minute[outcomes[0]])
    top = max([1, *(sum(per_minute[o][m] for o in outcomes) for m in range(minutes))])
    step = HISTORY_W / minutes
    bars = []
    for ago in range(minutes):
        y = float(HISTORY_H)
        for o in outcomes:
            n = per_minute[o][ago]
            if not n:
                continue
            h = n / top * (HISTORY_H - 2)
            y -= h
            bars.append({"x": round(HISTORY_W - (ago + 1) * step, 1), "w": round(max(step - 0.5, 0.5), 1),
                         "y": round(y, 1), "h": round(h, 1), "outcome": o, "n": n, "ago": ago})
    totals = ", ".join(f"{sum(per_minute[o])} {o}" for o in outcomes)
    return {"w": HISTORY_W, "h": HISTORY_H, "bars": bars, "label": f"last {minutes} minutes: {totals}"}
