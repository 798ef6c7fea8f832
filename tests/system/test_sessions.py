"""Database sessions of one `notifyq consume` process: at most workers + queues + 1.

The process runs as a database user of its own, so every PROCESSLIST row of that user is one of
its sessions (benchmarks/_sessions.py counts the same way). The count is sampled from the spawn
until the process sits idle, every worker asleep: the peak is what a server's max_connections
must allow for.
"""

from __future__ import annotations

import signal
import subprocess
import uuid

import pytest
from conftest import RUNTIME_PASSWORD, admin_connect, notifyq_cmd, wait_until

from notifyq.store import schema
from notifyq.store.locks import QueueLocks

SESSIONS = "SELECT INFO FROM information_schema.PROCESSLIST WHERE USER = %s"


@pytest.fixture
def own_user(db):
    """A user only the consumer under test logs in as, with the runtime grants on db."""
    user = f"nqs_{uuid.uuid4().hex[:8]}"
    conn = admin_connect(db.admin)
    cur = conn.cursor()
    for host in ("%", "localhost"):
        cur.execute(f"CREATE USER '{user}'@'{host.replace('%', '%%')}' IDENTIFIED BY %s", (RUNTIME_PASSWORD,))
        for grant in schema.grants(db.admin.database, f"'{user}'@'{host}'"):
            cur.execute(grant)
    try:
        yield user
    finally:
        for host in ("%", "localhost"):
            cur.execute(f"DROP USER IF EXISTS '{user}'@'{host}'")
        conn.close()


@pytest.mark.parametrize("queues, workers, polling", [(("a",), 4, False), (("a", "b", "c"), 2, False),
                                                     (("a", "b", "c"), 2, True)])
def test_a_consumer_process_opens_at_most_one_session_per_worker_and_per_queue_plus_one(
        db, own_user, tmp_path, queues, workers, polling):
    # Given a consumer process of `workers` workers per queue, logged in as a user of its own
    dsn = db.env["NOTIFYQ_DSN"].replace(f"//{db.dsn.user}@", f"//{own_user}@", 1)
    argv = notifyq_cmd("consume", "--handler", "nqhandlers:record", "--workers", str(workers),
                       *[arg for q in queues for arg in ("-q", q)])
    conf = tmp_path / "notifyq.toml"
    conf.write_text("[wakeup]\npoll_max_s = 0.5\n" + ("use_locks = false\n" if polling else ""))
    with open(tmp_path / "consumer.err", "w") as err:
        proc = subprocess.Popen(argv, env={**db.env, "NOTIFYQ_DSN": dsn, "NOTIFYQ_CONFIG": str(conf),
                                           "NQ_TEST_OUT": str(tmp_path)},
                                stdout=subprocess.DEVNULL, stderr=err)
    limit = workers * len(queues) + len(queues) + 1
    # Every work session and each queue's watcher (the first one holds the liveness lock); a
    # polling process holds no lock, and beats on a heartbeat session instead.
    settled = limit if polling else limit - 1
    peak = 0
    watches = [QueueLocks(db.dsn.database, q).watch for q in queues]

    def asleep() -> bool:
        """Sampled on every call: the peak so far; True once each queue has its watcher."""
        nonlocal peak
        assert proc.poll() is None, (tmp_path / "consumer.err").read_text()
        infos = [info or "" for (info,) in db.query(SESSIONS, (own_user,))]
        peak = max(peak, len(infos))
        held = db.query("SELECT " + ", ".join(["IS_USED_LOCK(%s)"] * len(watches)), tuple(watches))[0]
        return (polling or all(held)) and len(infos) >= settled

    try:
        # When it starts and every worker falls asleep (each queue watched or polled)
        wait_until(asleep, 60, 0.01, f"the consumer settled at {settled} sessions")
        for _ in range(50):  # and some more samples of the idle process
            asleep()
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    # Then it never held more than workers + queues + 1 sessions (the seed held 2 per worker)
    assert peak <= limit, f"peak {peak} sessions, limit {limit}"
    assert code == 0
