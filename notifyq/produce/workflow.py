"""Workflows: jobs that wait for others (dependencies, chains, batches with callbacks), built
here and put in one transaction (Producer.put_workflow; put(after=...) is a workflow of one job).

    wf = notifyq.Workflow()
    fetch = wf.add("fetch", {"day": "2026-11-28"})
    parts = wf.chain("transform", [{"step": 1}, {"step": 2}], after=[fetch])
    wf.batch([fetch, *parts], on_success=("report", {}), on_dead=("alert", {}))
    ids = producer.put_workflow(wf)          # one id per job, in the order they were added

A child waits (status waiting, never claimed) until every parent is done; a parent's end
releases it in the transaction that ends the parent (store/workflows.py), so exactly once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from notifyq import errors
from notifyq.config import validate_queue_name, values
from notifyq.jobs import Status
from notifyq.store import queries, workflows

MAX_EDGES = 100_000  # edges per put: a bound on one transaction's size (the fan-in of a batch)
MAX_JOBS = 100_000


class Ref:
    """A job of a workflow before it is put: what `after=` names inside the workflow. Its `id`
    is set once the workflow is put (None before)."""

    __slots__ = ("workflow", "index", "id")

    def __init__(self, workflow: "Workflow", index: int):
        self.workflow, self.index, self.id = workflow, index, None

    def __repr__(self) -> str:
        return f"Ref(job {self.index + 1} of the workflow{'' if self.id is None else f', id {self.id}'})"


class _Node:
    __slots__ = ("queue", "payload", "options", "parents", "external", "mode")

    def __init__(self, queue: str, payload: Any, options: dict[str, Any], mode: int):
        self.queue, self.payload, self.options, self.mode = queue, payload, options, mode
        self.parents: list[int] = []  # indexes of nodes of this workflow
        self.external: list[int] = []  # ids of jobs put before


class Batch:
    """A batch's members and its callbacks (None: not asked for)."""

    def __init__(self, members: list[Ref], on_success: Ref | None, on_complete: Ref | None, on_dead: Ref | None):
        self.members, self.on_success, self.on_complete, self.on_dead = members, on_success, on_complete, on_dead


class Workflow:
    """Jobs and the edges between them, put in one transaction by Producer.put_workflow (on the
    producer's server: every queue of a workflow lives there)."""

    def __init__(self) -> None:
        self._nodes: list[_Node] = []
        self._refs: list[Ref] = []
        self._edges = 0
        self.put_as: list[int] | None = None  # its jobs' ids once put: a workflow is put once

    def _not_put(self) -> None:
        """A workflow is put once: a second put would store every job again under new ids and
        overwrite each Ref's id (what a caller holds would name the copy). Its jobs, added to
        after the put, would be put by nobody."""
        if self.put_as is not None:
            raise errors.InputError(self._put_already())

    def _put_already(self) -> str:
        return (f"this workflow was put already (its {len(self.put_as)} jobs have ids "
                f"{self.put_as[0]}..{self.put_as[-1]}): build a new Workflow to put its jobs again")

    def add(self, queue: str, payload: Any, *, after: Iterable[Ref | int] = (), run_anyway: bool = False,
            priority: int = 0, delay: float = 0, max_attempts: int | None = None, key: str | None = None) -> Ref:
        """A job on `queue` that runs once every job of `after` (refs of this workflow, or ids
        of jobs put before) is done. run_anyway: once every one has ended, done or not. key: the
        job's key (put(key=)), which it holds from the put on, waiting or not."""
        if key is not None:
            key = values.job_key("key", key)
        return self._add(queue, payload, after, workflows.ALL_ENDED if run_anyway else workflows.ALL_DONE,
                         {"priority": priority, "delay": delay, "max_attempts": max_attempts, "key": key})

    def after(self, child: Ref, parents: Iterable[Ref | int]) -> None:
        """More parents for a job of this workflow (a cycle is refused when it is put)."""
        self._not_put()
        self._link(self._own(child, "child"), parents)

    def chain(self, queue: str, payloads: Sequence[Any], *, after: Iterable[Ref | int] = (),
              **options: Any) -> list[Ref]:
        """Jobs on `queue` that run in order, each once the one before is done (the first after
        `after`)."""
        refs: list[Ref] = []
        for payload in payloads:
            refs.append(self.add(queue, payload, after=refs[-1:] or after, **options))
        return refs

    def batch(self, members: Iterable[Ref | int], *, on_success: tuple[str, Any] | None = None,
              on_complete: tuple[str, Any] | None = None, on_dead: tuple[str, Any] | None = None) -> Batch:
        """Callbacks for a batch, each a (queue, payload) job put once when the batch ends:
        on_success once every member is done; on_complete once every member ended, whatever
        the outcome; on_dead once every member ended and one at least is dead or cancelled
        (else it ends cancelled, not run). A callback reads the members' results
        (Producer.parent_results) and its progress is the batch's (Producer.progress)."""
        members = list(members)
        if not members:
            raise errors.InputError("batch: no members")
        callbacks = (("on_success", on_success, workflows.ALL_DONE),
                     ("on_complete", on_complete, workflows.ALL_ENDED),
                     ("on_dead", on_dead, workflows.SOME_FAILED))
        for name, spec, _ in callbacks:  # all checked before the first is added: all or none
            if spec is not None and not (isinstance(spec, tuple) and len(spec) == 2):
                raise errors.InputError(f"{name}: expected (queue, payload), got {values.shown(spec)}")
            if spec is not None:
                validate_queue_name(spec[0])
        count = sum(spec is not None for _, spec, _ in callbacks)
        if len(self._nodes) + count > MAX_JOBS:
            raise errors.InputError(f"a workflow holds at most {MAX_JOBS} jobs")
        self._room(len(members) * count)
        made = {}
        for name, spec, mode in callbacks:
            made[name] = None if spec is None else self._add(spec[0], spec[1], members, mode, {})
        refs = [m for m in members if isinstance(m, Ref)]
        return Batch(refs, made["on_success"], made["on_complete"], made["on_dead"])

    def queues(self) -> set[str]:
        """The queues its jobs are put on."""
        return {n.queue for n in self._nodes}

    def __len__(self) -> int:
        return len(self._nodes)

    # -------------------------------------------------------- internals

    def _add(self, queue: str, payload: Any, after: Iterable[Ref | int], mode: int, options: dict[str, Any]) -> Ref:
        self._not_put()
        if len(self._nodes) >= MAX_JOBS:
            raise errors.InputError(f"a workflow holds at most {MAX_JOBS} jobs")
        validate_queue_name(queue)
        if isinstance(after, (Ref, int)):
            after = [after]
        parents, external = self._parents(after)  # checked, as the room, before anything changes
        node = _Node(queue, payload, options, mode)
        self._nodes.append(node)
        self._attach(node, parents, external)
        ref = Ref(self, len(self._nodes) - 1)
        self._refs.append(ref)
        return ref

    def _own(self, ref: Any, what: str) -> int:
        if not isinstance(ref, Ref) or ref.workflow is not self:
            raise errors.InputError(f"{what}: expected a job of this workflow, got {values.shown(ref)}")
        return ref.index

    def _link(self, child: int, parents: Iterable[Ref | int]) -> None:
        self._attach(self._nodes[child], *self._parents(parents))

    def _parents(self, parents: Iterable[Ref | int]) -> tuple[list[int], list[int]]:
        """`after`'s parents checked, nothing changed: (indexes of this workflow's, ids put
        before); InputError when one is neither, or when they would take the workflow past
        MAX_EDGES (a call that raises adds nothing: a batch callback half-linked to its members
        would run before the rest end)."""
        refs: list[int] = []
        external: list[int] = []
        for parent in parents:
            if isinstance(parent, Ref):
                refs.append(self._own(parent, "after"))
            elif parent.__class__ is int and parent > 0:
                external.append(parent)
            else:
                raise errors.InputError(f"after: expected job ids or jobs of this workflow, got {values.shown(parent)}")
        self._room(len(refs) + len(external))
        return refs, external

    def _room(self, edges: int) -> None:
        if self._edges + edges > MAX_EDGES:
            raise errors.InputError(f"too many edges: a workflow put holds at most {MAX_EDGES}")

    def _attach(self, node: _Node, refs: list[int], external: list[int]) -> None:
        node.parents += refs
        node.external += external
        self._edges += len(refs) + len(external)

    def order(self) -> list[int]:
        """The nodes' indexes, parents before children; InputError naming a cycle if any."""
        children: list[list[int]] = [[] for _ in self._nodes]
        waiting = [0] * len(self._nodes)
        for i, node in enumerate(self._nodes):
            for p in set(node.parents):
                children[p].append(i)
                waiting[i] += 1
        ready = [i for i, n in enumerate(waiting) if n == 0]
        out: list[int] = []
        while ready:
            i = ready.pop()
            out.append(i)
            for c in children[i]:
                waiting[c] -= 1
                if waiting[c] == 0:
                    ready.append(c)
        if len(out) < len(self._nodes):
            stuck = sorted(i + 1 for i, n in enumerate(waiting) if n > 0)
            shown = ", ".join(map(str, stuck[:10])) + (" ..." if len(stuck) > 10 else "")
            raise errors.InputError(f"the workflow has a cycle: jobs {shown} (numbered as added) wait for each other")
        return out


def put_body(wf: Workflow, rows_of: Any, chunk_size: int, max_packet: int, pending: list[int] | None = None,
             missing: Any = None, ready: list[str] | None = None):
    """The statements of a workflow's put, as a body for a transaction (cursor -> ids). rows_of:
    (queue, payload, options, status) -> the row inserts.insert_jobs takes (the producer checks
    every argument). Every argument is checked before it returns: nothing is written on bad input.
    pending: filled with the parents put before that were pending when the body read them (for
    workflows.settle_ended after the COMMIT). missing: workflows.parents_state's (on a caller's
    connection: the parents its transaction does not see, read on the producer's session).
    ready: filled with the queues it made jobs ready (or scheduled) on: its jobs with no parent,
    and those whose parents put before had ended (to wake their idle consumers after the COMMIT)."""
    from notifyq.store import inserts  # the producer's module loads it already

    if not wf._nodes:
        raise errors.InputError("the workflow has no jobs")
    wf.order()  # a cycle is refused before anything is written
    nodes = wf._nodes
    rows = [rows_of(n.queue, n.payload, n.options,
                    Status.WAITING if (n.parents or n.external) else None) for n in nodes]
    external = sorted({p for n in nodes for p in n.external})

    def body(cur) -> list[int]:
        if wf.put_as is not None and workflows.parents_state(cur, wf.put_as, missing):
            # Put before, and that put committed (its jobs are there, or their records). One
            # that rolled back (on the caller's connection, conn=) left nothing: put it again.
            raise errors.InputError(wf._put_already())
        ended = workflows.parents_state(cur, external, missing)
        if pending is not None:
            pending[:] = [p for p in external if ended.get(p) == "pending"]
        unknown = [p for p in external if p not in ended]
        if unknown:
            raise errors.InputError(f"after: no job {unknown[0]} (unknown id, or a job gone with no record "
                                    "of how it ended)" + (f", and {len(unknown) - 1} more" if len(unknown) > 1 else ""))
        for queue in sorted({n.queue for n in nodes}):
            queries.ensure_queue_unlocked(cur, queue)
        ids = inserts.insert_jobs(cur, rows, max_rows=chunk_size, max_packet=max_packet)
        edges, counts = [], {}
        for i, node in enumerate(nodes):
            parents = sorted({ids[p] for p in node.parents} | set(node.external))
            edges += [(parent, ids[i], node.queue) for parent in parents]
            if parents:
                counts.setdefault((len(parents), node.mode), []).append(ids[i])
        for (n, mode), children in counts.items():
            workflows.set_waiting(cur, children, n, mode)
        workflows.insert_edges(cur, edges)
        roots: dict[str, int] = {}
        for node in nodes:
            if not (node.parents or node.external):
                roots[node.queue] = roots.get(node.queue, 0) + 1
        for queue, n in roots.items():
            queries.bump_signal(cur, queue, n)
        # Parents that ended before this put: settled now, as their end would have
        released: list[str] = []
        workflows.settle_done(cur, [p for p in external if ended[p] == "done"], released)
        for why in ("dead", "cancelled"):
            workflows.settle_failed(cur, [p for p in external if ended[p] == why], why, released)
        if ready is not None:
            ready[:] = sorted(set(roots) | set(released))
        return ids

    return body


def placed(wf: Workflow, ids: list[int]) -> None:
    """After the put committed (or ran in the caller's transaction): each Ref knows its job's
    id, and the workflow is not put again."""
    wf.put_as = list(ids)
    for i, job_id in enumerate(ids):
        wf._refs[i].id = job_id


def check_after(after: Any) -> list[int]:
    """put(after=...)'s ids, checked."""
    if isinstance(after, (int, Ref)):
        after = [after]
    try:
        out = list(after)
    except TypeError:
        raise errors.InputError(f"after: expected a list of job ids, got {values.shown(after)}") from None
    for p in out:
        if p.__class__ is not int or p <= 0:
            raise errors.InputError(f"after: expected job ids, got {values.shown(p)}")
    if not out:
        raise errors.InputError("after: no parent ids (leave it out for a job that waits for nothing)")
    return out


def options_of(priority: int, delay: float, run_at: dt.datetime | None, max_attempts: int | None) -> dict[str, Any]:
    if run_at is not None:
        raise errors.InputError("run_at cannot be used with after= (use delay: counted from the put)")
    return {"priority": priority, "delay": delay, "max_attempts": max_attempts}
