"""Watching a fault-schedule run from outside: root queries that survive server restarts, and
how long the jobs of each consumer that is gone stay claimed under its id.

A consumer's registration (id -> pid) is remembered from every sample, because the reaper
deletes the row of a dead consumer; the recovery time runs from the death of its process until
no job is claimed under that id any more (claimed again by someone else, or done).

What is judged is what a sample saw: the last time jobs were seen still claimed under that id.
The first sample that finds none may come long after they came back: the harness's loop, which
takes the samples, also injects the faults (a KILL QUERY burst, a server restart) and may go
without a sample for seconds on a loaded machine, and a sample's connect may fail. Seed 23 once
measured a consumer's jobs back after 12.8 s (bound 10.8 s) when a peer had claimed them again
6.9 s after the death; no sample between the two had answered.

Only a live consumer of the same deployment can take them back (its reaper pass runs in a
consumer process): the seconds in which none ran there (a cron-like `--exit-when-empty`
deployment between two runs, or every consumer of it stopped) are counted for each gone
consumer (unattended), and the checker stretches its bound by them as by an outage.
"""

from __future__ import annotations

import time

import MySQLdb

from notifyq.config import DSN


class Root:
    """Admin queries as root; a fresh connection each time, so a restart in between is harmless."""

    def __init__(self, dsn: DSN):
        self.dsn = dsn

    def query(self, sql: str, params=None, retry_s: float = 60.0) -> list[tuple]:
        deadline = time.monotonic() + retry_s
        while True:
            try:
                conn = self._connect()
            except MySQLdb.OperationalError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)  # the server is restarting: poll interval inside a deadline
                continue
            try:
                cur = conn.cursor()
                cur.execute(sql, params)
                return list(cur.fetchall())
            finally:
                conn.close()

    def _connect(self):
        """The first server of the DSN that answers and takes queries (every node of a cluster is
        tried: one may be down, paused or out of the primary component)."""
        last: MySQLdb.OperationalError | None = None
        for index in range(len(self.dsn.servers)):
            try:
                conn = MySQLdb.connect(**self.dsn.connect_args(index), autocommit=True, connect_timeout=2,
                                       read_timeout=5)
                if len(self.dsn.servers) > 1:
                    cur = conn.cursor()
                    cur.execute("SHOW GLOBAL STATUS LIKE 'wsrep_ready'")
                    row = cur.fetchone()
                    if not row or row[1] != "ON":  # out of the primary component: 1047 to every read
                        conn.close()
                        raise MySQLdb.OperationalError(1047, "node not ready")
                return conn
            except MySQLdb.OperationalError as e:
                last = e
        assert last is not None
        raise last

    def scalar(self, sql: str, params=None):
        rows = self.query(sql, params)
        return rows[0][0] if rows else None

    def wait_for(self, predicate, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate(self):
            if time.monotonic() >= deadline:
                raise RuntimeError(f"timed out after {timeout_s:g}s waiting for {what}")
            time.sleep(0.1)  # poll interval inside a deadline


class ClaimMonitor:
    def __init__(self, roots: dict[str, Root], fleet):
        self.roots, self.fleet = roots, fleet
        self.pid_of: dict[tuple[str, str], int] = {}  # (deploy, consumer id) -> pid
        self.recovered: dict[tuple[str, str], float] = {}
        self.pending: set[tuple[str, str]] = set()
        # seconds after its death that a gone consumer's jobs were last seen claimed
        self.last_held: dict[tuple[str, str], float] = {}
        # seconds after its death in which no consumer of its deployment ran (none could reap)
        self.unattended: dict[tuple[str, str], float] = {}
        self._last_tick: float | None = None

    def _attended(self, deploy: str) -> bool:
        """Whether a consumer of `deploy` runs now (started consuming, not stopped): a reaper could."""
        return any(c.deploy == deploy and c.alive() and not c.stopped and c.ready()
                   for c in getattr(self.fleet, "started", ()))

    def _count_unattended(self, now: float) -> None:
        since, self._last_tick = self._last_tick, now
        if since is None:
            return
        for key in self.pending - self.recovered.keys():
            if not self._attended(key[0]):
                self.unattended[key] = self.unattended.get(key, 0.0) + (now - since)

    def tick(self) -> None:
        self._count_unattended(time.monotonic())
        for deploy, root in self.roots.items():
            try:
                registered = root.query("SELECT id, pid FROM nq_consumer", retry_s=0)
                held = dict(root.query("SELECT owner, COUNT(*) FROM nq_job WHERE status = 2 GROUP BY owner",
                                       retry_s=0))
            except MySQLdb.Error:
                continue  # the server is down: the next tick measures
            now = time.monotonic()
            for cid, pid in registered:
                self.pid_of[(deploy, cid)] = int(pid)
            for key, pid in self.pid_of.items():
                if key[0] != deploy or key in self.recovered:
                    continue
                consumer = self.fleet.by_pid(pid)
                if consumer is None or consumer.alive() or consumer.killed_at is None:
                    continue
                if held.get(key[1], 0) == 0:
                    self.recovered[key] = self.last_held.get(key, 0.0)
                    self.pending.discard(key)
                else:
                    self.last_held[key] = max(0.0, now - consumer.killed_at)
                    if key not in self.pending and not self._attended(deploy):
                        self.unattended[key] = self.last_held[key]  # none ran since its death, as far as seen
                    self.pending.add(key)

    def recovery(self) -> dict[str, float | None]:
        """Per gone consumer: seconds after its death that its claims were last seen held (0.0:
        gone by the first sample after it); None if they never went."""
        out: dict[str, float | None] = {}
        for key, seconds in self.recovered.items():
            out[f"{key[0]}/{key[1][:8]} pid {self.pid_of[key]}"] = round(seconds, 2)
        for key in self.pending - self.recovered.keys():
            out[f"{key[0]}/{key[1][:8]} pid {self.pid_of[key]}"] = None
        return out

    def unattended_s(self) -> dict[str, float]:
        """Per gone consumer (recovery's names): the seconds after its death in which no consumer
        of its deployment ran, up to the last sample that saw its jobs claimed."""
        return {f"{key[0]}/{key[1][:8]} pid {self.pid_of[key]}": round(min(s, self.last_held.get(key, s)), 2)
                for key, s in self.unattended.items() if s > 0}
