"""The raw-SQL floor of a per-key limited claim: one claimer process (run by keyed_floor.py).

No notifyq import: plain mysqlclient, READ COMMITTED, multi-statement sends (one round trip
each). Every side claims a batch, runs a no-op handler per job (the payload decoded), and
carries the batch's ack (DELETE by id, fenced by claim_token) in the next claim's transaction.

  U          the unlimited floor: ids by ix_state in claim order (3 x batch), lock them by id
             (FOR UPDATE SKIP LOCKED), mark, COMMIT. 3 round trips.
  L_count    exact by counting (as notifyq's main does, fewest statements): the committed
             running counts per key (grouped read of the queue's status-2 rows), each free key's
             first free jobs (ix_key dives), then the chosen keys' nq_flow_key rows locked
             (SKIP LOCKED) + the count again under the locks + the jobs locked, mark, COMMIT.
             4 round trips; no post-mark verify.
  L_counter  exact by a `running` column on nq_flow_key: counters read plain, candidates from
             one head read in claim order with keys, the chosen keys' rows locked (SKIP LOCKED,
             their counters read under the lock) + the jobs locked, mark + one UPDATE of the net
             counter change (grant less carried acks, keys whose count changes only), COMMIT.
             3 round trips.
  L_trigger  as L_counter, the counters kept by AFTER UPDATE/DELETE triggers on nq_job.

Why the limited sides are exact (never more than 2 running jobs of a key in any committed state):
a job is marked only by a claim that holds its key's nq_flow_key row (SKIP LOCKED: never waited
for), as far as the count read under that lock leaves room, and every claim of the key commits
before it lets go of the row. L_count's count is the queue's status-2 rows as committed (READ
COMMITTED: a peer's ack not yet committed still counts, which only holds a job back). A counter
changes only in the transaction that changes its key's running jobs (the mark, the ack's DELETE,
a take-back), so as committed it equals them. The carried ack's part of the net change is the
client's (the acked jobs' keys), and right only if the DELETE removed every job it named: when
its row count is short (a job taken back meanwhile, its fence failed) the transaction is rolled
back and the ack done again from its rows locked under the fence, counted on the server's rows
(ack_fenced_out). A deadlock (1213; an ack's counter write waits on a peer's key row) reruns
the claim with its ack.

affinity (the `+aff` sides): the grant takes the keys of the jobs this claim acks first, then
keys with every slot free, then the rest (each in the order of its first job). Two claimers
then keep to their own keys; without it they came to share keys a slot each, and every claim
locked the keys its peer was claiming at that moment (SKIP LOCKED: left short or empty).

Run: `python _keyed_floor.py JSON-ARGS`; prints "ready", waits for a line on stdin, drains until
no ready job is left, prints one JSON line.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections import defaultdict

import MySQLdb
from MySQLdb.constants import CLIENT

LIMIT = 2
LEASE = "NOW(6) + INTERVAL 300 SECOND"


def marks(n: int) -> str:
    return ",".join(["%s"] * n)


ACK = ("DELETE nq_job FROM nq_job FORCE INDEX (PRIMARY) WHERE id IN ({}) AND claim_token = %s "
       "AND status = 2")
ACK_LOCK = ("SELECT id, job_key FROM nq_job FORCE INDEX (PRIMARY) WHERE id IN ({}) AND claim_token = %s "
            "AND status = 2 FOR UPDATE")
ACK_IDS = "DELETE nq_job FROM nq_job FORCE INDEX (PRIMARY) WHERE id IN ({})"
CANDIDATES = ("SELECT id FROM nq_job FORCE INDEX (ix_state) WHERE status = 0 AND queue = %s "
              "ORDER BY prio_key, sort_at, id LIMIT %s")
LOCK = ("SELECT id, payload, job_key FROM nq_job FORCE INDEX (PRIMARY) WHERE id IN ({}) AND status = 0 "
        "FOR UPDATE SKIP LOCKED")
MARK = ("UPDATE nq_job FORCE INDEX (PRIMARY) SET status = 2, owner = %s, claim_token = %s, "
        f"claimed_at = NOW(6), lease_until = {LEASE}, attempts = attempts + 1 WHERE id IN ({{}})")
RUNNING = ("SELECT job_key, COUNT(*) FROM nq_job FORCE INDEX (ix_state) WHERE status = 2 AND queue = %s "
           "GROUP BY job_key")
FIRSTS_PART = ("SELECT j.id, j.job_key, j.key_prio, CAST(j.run_at AS BINARY) FROM ("
               " SELECT (SELECT id FROM nq_job FORCE INDEX (ix_key) WHERE queue = %s AND ready_key = k.job_key"
               "  ORDER BY key_prio, run_at, id LIMIT 1 OFFSET {off}) AS id"
               " FROM nq_flow_key k FORCE INDEX (PRIMARY) WHERE k.queue = %s AND k.job_key IN ({keys})"
               ") f JOIN nq_job j FORCE INDEX (PRIMARY) ON j.id = f.id")
KEY_LOCK = ("SELECT job_key FROM nq_flow_key FORCE INDEX (PRIMARY) WHERE queue = %s AND job_key IN ({}) "
            "FOR UPDATE SKIP LOCKED")
KEY_LOCK_COUNTER = ("SELECT job_key, running FROM nq_flow_key FORCE INDEX (PRIMARY) WHERE queue = %s "
                    "AND job_key IN ({}) FOR UPDATE SKIP LOCKED")
COUNTERS = "SELECT job_key, running FROM nq_flow_key WHERE queue = %s"
HEAD = ("SELECT j.id, j.job_key FROM (SELECT id FROM nq_job FORCE INDEX (ix_state) WHERE status = 0 "
        "AND queue = %s ORDER BY prio_key, sort_at, id LIMIT %s) h JOIN nq_job j FORCE INDEX (PRIMARY) "
        "ON j.id = h.id")
# With --wide's ix_state (status, queue, prio_key, sort_at, id, job_key): the head index-only
HEAD_WIDE = ("SELECT id, job_key FROM nq_job FORCE INDEX (ix_state) WHERE status = 0 AND queue = %s "
             "ORDER BY prio_key, sort_at, id LIMIT %s")
COUNTER_ADD = ("UPDATE nq_flow_key FORCE INDEX (PRIMARY) SET running = running + CASE job_key {} END "
               "WHERE queue = %s AND job_key IN ({})")
ANY_READY = "SELECT EXISTS (SELECT 1 FROM nq_job FORCE INDEX (ix_state) WHERE status = 0 AND queue = %s)"


class Retry(Exception):
    """A deadlock or lock wait timeout: the claim's transaction was rolled back; run it again."""


class Claimer:
    def __init__(self, a: dict):
        self.a = a
        self.queue, self.batch = a["queue"], a["batch"]
        self.conn = MySQLdb.connect(**a["conn"], autocommit=False, client_flag=CLIENT.MULTI_STATEMENTS,
                                    init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        self.cur = self.conn.cursor()
        self.owner = secrets.token_hex(16)
        self.acks: list[tuple[int, str | None]] = []  # (id, key) of the last batch
        self.ack_token: int | None = None
        self.stats = defaultdict(int)
        self.keys: list[str] = []
        self.empty_keys: dict[str, int] = {}  # L_counter: key -> the claim before which no dive looks at it
        self.n_claims = 0
        if a["side"] == "L_count":
            self.cur.execute("SELECT job_key FROM nq_flow_key WHERE queue = %s ORDER BY job_key", (self.queue,))
            self.keys = [r[0] for r in self.cur.fetchall()]
            self.conn.commit()

    # -- helpers -----------------------------------------------------------------------------
    def send(self, parts: list[tuple[str, tuple]]) -> list[tuple[int, list[tuple]]]:
        """Statements in one round trip; each one's (rowcount, rows)."""
        sql = ";\n".join(p[0] for p in parts)
        params = tuple(x for p in parts for x in p[1])
        self.stats["sends"] += 1
        self.stats["statements"] += len(parts)
        try:
            self.cur.execute(sql, params)
            out = []
            while True:
                out.append((self.cur.rowcount, list(self.cur.fetchall()) if self.cur.description else []))
                if not self.cur.nextset():
                    break
        except MySQLdb.OperationalError as e:
            if e.args[0] in (1213, 1205):
                self.stats["deadlock" if e.args[0] == 1213 else "lock_wait_timeout"] += 1
                self._drain_results()
                self.conn.rollback()
                raise Retry() from e
            raise
        return out

    def _drain_results(self) -> None:
        try:
            while self.cur.nextset():
                pass
        except MySQLdb.Error:
            pass

    def ack_part(self) -> list[tuple[str, tuple]]:
        if not self.acks:
            return []
        ids = [i for i, _ in self.acks]
        return [(ACK.format(marks(len(ids))), (*ids, self.ack_token))]

    def ack_fenced_out(self) -> dict[str | None, int]:
        """The careful ack, when the carried DELETE removed fewer rows than it named (a job taken
        back meanwhile): its own rows locked under the fence, those deleted, their keys counted
        on the server's rows. The claim's transaction goes on after it."""
        self.stats["fenced_acks"] += 1
        ids = [i for i, _ in self.acks]
        (_, rows), = self.send([(ACK_LOCK.format(marks(len(ids))), (*ids, self.ack_token))])
        freed: dict[str | None, int] = defaultdict(int)
        if rows:
            self.send([(ACK_IDS.format(marks(len(rows))), tuple(r[0] for r in rows))])
            for _, k in rows:
                freed[k] += 1
        return freed

    def acked_keys(self) -> dict[str | None, int]:
        freed: dict[str | None, int] = defaultdict(int)
        for _, k in self.acks:
            freed[k] += 1
        return freed

    def lock_and_mark(self, ids: list[int], pre: list[tuple[str, tuple]]):
        """(U) the locking read by id after `pre` in one round trip."""
        return self.send(pre + [(LOCK.format(marks(len(ids))), tuple(ids))])

    def finish(self, rows: list[tuple], extra: list[tuple[str, tuple]] = ()) -> list[tuple]:
        token = secrets.randbits(63)
        parts = []
        if rows:
            parts.append((MARK.format(marks(len(rows))), (self.owner, token, *[r[0] for r in rows])))
        parts += list(extra)
        parts.append(("COMMIT", ()))
        self.send(parts)
        self.acks = [(r[0], r[2]) for r in rows]
        self.ack_token = token
        return rows

    # -- the sides ---------------------------------------------------------------------------
    def claim_U(self) -> list[tuple]:
        res = self.send(self.ack_part() + [(CANDIDATES, (self.queue, 3 * self.batch))])
        ids = [r[0] for r in res[-1][1]]
        rows: list[tuple] = []
        for start in range(0, len(ids), self.batch):
            if len(rows) >= self.batch:
                break
            window = ids[start:start + self.batch - len(rows)]
            (_, got), = self.send([(LOCK.format(marks(len(window))), tuple(window))])
            rows += got
        return self.finish(rows)

    def claim_L_count(self) -> list[tuple]:
        res = self.send(self.ack_part() + [(RUNNING, (self.queue,))])
        if self.acks and res[0][0] != len(self.acks):
            self.stats["fenced_acks"] += 1  # the grouped count reads the server's rows: nothing to fix
        running = {k: n for k, n in res[-1][1]}
        free = {k: LIMIT - running.get(k, 0) for k in self.keys if running.get(k, 0) < LIMIT}
        if not free:
            return self.finish([])
        # each free key's first free jobs: one dive per (key, offset)
        parts = []
        for off in range(LIMIT):
            ks = [k for k, f in free.items() if f > off]
            if ks:
                parts.append((FIRSTS_PART.format(off=off, keys=marks(len(ks))), (self.queue, self.queue, *ks)))
        sql = " UNION ALL ".join(f"({p[0]})" for p in parts)
        (_, cand), = self.send([(sql, tuple(x for p in parts for x in p[1]))])
        ids, keys = self.grant_in_key_groups([(c[0], c[1], (c[2], c[3], c[0])) for c in cand], free)
        if not ids:
            return self.finish([])
        res = self.send([(KEY_LOCK.format(marks(len(keys))), (self.queue, *keys)),
                         (RUNNING, (self.queue,)),
                         (LOCK.format(marks(len(ids))), tuple(ids))])
        locked = {r[0] for r in res[0][1]}
        under = {k: n for k, n in res[1][1]}
        kept = self.keep(res[2][1], locked, {k: under.get(k, 0) for k in locked})
        # verify: notifyq's count after the mark (a count cut short by a KILL QUERY), in the
        # mark's round trip
        return self.finish(kept, [(RUNNING, (self.queue,))] if kept and self.a.get("verify") else [])

    def grant_in_key_groups(self, cand: list[tuple], free: dict) -> tuple[list[int], list[str]]:
        """Candidates (id, key, sort) -> ids in claim order by key groups (a key's free slots
        together, keys in the order of their first job), up to a batch; and their keys."""
        by_key: dict[str, list[tuple]] = defaultdict(list)
        for c in sorted(cand, key=lambda c: c[2]):
            if len(by_key[c[1]]) < free.get(c[1], 0):
                by_key[c[1]].append(c)
        ids: list[int] = []
        keys: list[str] = []
        order = list(by_key)  # dicts keep insertion order: the keys' first jobs' order
        if self.a.get("affinity"):
            # the keys whose jobs this claim acks first, then whole keys (every slot free), then
            # the rest: two claimers keep to their own keys instead of sharing every key by one slot
            mine = {k for _, k in self.acks}
            order.sort(key=lambda k: 0 if k in mine else 1 if free.get(k, 0) >= LIMIT else 2)
        for k in order:
            cs = by_key[k]
            if not cs or len(ids) >= self.batch:
                continue
            take = cs[:self.batch - len(ids)]
            ids += [c[0] for c in take]
            keys.append(k)
        return ids, keys

    def keep(self, rows: list[tuple], locked: set, running: dict) -> list[tuple]:
        """Of the locked jobs, those whose key this claim locked, within its count under the lock."""
        kept, n = [], defaultdict(int)
        for r in rows:
            k = r[2]
            if k in locked and running[k] + n[k] < LIMIT:
                n[k] += 1
                kept.append(r)
            elif k in locked:
                self.stats["held_under_lock"] += 1
            else:
                self.stats["key_skipped"] += 1
        return kept

    def claim_L_counter(self, trigger: bool = False) -> list[tuple]:
        head_sql = HEAD_WIDE if self.a.get("wide") else HEAD
        parts = [(COUNTERS, (self.queue,)), (head_sql, (self.queue, 3 * self.batch))]
        res = self.send(self.ack_part() + parts)
        if trigger:
            freed: dict = {}  # the triggers changed the counters in this transaction already
        elif self.acks and res[0][0] != len(self.acks):
            self.conn.rollback()  # an ack fenced out: count what it really freed on the server
            freed = self.ack_fenced_out()
            res = self.send(parts)
        else:
            freed = self.acked_keys()
        counters = {k: n - freed.get(k, 0) for k, n in res[-2][1]}
        head = res[-1][1]
        free = {k: LIMIT - n for k, n in counters.items() if n < LIMIT}
        ids, keys = self.grant_in_key_groups([(h[0], h[1], i) for i, h in enumerate(head)], free)
        if len(ids) < self.batch and len(head) == 3 * self.batch:
            # free keys whose jobs lie past the head: their first jobs by ix_key dives
            seen = {h[1] for h in head}
            more = {k: f for k, f in free.items() if k not in seen and self.empty_keys.get(k, 0) <= self.n_claims}
            if more:
                self.stats["dives"] += 1
                dparts = []
                for off in range(LIMIT):
                    ks = [k for k, f in more.items() if f > off]
                    if ks:
                        dparts.append((FIRSTS_PART.format(off=off, keys=marks(len(ks))),
                                       (self.queue, self.queue, *ks)))
                sql = " UNION ALL ".join(f"({p[0]})" for p in dparts)
                (_, cand), = self.send([(sql, tuple(x for p in dparts for x in p[1]))])
                found = {c[1] for c in cand}
                for k in more:  # a key a dive found without ready jobs is not dived again for 8 claims
                    if k not in found:
                        self.empty_keys[k] = self.n_claims + 8
                room_ids, _ = self.grant_in_key_groups([(c[0], c[1], (c[2], c[3], c[0])) for c in cand], more)
                ids += room_ids[:self.batch - len(ids)]
                taken = set(ids)
                keys += list(dict.fromkeys(c[1] for c in cand if c[0] in taken))
        if not ids:
            if freed:
                self.finish([], self.counter_update({}, freed))
                return []
            return self.finish([])
        res = self.send([(KEY_LOCK_COUNTER.format(marks(len(keys))), (self.queue, *keys)),
                         (LOCK.format(marks(len(ids))), tuple(ids))])
        under = {k: n - freed.get(k, 0) for k, n in res[0][1]}
        kept = self.keep(res[1][1], set(under), under)
        if trigger:
            return self.finish(kept)
        granted: dict = defaultdict(int)
        for r in kept:
            granted[r[2]] += 1
        return self.finish(kept, self.counter_update(granted, freed))

    def counter_update(self, granted: dict, freed: dict) -> list[tuple[str, tuple]]:
        net = {k: granted.get(k, 0) - freed.get(k, 0) for k in set(granted) | set(freed) if k is not None}
        net = {k: d for k, d in sorted(net.items()) if d}
        if not net:
            return []
        self.stats["counter_rows"] += len(net)
        case = " ".join("WHEN %s THEN %s" for _ in net)
        params = tuple(x for k, d in net.items() for x in (k, d))
        return [(COUNTER_ADD.format(case, marks(len(net))), (*params, self.queue, *net))]

    def claim(self) -> list[tuple]:
        side = self.a["side"]
        if side in ("U", "U_unkeyed"):
            return self.claim_U()
        if side == "L_count":
            return self.claim_L_count()
        if side == "L_counter":
            return self.claim_L_counter()
        if side == "L_trigger":
            return self.claim_L_counter(trigger=True)
        raise ValueError(side)

    def run(self) -> dict:
        t0, c0 = time.time(), time.process_time()
        n = empty = 0
        last = t0
        while True:
            carried = bool(self.acks)
            try:
                rows = self.claim()
            except Retry:
                continue
            if carried:
                last = time.time()  # the COMMIT that carried the last batch's ack
            self.stats["claims"] += 1
            self.n_claims += 1
            if rows:
                for _id, text, _key in rows:
                    json.loads(text)  # the no-op handler's part: the payload decoded
                n += len(rows)
                continue
            empty += 1
            self.cur.execute(ANY_READY, (self.queue,))
            ready = self.cur.fetchone()[0]
            self.conn.commit()
            if not ready:
                break
            time.sleep(0.001)  # jobs ready but none claimable now (peers' key locks or limits)
        self.conn.close()
        return {"pid": os.getpid(), "n": n, "empty": empty, "start": t0, "end": last,
                "cpu_s": time.process_time() - c0, **self.stats}


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    claimer = Claimer(args)
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(claimer.run()), flush=True)
