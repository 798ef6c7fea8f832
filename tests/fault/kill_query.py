"""The kill_query fault: a burst of KILL QUERY at the main deployment's consumer sessions.

What a producer's instant wake sends (notifyq/wakeup/waker.py, InstantWake), and a DBA's KILL QUERY, at random
moments: for BURST_S, as fast as one connection can, every other KILL goes to the session holding
the queue's watch lock (the instant wake's target, caught as it hands the watch on: between a
statement sent ahead and its reply) and the others to a random session of a random live consumer
(watcher, work, heartbeat). A KILL QUERY never loses or doubles a job by itself (an interrupted
statement is run again; a claim's COMMIT it fails is a lost claim, as a crash makes one); what it
found was a consumer waiting, with jobs ready, for a reply the server had dropped: the checker's
no_progress rule judges that, and no kill_query excuses it.
"""

from __future__ import annotations

import random
import time

import MySQLdb

BURST_S = 0.5


def burst(conn, watch_lock: str, sessions: dict[int, int], rng: random.Random) -> tuple[int, set[int]]:
    """KILL QUERY for BURST_S on `conn` (root); `sessions`: {connection id: consumer pid}.
    Returns (KILLs the server took, the pids hit)."""
    cur = conn.cursor()
    targets = sorted(sessions)
    sent, hit = 0, set()
    end = time.monotonic() + BURST_S
    while time.monotonic() < end:
        target = None
        if sent % 2 == 0:
            cur.execute("SELECT IS_USED_LOCK(%s)", (watch_lock,))
            target = cur.fetchone()[0]
        if target is None and targets:
            target = rng.choice(targets)
        if target is None:
            break
        try:
            cur.execute(f"KILL QUERY {int(target)}")
        except MySQLdb.Error:  # ended meanwhile
            targets = [t for t in targets if t != target]
            continue
        sent += 1
        if int(target) in sessions:
            hit.add(sessions[int(target)])
    cur.close()
    return sent, hit
