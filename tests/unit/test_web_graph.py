"""The workflow page's graph layout (notifyq/web/graph.py), alone: bounded whatever the walk
found, the page's job always drawn, rows by level."""

from __future__ import annotations

from notifyq.web import graph


def _member(job: int, level: int, here: bool = False) -> dict:
    return {"id": job, "level": level, "state": "ready", "queue": "q", "here": here}


def test_a_walk_of_500_jobs_and_5000_edges_is_drawn_to_its_bounds_with_the_pages_job_among_them():
    # Given 500 jobs over 5 levels of 100 and each job of a level after 10 of the level before
    members = [_member(j, j // 100, here=(j == 399)) for j in range(500)]
    edges = [(p, c, 0) for c in range(100, 500) for p in range((c // 100 - 1) * 100, (c // 100 - 1) * 100 + 10)]
    assert len(members) == 500 and len(edges) == 4000
    # When it is laid out
    drawn = graph.layout(members, edges)
    # Then at most PER_LEVEL jobs a row and NODES in all are drawn, the page's job (last of its
    # level by id) among them, each row below the one of the level before
    nodes = drawn["nodes"]
    assert len(nodes) <= graph.NODES and len(nodes) == 5 * graph.PER_LEVEL
    assert 399 in {n["id"] for n in nodes}
    rows = {n["level"]: n["y"] for n in nodes}
    assert [rows[level] for level in sorted(rows)] == sorted(rows.values())
    # And only edges between jobs drawn, at most EDGES; what was left out is counted
    at = {n["id"] for n in nodes}
    assert len(drawn["edges"]) <= graph.EDGES
    assert all(e["parent"] in at and e["child"] in at for e in drawn["edges"])
    assert drawn["omitted"] == 500 - len(nodes) and drawn["edges_omitted"] == 4000 - len(drawn["edges"])
    assert [r["omitted"] for r in drawn["rows"]] == [100 - graph.PER_LEVEL] * 5
