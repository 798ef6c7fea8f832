"""`notifyq status --locks` on a server that shows advisory locks: a private MariaDB with
performance_schema on and the metadata-lock instrument enabled (MySQL 8.0's defaults; MariaDB's
are off). Two consumers of one queue: one watches it, the other's watcher waits in line; each
holds its liveness lock. A user without SELECT on performance_schema gets the one line."""

from __future__ import annotations

import json
import urllib.request

import pytest
from conftest import create_test_db, ensure_runtime_user, run_cli, wait_until

from notifyq.config import DSN
from notifyq.store.locks import QueueLocks
from notifyq.web import server
from .conftest import _started_server, recorder_env

SHOWS_LOCKS = ("--performance-schema=ON", "--performance-schema-instrument=wait/lock/metadata/sql/mdl=ON")


@pytest.fixture(scope="module")
def mdl_server(tmp_path_factory, server_template):
    srv = _started_server(tmp_path_factory.mktemp("fault-mdl") / "srv", server_template, SHOWS_LOCKS)
    yield srv
    srv.cleanup()


def _status(env) -> dict:
    done = run_cli(env, "status", "--locks", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_status_locks_shows_the_watcher_the_one_in_line_and_each_consumers_liveness(mdl_server, procs, tmp_path):
    root = DSN.parse(mdl_server.dsn)
    ensure_runtime_user(root)
    db = create_test_db(mdl_server.dsn)
    watch = QueueLocks(db.admin.database, "mail").watch
    env = recorder_env(db, tmp_path / "out")

    def waits_on_watch() -> int:
        return db.scalar("SELECT COUNT(*) FROM performance_schema.metadata_locks WHERE OBJECT_TYPE = "
                         "'USER LEVEL LOCK' AND OBJECT_NAME = %s AND LOCK_STATUS = 'PENDING'", (watch,))

    # Given two consumers of queue mail: the first watches it, the second's watcher waits in line
    procs.consumer(env, "mail")
    wait_until(lambda: db.scalar("SELECT IS_USED_LOCK(%s)", (watch,)), 60, 0.1, "the first consumer watching")
    procs.consumer(env, "mail")
    wait_until(lambda: waits_on_watch() == 1, 60, 0.1, "the second consumer's watcher in line")
    wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_consumer") == 2, 60, 0.1, "both registered")

    # When the runtime user, without SELECT on performance_schema, asks: one line says why
    denied = _status(db.env)["locks"]
    assert denied["unavailable"].startswith("user nq_runtime may not read performance_schema")
    assert denied["queues"] == {} and denied["database"] == []

    # When it may read performance_schema
    for host in ("%", "localhost"):
        db.query(f"GRANT SELECT ON performance_schema.* TO 'nq_runtime'@'{host}'")

    def watch_entry(data: dict) -> dict:
        [entry] = [e for e in data["locks"]["queues"].get("mail", []) if e["lock"] == "watch"]
        return entry

    # (the one in line asks again when its GET_LOCK times out: read until a reading catches it waiting)
    def in_line() -> dict | None:
        data = _status(db.env)
        return data if watch_entry(data)["waiting"] else None

    data = wait_until(in_line, 60, 0.2, "a status reading with the second consumer's watcher in line")
    consumers = {c["id"][:12] for c in data["consumers"]}
    assert data["locks"]["unavailable"] is None
    # Then queue mail's watch lock has one holder, named as the consumer on its connection
    entry = watch_entry(data)
    assert entry["name"] == watch and entry["held"].startswith("watcher")
    holder = entry["holder"]
    assert holder["who"].startswith("consumer ") and holder["who"].split()[1] in consumers
    assert holder["user"] == "nq_runtime"
    # and the other consumer's watcher (its home session: its liveness lock) waits in line
    [waiter] = entry["waiting"]
    assert waiter["who"].startswith("consumer ") and waiter["who"] != holder["who"]
    assert waiter["who"].split()[1] in consumers
    locks = data["locks"]
    # and each consumer's liveness lock is held by the connection named after it
    liveness = [e for e in locks["database"] if e["lock"] == "liveness"]
    assert sorted(e["holder"]["who"] for e in liveness) == sorted(
        f"consumer {c['id'][:12]} ({c['host']}:{c['pid']})" for c in data["consumers"])
    text = run_cli(db.env, "status", "--locks")
    assert text.returncode == 0, text.stderr
    assert "locks (performance_schema.metadata_locks):" in text.stdout
    assert "watcher: the idle consumer that claims next: conn " in text.stdout
    # And the status pages' consumers page shows them when asked (?locks=1)
    page = server.serve(db.config(), 0, "127.0.0.1", None)
    try:
        with urllib.request.urlopen(f"{page.url}/consumers?locks=1", timeout=30) as answer:
            body = answer.read().decode()
    finally:
        page.close()
    assert "<h2>Locks</h2>" in body and "Not shown" not in body
    assert "watcher: the idle consumer that claims next</td><td>conn " in body
    assert sum(f"= consumer {c['id'][:12]}" in body for c in data["consumers"]) == 2
