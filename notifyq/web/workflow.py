"""The console's workflow views (docs/workflows.md): a job's place in its workflow, on its page
(its parents' progress: done, dead, cancelled, pending; its parents and children with their
states), and the workflow around a job (/workflow?job=ID): the jobs its edges reach, both ways,
level by level from its first jobs, each with its state, and the totals by state, and its
graph (graph.py).

Bounded whatever the workflow's size (admin_queries.WEB_*): a job's page lists 50 parents and
50 children and counts the first 10,000 of its parents (a batch of 100,000 members: its
callback's progress says "10,000+"); the walk stops at 500 jobs or 5,000 edges read, and says so.
"""

from __future__ import annotations

from typing import Any

from notifyq.jobs import STATUS_NAMES, Status
from notifyq.store import admin_queries, workflows
from notifyq.store.db import Session
from notifyq.web import graph

EDGE_WAITING, EDGE_DONE, EDGE_FAILED = 0, 2, 3  # nq_edge.state: waiting, and once its parent's end is settled
AFTER_MODES = {0: "every parent done", 1: "every parent ended (run anyway)",
               2: "every parent ended, one failed (on_dead)"}
SHOWN_PARENTS = 5  # parent ids a member's row of the walk names


def _state(status: int | None, edge_state: int, as_parent: bool) -> str:
    """A member's state by its row, or, its row gone, by what its edge says (as a parent:
    workflows.parent_state); a child whose row is gone was done (and not kept), or purged."""
    if as_parent or status is not None:
        return workflows.parent_state(status, edge_state)
    return "gone"


def progress(rows: list[tuple]) -> dict[str, Any]:
    """(edge state, parent status, n) rows -> the parents counted as they are now, as the API's
    Producer.progress counts them (workflows.parents_now), and whether the read reached its cap."""
    out: dict[str, Any] = workflows.parents_now(rows)
    out["capped"] = out["total"] >= admin_queries.WEB_PROGRESS_CAP
    return out


def job_graph(session: Session, job_id: int, waiting: bool) -> dict[str, Any] | None:
    """A job's parents' progress, its parents and children (50 each) with their states; None for
    a job outside any workflow. `waiting`: the job waits for its parents now (status waiting).

    Who waits for whom is read from both ends as they are now, never from the edge alone: an
    edge that waits again (its parent retried after a cancel) does not make a child that was
    retried to run without that parent wait for it; it runs, or ran, without it."""
    g = admin_queries.web_job_graph(session, job_id)
    if not (g["parents"] or g["children"]):
        return None
    listed = admin_queries.WEB_GRAPH_LIST

    def members(rows: list[tuple], as_parent: bool) -> list[dict[str, Any]]:
        return [{"id": int(i), "queue": q, "state": _state(s, e, as_parent),
                 # a parent awaited by this job; a child that awaits this job
                 "awaits": e == EDGE_WAITING and (waiting if as_parent else s == Status.WAITING)}
                for i, e, q, s in rows]

    return {"parents": members(g["parents"], True), "children": members(g["children"], False),
            "waiting": waiting,
            "more_parents": len(g["parents"]) >= listed, "more_children": len(g["children"]) >= listed,
            "progress": progress(g["progress"]) if g["parents"] else None, "cap": admin_queries.WEB_PROGRESS_CAP}


def walk(session: Session, job_id: int) -> dict[str, Any]:
    """The workflow around `job_id`: the jobs its edges reach both ways, at most
    WEB_WORKFLOW_JOBS, reading at most WEB_WORKFLOW_EDGES edges; by level (a job's level: 1 +
    its deepest parent's)."""
    max_jobs, max_edges = admin_queries.WEB_WORKFLOW_JOBS, admin_queries.WEB_WORKFLOW_EDGES
    seen, frontier = {job_id}, [job_id]
    edges: dict[tuple[int, int], int] = {}
    budget, truncated = max_edges, False
    while frontier and budget > 0:
        # A step reads no more edges each way than twice the jobs the page may show: a batch
        # of 100,000 members fills the page from its first 1,000 edges
        found = admin_queries.web_workflow_edges(session, frontier, min(budget, 2 * max_jobs))
        budget -= len(found)
        truncated |= budget <= 0 or len(found) >= 2 * max_jobs
        after = []
        for parent, child, state in found:
            for end in (parent, child):
                if end not in seen:
                    if len(seen) >= max_jobs:
                        truncated = True
                        continue
                    seen.add(end)
                    after.append(end)
            if parent in seen and child in seen:
                edges[(parent, child)] = state
        frontier = after
    rows = {int(r[0]): r for r in admin_queries.web_workflow_jobs(session, sorted(seen))}
    parents: dict[int, list[int]] = {j: [] for j in seen}
    settled: dict[int, int] = {}  # a parent's edge state that says most of how it ended
    for (parent, child), state in sorted(edges.items()):
        parents[child].append(parent)
        settled[parent] = max(settled.get(parent, 0), state)
    level = _levels(parents)
    members, totals = [], {}
    for j in sorted(seen, key=lambda j: (level[j], j)):
        row = rows.get(j) or (None,) * 8  # its row gone: what its edges say
        _id, queue, status, attempts, max_attempts, error, waits_on, mode = row
        state = _state(status, settled.get(j, 0), j in settled)
        totals[state] = totals.get(state, 0) + 1
        members.append({"id": j, "level": level[j], "state": state, "queue": queue, "attempts": attempts,
                        "max_attempts": max_attempts, "error": error,
                        "waits_on": waits_on if status == Status.WAITING else None,
                        "mode": AFTER_MODES.get(mode) if status is not None and parents[j] else None,
                        "parents": parents[j][:SHOWN_PARENTS], "more_parents": max(0, len(parents[j]) - SHOWN_PARENTS),
                        "here": j == job_id})
    drawn = graph.layout(members, [(p, c, s) for (p, c), s in sorted(edges.items())])
    return {"job": job_id, "members": members, "totals": dict(sorted(totals.items())), "truncated": truncated,
            "edges": len(edges), "max_jobs": max_jobs, "max_edges": max_edges, "graph": drawn}


def _levels(parents: dict[int, list[int]]) -> dict[int, int]:
    """Each job's level among these: 0 with no parent here, else one more than its deepest
    parent's (a workflow has no cycle: refused at its put; a bound on the passes all the same)."""
    level = {j: 0 for j in parents}
    for _ in range(len(parents)):
        changed = False
        for child, ps in sorted(parents.items()):  # ids grow down a workflow: one pass, mostly
            want = max((level[p] + 1 for p in ps), default=0)
            if want > level[child]:
                level[child], changed = want, True
        if not changed:
            break
    return level
