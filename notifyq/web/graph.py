"""A workflow's graph on its page (/workflow?job=ID): parents above their children, drawn by the
server as inline SVG (no script, nothing fetched: the page's CSP allows neither inline styles
nor other sites, and SVG's presentation attributes and the stylesheet's classes need neither).

Layered: a job's row is its level (workflow.walk: one more than its deepest parent's), and
within a row the jobs are ordered by where their parents were drawn (the mean of their
columns: fewer crossings than id order, in one pass down). Bounded whatever the workflow's
size: at most PER_LEVEL jobs a row and NODES in all, from the levels around the job the page
is about (window: it is always drawn, with its neighbours), and the edges between the jobs
drawn only, at most EDGES; what is left out is counted on a row's "+N more" box and in the
page's sentence under the graph.
"""

from __future__ import annotations

from typing import Any

NODES = 120  # jobs drawn at most (the walk's table lists up to 500)
PER_LEVEL = 12  # jobs drawn a row at most
EDGES = 600  # edges drawn at most (between jobs drawn)
NODE_W, NODE_H = 116, 40  # a job's box
GAP_X, GAP_Y = 20, 54  # between boxes in a row, between rows
PAD = 12
QUEUE_CHARS = 9  # of a job's queue its box shows (the whole name in its tooltip)
EDGE_CLASS = {0: "waiting", 2: "done", 3: "failed"}  # nq_edge.state: what the edge's child knows


def layout(members: list[dict[str, Any]], edges: list[tuple[int, int, int]]) -> dict[str, Any]:
    """members: the walk's (id, level, state, queue, here), in (level, id) order; edges:
    (parent, child, edge state) between them. The boxes and lines to draw, in pixels, the size
    of the picture, and how many jobs and edges were left out."""
    by_level: dict[int, list[dict[str, Any]]] = {}
    for m in members:
        by_level.setdefault(m["level"], []).append(m)
    parents_of: dict[int, list[int]] = {}
    for parent, child, _state in edges:
        parents_of.setdefault(child, []).append(parent)
    column: dict[int, float] = {}  # a drawn job's column, for its children's order
    nodes, more, drawn = [], [], 0
    levels = window(by_level)
    for level in levels:
        row = by_level[level]
        room = min(PER_LEVEL, NODES - drawn)
        # The job the page is about first, then those with parents drawn (by their mean
        # column), then the rest by id: what is kept is what connects to what is drawn
        row = sorted(row, key=lambda m: (not m["here"], _mean(column, parents_of.get(m["id"], [])), m["id"]))
        kept = sorted(row[:room], key=lambda m: (_mean(column, parents_of.get(m["id"], [])), m["id"]))
        for i, m in enumerate(kept):
            column[m["id"]] = i
            queue = m["queue"] or ""
            label = queue if len(queue) <= QUEUE_CHARS else queue[:QUEUE_CHARS - 1] + "…"
            nodes.append({**m, "x": PAD + i * (NODE_W + GAP_X), "y": PAD + len(more) * (NODE_H + GAP_Y),
                          "row": len(more), "queue_label": label})
        drawn += len(kept)
        more.append((level, len(row) - len(kept), len(kept)))
    at = {n["id"]: n for n in nodes}
    lines, edges_left = [], 0
    for parent, child, state in edges:
        if parent in at and child in at and len(lines) < EDGES:
            p, c = at[parent], at[child]
            x1, y1 = p["x"] + NODE_W / 2, p["y"] + NODE_H
            x2, y2 = c["x"] + NODE_W / 2, c["y"]
            bend = (y2 - y1) / 2  # a curve leaving the parent downwards and entering the child from above
            d = f"M{x1:.0f},{y1:.0f} C{x1:.0f},{y1 + bend:.0f} {x2:.0f},{y2 - bend:.0f} {x2:.0f},{y2 - 3:.0f}"
            lines.append({"d": d,
                          "state": EDGE_CLASS.get(state, "waiting"), "parent": parent, "child": child})
        else:
            edges_left += 1
    rows = [{"level": level, "omitted": omitted, "x": PAD + kept * (NODE_W + GAP_X), "y": PAD + i * (NODE_H + GAP_Y)}
            for i, (level, omitted, kept) in enumerate(more)]
    widest = max([r["x"] + (NODE_W if r["omitted"] else 0) for r in rows], default=PAD)
    return {"nodes": nodes, "edges": lines, "rows": [r for r in rows if r["omitted"]],
            "width": max(widest, max((n["x"] + NODE_W for n in nodes), default=0)) + PAD,
            "height": PAD + len(more) * (NODE_H + GAP_Y) - GAP_Y + PAD,
            "node_w": NODE_W, "node_h": NODE_H, "shown": len(nodes), "of": len(members),
            "omitted": len(members) - len(nodes), "levels_omitted": len(by_level) - len(more),
            "levels_above": sum(1 for level in by_level if levels and level < levels[0]),
            "levels_below": sum(1 for level in by_level if levels and level > levels[-1]),
            "edges_omitted": edges_left, "caps": {"nodes": NODES, "per_level": PER_LEVEL, "edges": EDGES}}


def window(by_level: dict[int, list[dict[str, Any]]]) -> list[int]:
    """The levels drawn: consecutive ones around the level of the job the page is about (from
    the first level when it is not among them), as many as NODES allows at PER_LEVEL a row,
    one more above, then one more below, in turn: a job deep in a long chain is drawn with its
    parents and children, not left out past the first NODES levels."""
    order = sorted(by_level)
    if not order:
        return []
    here = next((i for i, level in enumerate(order) if any(m["here"] for m in by_level[level])), 0)
    lo, hi = here, here
    cost = min(PER_LEVEL, len(by_level[order[here]]))
    while True:
        grew = False
        for step in (-1, 1):
            i = lo - 1 if step < 0 else hi + 1
            if 0 <= i < len(order):
                row = min(PER_LEVEL, len(by_level[order[i]]))
                if cost + row <= NODES:
                    cost += row
                    lo, hi = min(lo, i), max(hi, i)
                    grew = True
        if not grew:
            break
    return order[lo:hi + 1]


def _mean(column: dict[int, float], parents: list[int]) -> float:
    """The mean column of the parents drawn; none drawn: after every one that has some."""
    drawn = [column[p] for p in parents if p in column]
    return sum(drawn) / len(drawn) if drawn else float(PER_LEVEL)
