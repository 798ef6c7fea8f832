"""The fault schedule (tests/fault) on a 3-node Galera cluster: the same workload, real consumer
processes and history checker, through one multi-host DSN, while the schedule SIGKILLs and
restarts the writer node, pauses (SIGSTOP/SIGCONT) a node (the writer, or another), and SIGKILLs
consumers (schedule.make_cluster_plan).

    result = ClusterFaultRun(make_cluster_plan(seed, duration_s, jobs), workdir).run()

A node fault is recorded for the checker from the moment it hits until the node is a Synced
member again, as a fault on every process (checker.SERVER_CAUSES): a duplicate it explains was in
flight at that failover. Each fault also gets its failover time: from the fault to the first
handler start of a job whose enqueue was acknowledged after it (producer and consumer both on the
new writer).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

from fault.harness import QUEUE, FaultRun, RunResult
from fault.history import Fault, History
from fault.schedule import NODE_FAULTS, NODE_WRITER_PAUSE, Plan, Step
from fault.workload import METHODS, Workload

from .galera import GaleraCluster
from .node import GaleraNode

# The application's own connection (`put(conn=...)`) names one host: on a cluster it would write
# through a node other than the writer. Not what this schedule is about.
CLUSTER_METHODS = tuple(m for m in METHODS if m != "transactional")


@dataclasses.dataclass
class NodeFault:
    kind: str  # writer_kill | node_pause
    node: GaleraNode
    at: float  # monotonic
    back_due: float  # when the node is restarted (kill) or SIGCONTed (pause)
    writer: bool  # it hit the node the processes wrote through
    back_at: float | None = None
    synced_at: float | None = None


class ClusterFaultRun(FaultRun):
    def __init__(self, plan: Plan, workdir: Path, keep: bool | None = None, drain_s: float = 60.0,
                 **cluster_settings):
        super().__init__(plan, workdir, keep=keep, drain_s=drain_s)
        self.cluster = GaleraCluster(3, **cluster_settings)
        self.node_faults: list[NodeFault] = []
        self.deferred: list[Step] = []  # node faults due while the last one had not healed
        self.draining = False  # no deferred fault once the drain began

    # ------------------------------------------------------------ the cluster as the server

    def _start_server(self) -> None:
        self.cluster.start()

    def _stop_server(self, keep: bool) -> None:
        if keep:  # the nodes' logs, for a post-mortem (the datadirs go with the cluster)
            for node in self.cluster.nodes:
                (self.logs / f"node{node.index}.log").write_text(node.log_tail(400))
        self.cluster.destroy()

    def _server_dsn(self) -> str:
        return self.cluster.multi_host_dsn()

    def _workload(self, config) -> Workload:
        plan = self.plan
        workload = Workload("main", config, QUEUE, plan.seed, plan.classes, plan.jobs, plan.duration_s,
                            plan.lease_s, methods=CLUSTER_METHODS, ring=True)
        workload.more = lambda: self._unanswered(workload)
        return workload

    def _unanswered(self, workload: Workload) -> bool:
        """Whether a planned node fault has yet to happen, or has no job acknowledged after it: a
        fault deferred behind the last one's heal can come at the producers' end (a pause of the
        writer at 40 s of 40 once had no job put after it, and no failover to time)."""
        planned = sum(1 for s in self.plan.steps if s.kind in NODE_FAULTS)
        if len(self.node_faults) < planned:
            return True
        last_acked = workload.enqueues[-1].acked_at if workload.enqueues else 0.0
        return any(f.at >= last_acked for f in self.node_faults)

    # ------------------------------------------------------------ node faults

    def writer(self) -> GaleraNode | None:
        """The node most consumers registered their liveness lock on (nq_consumer.node)."""
        rows = self.roots["main"].query("SELECT node, COUNT(*) FROM nq_consumer GROUP BY node "
                                        "ORDER BY COUNT(*) DESC LIMIT 1", retry_s=10)
        if not rows:
            return None
        port = int(str(rows[0][0]).rsplit(":", 1)[1])
        return next((n for n in self.cluster.nodes if n.port == port), None)

    def _inject_server_fault(self, step: Step) -> None:
        writer = None
        # One node down at a time (3 nodes keep quorum): a fault due before the last one healed
        # waits for that (the tick injects it), so every planned kind happens.
        if not any(f.synced_at is None for f in self.node_faults):
            writer = self.writer()
        if writer is None or not all(n.is_running() and not n.paused for n in self.cluster.nodes):
            if step not in self.deferred:
                self.deferred.append(step)
            return
        if step in self.deferred:
            self.deferred.remove(step)
        if step.kind == "writer_kill":
            node = writer
        elif step.kind == "node_pause":
            others = [n for n in self.cluster.nodes if n is not writer]
            node = writer if step.pick < NODE_WRITER_PAUSE else others[int(step.pick * 97) % len(others)]
        else:
            raise ValueError(f"no such fault here: {step.kind}")
        at = time.monotonic()
        (node.kill if step.kind == "writer_kill" else node.pause)()
        self.node_faults.append(NodeFault(step.kind, node, at, at + step.length_s, node is writer))

    def _tick(self) -> None:
        now = time.monotonic()
        for f in self.node_faults:
            if f.back_at is None and now >= f.back_due:
                (f.node.launch if f.kind == "writer_kill" else f.node.resume)()
                f.back_at = now
            elif f.back_at is not None and f.synced_at is None and all(
                    n.is_synced_member(3) for n in self.cluster.nodes):
                f.synced_at = now
                self.faults.append(Fault(f.kind, f.at, now, detail=f"node {f.node.index}"
                                         + (" (writer)" if f.writer else "")))
        if self.deferred and not self.draining and all(f.synced_at is not None for f in self.node_faults):
            self._inject_server_fault(self.deferred[0])

    def _drain(self) -> bool:
        """Every node back and Synced first, then the harness's drain."""
        self.draining = True
        deadline = time.monotonic() + 120
        while any(f.synced_at is None for f in self.node_faults) and time.monotonic() < deadline:
            for f in self.node_faults:
                f.back_due = min(f.back_due, time.monotonic())
            self._tick()
            time.sleep(0.25)  # poll interval inside a deadline loop
        return super()._drain()

    # ------------------------------------------------------------ what it found

    def failovers(self, history: History) -> list[dict]:
        """Per node fault: which node, whether it was the writer, and the failover time."""
        acked = {e.key: e.acked_at for e in history.enqueues}
        out = []
        for f in self.node_faults:
            first = min((r.start for r in history.runs if r.start > f.at and acked.get(r.key, 0) > f.at),
                        default=None)
            out.append({"fault": f.kind, "node": f.node.index, "writer": f.writer,
                        "failover_s": None if first is None else round(first - f.at, 2),
                        "back_s": None if f.back_at is None else round(f.back_at - f.at, 2),
                        "synced_s": None if f.synced_at is None else round(f.synced_at - f.at, 2)})
        return out


def failover_summary(failovers: list[dict]) -> dict[str, dict]:
    """p50/max failover time per fault kind (writer faults only: a paused non-writer forces none)."""
    out = {}
    for kind in ("writer_kill", "node_pause"):
        times = [f["failover_s"] for f in failovers if f["fault"] == kind and f["writer"] and f["failover_s"]]
        out[kind] = {"count": len(times), "p50_s": round(statistics.median(times), 2) if times else None,
                     "max_s": max(times, default=None)}
    return out


def verdict(result: RunResult) -> list[str]:
    """What the cluster schedule must show, beyond the checker's rules: every consumer slot still
    running at the end, no exit nobody asked for, no live consumer reaped."""
    problems = []
    if result.running_at_end != result.plan.consumers:
        problems.append(f"{result.running_at_end} of {result.plan.consumers} consumer slots running at the end")
    problems += [f"unexpected exit: {u}" for u in result.unexpected_exits]
    problems += [f"false reclaim: {r}" for r in result.false_reclaims]
    return problems
