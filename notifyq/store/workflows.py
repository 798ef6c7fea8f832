"""Workflows in the database: the edges between jobs (nq_edge) and a waiting job's counters.

A child is put waiting (status 6) with an edge from each parent. A parent's end settles its
edges in the transaction that ends it: the ack (queries.Acks, its statements after the ack's),
the completion in the handler's transaction (completion.py), the burial and the cancels
(settle_failed). An edge goes from waiting to marked once, ever (its UPDATE tests the state), and
the child's count of waiting parents is moved only by marked edges, which live only inside that
transaction: a child is released exactly once, whatever is retried or killed when.

What no transaction settled (a KILL QUERY that cut a release short with an OK reply, a job the
reaper buried, a cancel before a job started) is settled by the sweep (settle), which the
reaper pass runs: no child waits forever after its parents ended.
"""

from __future__ import annotations

from typing import Any

from notifyq.jobs import STATUS_NAMES
from notifyq.store import signal
from notifyq.store.driver import Ids, cut_short
from notifyq.store.sql import QUERIES as Q

# after_mode: when a waiting job runs
ALL_DONE = 0  # every parent done (a parent dead or cancelled cancels it)
ALL_ENDED = 1  # every parent ended, whatever the outcome (run anyway; on_complete)
SOME_FAILED = 2  # every parent ended, one at least dead or cancelled (on_dead)

# nq_edge.state
WAITING, DONE, FAILED = 0, 2, 3

def _ids(ids: Any) -> tuple[int, ...]:
    """Ids for `IN %(ids)s` as every driver renders them (a caller's connection too: a workflow
    put or a completion on it), not driver.Ids, which only notifyq's sessions know; an ack's
    own (queries.Acks, a notifyq session) are driver.Ids already, rendered in one step where a
    tuple is escaped id by id (a batch's every ack)."""
    return ids if isinstance(ids, Ids) else tuple(int(i) for i in ids)


SWEEP_LIMIT = 1000  # parents settled per sweep pass (a backlog takes a few passes)
CASCADE_MAX = 10_000  # levels a failure walks down: a bound on a loop over the database


def release_statements(ids: list[int], token: int) -> list[tuple[str, dict[str, Any]]]:
    """The release's first step, for the ack's own query, after the ack and its records: the
    edges of `ids` marked, fenced by those records (this claim's 'done' under `token`). Its row
    count is 0 for jobs with no children (most): only when it is not does the caller run the
    rest (release_rest), before the COMMIT. One statement on every ack, not five: the five cost
    a drain of plain jobs a third of its throughput (benchmarks/HISTORY.md)."""
    return [(Q["edges_mark_done"], {"ids": _ids(ids), "token": token})]


def release_rest(cur, ids: list[int], marked: int) -> list[str]:
    """The rest of the release, once release_statements marked `marked` edges of `ids` (same
    transaction): the children counted down, those with no parent left released, their queues'
    signals bumped, the marks counted. Each step's row count is checked against what it must change (by
    the parents' edges only: a fan-in callback's own 10,000 edges are never read), so a
    statement a KILL QUERY cut short with an OK reply fails the transaction (cut_short: it is
    run again) rather than leave a child counting a parent that ended. Returns the queues of the
    children it released (ready or scheduled now), for the caller to wake their idle consumers
    after its COMMIT (the signal's bump alone is read at a watcher's next poll)."""
    edges = {"ids": _ids(ids)}
    count_down, release, wake, counted = _count_and_release(edges)
    cur.execute(Q["children_to_count"], edges)
    waiting = int(cur.fetchone()[0])
    cur.execute(*count_down)
    if cur.rowcount != waiting:
        raise cut_short(f"release of the children of {len(ids)} jobs: {cur.rowcount} of {waiting} counted down")
    cur.execute(*release)
    queues: list[str] = []
    if cur.rowcount:
        cur.execute(Q["children_released_queues"], edges)
        queues = [str(r[0]) for r in cur.fetchall()]
    cur.execute(Q["children_left_waiting"], edges)
    if cur.fetchone()[0]:
        raise cut_short(f"release of the children of {len(ids)} jobs: a child with no parent left still waits")
    cur.execute(*wake)
    cur.execute(*counted)
    if cur.rowcount != marked:
        raise cut_short(f"release of the children of {len(ids)} jobs: {cur.rowcount} of {marked} edges counted")
    return queues


def _count_and_release(edges: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(Q["children_count_down"], edges),
            (Q["children_release"], edges),
            (Q["children_wake"], {**edges, "slot": signal.slot()}),
            (Q["edges_counted"], edges)]


def _count_and_release_reading(cur, edges: dict[str, Any], released: list[str] | None) -> None:
    """_count_and_release's statements, the queues of the children they made ready added to
    `released` (read while the edges are marked, before they are counted)."""
    count_down, release, wake, counted = _count_and_release(edges)
    cur.execute(*count_down)
    cur.execute(*release)
    if cur.rowcount and released is not None:
        cur.execute(Q["children_released_queues"], edges)
        released += [str(r[0]) for r in cur.fetchall()]
    cur.execute(*wake)
    cur.execute(*counted)


def release_after_completion(cur, job_id: int, token: int) -> list[str]:
    """The release on a cursor in the completion's transaction (job.complete_in on a caller's
    connection: one statement at a time). Returns the released children's queues."""
    [(sql, params)] = release_statements([job_id], token)
    cur.execute(sql, params)
    return release_rest(cur, [job_id], cur.rowcount) if cur.rowcount else []


def settle_done(cur, ids: list[int], released: list[str] | None = None) -> None:
    """Parents known to have ended done (unfenced): their waiting edges released. released:
    given, the queues of the children it made ready are added to it (to wake after the COMMIT)."""
    if not ids:
        return
    cur.execute(Q["edges_mark_done_any"], {"ids": _ids(ids)})
    if cur.rowcount:
        _count_and_release_reading(cur, {"ids": _ids(ids)}, released)


def settle_failed(cur, ids: list[int], why: str, released: list[str] | None = None) -> int:
    """Parents that ended dead or cancelled (`why`: 'dead', 'cancelled'), in the caller's
    transaction: children that need every parent done end cancelled, with the reason, and so on
    down (their own children in turn); children that run anyway count the failure, and run once
    no parent is left. Returns how many jobs it cancelled. released: given, the queues of the
    children it made ready are added to it (for the caller to wake after its COMMIT)."""
    cancelled = 0
    level = list(ids)
    for _ in range(CASCADE_MAX):
        if not level:
            break
        edges = {"ids": _ids(level)}
        cur.execute(Q["edges_mark_failed"], edges)
        if not cur.rowcount:
            break
        cur.execute(Q["children_cancel"], {**edges, "why": why})
        cur.execute(Q["children_cancelled_ids"], edges)
        below = [int(r[0]) for r in cur.fetchall()]
        cur.execute(Q["children_failed_count"], edges)
        _count_and_release_reading(cur, edges, released)
        cancelled += len(below)
        level, why = below, "cancelled"
    return cancelled


def revive(cur, ids: list[int]) -> int:
    """Dead or cancelled parents retried: the children a workflow cancelled because of them (and
    of no other parent) wait again, and their own children in turn; the children still waiting
    (run anyway) wait for them again. Returns how many waited again."""
    revived = 0
    level = list(ids)
    for _ in range(CASCADE_MAX):
        if not level:
            break
        cur.execute(Q["parents_revive"], {"ids": _ids(level)})
        if not cur.rowcount:
            break
        cur.execute(Q["children_recount"], {"ids": _ids(level)})
        cur.execute(Q["children_revivable"], {"ids": _ids(level)})
        below = [int(r[0]) for r in cur.fetchall()]
        if below:
            cur.execute(Q["children_wait_again"], {"ids": _ids(below)})
        revived += len(below)
        level = below
    return revived


# ---------------------------------------------------------------- the put's side

def parents_state(cur, ids: list[int], missing: Any = None) -> dict[int, str]:
    """Each parent's state for a put after it: 'pending', 'done', 'dead' or 'cancelled'. Not
    locked: a parent's end never waits for a put's transaction (a caller's may stay open long);
    a parent that ends before the put commits leaves the new edge waiting, for the sweep to
    settle (parents_read says why). A parent with no row ended as its records say (done, or
    cancelled before it ran); with none it is unknown: missing from the answer. missing: how
    to read the parents `cur` did not see, on another session (ids -> this answer for them):
    a caller's transaction in REPEATABLE READ sees a snapshot, which misses a parent put since
    it began, and a locking read of the records there would lock their gaps against other
    jobs' acks for as long as the caller's transaction lasts."""
    if not ids:
        return {}
    cur.execute(Q["parents_read"], {"ids": _ids(ids)})
    out: dict[int, str] = {}
    for job_id, status in cur.fetchall():
        out[int(job_id)] = {3: "done", 4: "dead", 5: "cancelled"}.get(status, "pending")
    gone = [i for i in ids if i not in out]
    if gone and missing is not None:
        out.update(missing(gone))
    elif gone:
        cur.execute(Q["parents_gone"], {"ids": _ids(gone)})
        out.update((int(job_id), "done" if done else "cancelled") for job_id, done in cur.fetchall())
    return out


def settle_ended(cur, ids: list[int]) -> None:
    """After a put committed: its parents that were pending when it read them and have ended
    since, settled now (their end's release could not see the put's edges), as the sweep would
    settle them later. Edges are marked once: a release that did see them changes nothing here."""
    ended = parents_state(cur, ids)
    settle_done(cur, [p for p in ids if ended.get(p) == "done"])
    for why in ("dead", "cancelled"):
        settle_failed(cur, [p for p in ids if ended.get(p) == why], why)


def set_waiting(cur, ids: list[int], parents: int, mode: int) -> None:
    """Children just inserted (status waiting): how many parents they wait for, and when they run."""
    for start in range(0, len(ids), 10_000):
        cur.execute(Q["children_waiting"], {"ids": _ids(ids[start:start + 10_000]), "n": parents, "mode": mode})


def insert_edges(cur, edges: list[tuple[int, int, str]]) -> None:
    """(parent_id, child_id, child_queue) rows, in multi-row INSERTs (executemany rewrites the
    VALUES row), every value bound."""
    for start in range(0, len(edges), 5000):
        cur.executemany(Q["insert_edges"], edges[start:start + 5000])


# ---------------------------------------------------------------- reading

def progress(cur, job_id: int) -> dict[str, int]:
    """A job's parents (a batch callback's: the batch's members), counted as they are now
    (parents_now): done, failed (dead or cancelled), pending, and awaited: the pending ones the
    job still waits for (its edge from them not settled yet)."""
    cur.execute(Q["job_progress"], {"id": int(job_id)})
    now = parents_now(cur.fetchall())
    return {"done": now["done"], "failed": now["dead"] + now["cancelled"], "pending": now["pending"],
            "awaited": now["awaited"]}


PENDING = ("ready", "scheduled", "claimed", "waiting")  # a parent's states that count it pending


def parent_state(status: int | None, edge_state: int) -> str:
    """A parent's state now: by its row while it has one (a done parent, kept and then retried,
    is ready or running again, though its edge still says done), by its edge once its row is
    gone (counted done: it ended done, its row went with its ack; counted failed: cancelled
    before it ran, or purged)."""
    if status is not None:
        return STATUS_NAMES.get(int(status), str(status))
    return {DONE: "done", FAILED: "cancelled"}.get(edge_state, "gone")


def parents_now(rows: Any) -> dict[str, int]:
    """(edge state, parent status, n) rows -> the parents counted as they are now: done, dead,
    cancelled, pending (and pending by state), the total, and awaited: those whose edge still
    waits, which the child waits for (a parent retried after its done was counted is pending,
    but not awaited: the child counted it done and runs without waiting for it again). The one
    count of a job's progress: the API's (progress), `notifyq jobs show`'s and the console's."""
    out = {"done": 0, "dead": 0, "cancelled": 0, "pending": 0, "awaited": 0, **{p: 0 for p in PENDING}}
    for edge_state, status, n in rows:
        n = int(n)
        name = parent_state(status, int(edge_state))
        if name in ("done", "dead", "cancelled"):
            out[name] += n
        else:
            out["pending"] += n
            if name in PENDING:
                out[name] += n
            if int(edge_state) not in (DONE, FAILED):
                out["awaited"] += n
    out["total"] = out["done"] + out["dead"] + out["cancelled"] + out["pending"]
    return out


def parent_results(cur, job_id: int) -> dict[int, str | None]:
    """Each parent's result (JSON text, None: none kept or not done), by parent id."""
    cur.execute(Q["parent_results"], {"id": int(job_id)})
    out: dict[int, str | None] = {}
    for parent, result in cur.fetchall():
        out[int(parent)] = result if result is not None else out.get(int(parent))
    return out


# ---------------------------------------------------------------- the sweep

def sweep_needed(session) -> bool:
    """Whether settle() has anything to do (one read)."""
    def ask(cur) -> bool:
        cur.execute(Q["sweep_needed"])
        return bool(cur.fetchone()[0])

    return session.run(ask, what="workflow sweep")


def settle(session) -> int:
    """The reaper's sweep: parents that ended with waiting edges (what no transaction settled)
    settled now, each parent in a transaction of its own. Returns how many parents."""
    def find(cur) -> list[tuple[int, int | None, int]]:
        cur.execute(Q["edges_ended"], {"limit": SWEEP_LIMIT})
        return [(int(p), s, int(d)) for p, s, d in cur.fetchall()]

    ended = session.run(find, what="workflow sweep")
    for parent, status, done_record in ended:
        if status == 3 or (status is None and done_record):
            session.run(lambda cur, p=parent: settle_done(cur, [p]), what="workflow sweep")
        else:
            why = "dead" if status == 4 else "cancelled"
            session.run(lambda cur, p=parent, w=why: settle_failed(cur, [p], w), what="workflow sweep")

    def drop_gone(cur) -> None:  # edges of children that are gone: nothing reads them
        cur.execute(Q["edges_of_gone"], {"limit": SWEEP_LIMIT})
        gone = [int(r[0]) for r in cur.fetchall()]
        if gone:
            cur.execute(Q["edges_drop"], {"ids": _ids(gone)})

    session.run(drop_gone, what="workflow sweep")
    return len(ended)
