"""`notifyq status --locks`: what each of notifyq's advisory locks means, who holds it and who waits,
from the rows performance_schema.metadata_locks gives (ops/locks.py); no server here."""

from __future__ import annotations

from notifyq.ops import locks as lock_view
from notifyq.store import locks
from notifyq.store.metadata_locks import LockRow, Reading

DB = "shop"
ALICE = {"id": "a" * 32, "host": "web1", "pid": 101}
BOB = {"id": "b" * 32, "host": "web2", "pid": 202}


def _describe(rows: list[LockRow], queues=("mail",), consumers=(ALICE, BOB)):
    known = lock_view.known_locks(DB, list(queues), list(consumers))
    return lock_view.describe(known, Reading(rows), list(consumers))


def test_a_queues_watch_lock_names_its_holder_by_the_liveness_lock_on_the_same_connection():
    # Given alice's home session (conn 11) holding her liveness lock and mail's watch lock, and
    # bob's watcher (conn 22) waiting for the watch lock
    watch = locks.QueueLocks(DB, "mail").watch
    rows = [LockRow(watch, True, 11, "nq", "10.0.0.1", 30), LockRow(watch, False, 22, "nq", "10.0.0.2", 4),
            LockRow(locks.consumer_lock(DB, ALICE["id"]), True, 11, "nq", "10.0.0.1", 30)]
    data = _describe(rows)
    # Then mail's watch lock is held by the watcher, alice, and bob's connection waits in line
    [entry] = data["queues"]["mail"]
    assert entry["lock"] == "watch" and entry["held"].startswith("watcher")
    assert entry["holder"]["connection"] == 11 and entry["holder"]["who"] == "consumer aaaaaaaaaaaa (web1:101)"
    assert [(w["connection"], w["who"], w["for_s"]) for w in entry["waiting"]] == [(22, None, 4)]
    # and the liveness lock is the database's, meaning alice is alive
    [alive] = data["database"]
    assert alive["lock"] == "liveness" and alive["held"] == "liveness of consumer aaaaaaaaaaaa (web1:101)"
    text = "\n".join(lock_view.render(data))
    assert "liveness of consumer aaaaaaaaaaaa (web1:101): conn 11 nq@10.0.0.1\n" in text + "\n"
    assert "queue mail:" in text and "watcher: the idle consumer that claims next: conn 11 nq@10.0.0.1 = consumer" in text
    assert "waiting (idle consumers in line to watch): conn 22 nq@10.0.0.2, waited 4s" in text


def test_bells_ringer_leader_reaper_and_hashed_names_map_to_their_meaning():
    # Given a queue whose name is not plain (its lock names are hashed), a ringing producer on
    # conn 5 (the ringer lock and bell 1), the watcher waiting on bell 1, a periodic leader, a reaper
    q = locks.QueueLocks(DB, "Mail")
    assert q.watch.startswith("nq:watch:")  # hashed: the mapping computes names, never parses them
    rows = [LockRow(q.ringer, True, 5, "app", "h", 1), LockRow(q.bells[1], True, 5, "app", "h", 1),
            LockRow(q.bells[1], False, 11, "nq", "h", 2), LockRow(q.periodic, True, 12, "nq", "h", 9),
            LockRow(locks.reaper_lock(DB), True, 13, "nq", "h", 0)]
    data = _describe(rows, queues=("Mail",))
    kinds = {e["lock"]: e for e in data["queues"]["Mail"]}
    assert set(kinds) == {"ringer", "bell1", "cron"}
    assert kinds["bell1"]["holder"]["connection"] == 5
    assert kinds["bell1"]["waiting"][0]["connection"] == 11
    assert kinds["bell1"]["waited"] == "the watcher, waiting for a ring"
    assert kinds["cron"]["held"].startswith("periodic leader")
    assert [e["lock"] for e in data["database"]] == ["reaper"]


def test_locks_of_other_databases_and_queues_are_left_out():
    other = locks.QueueLocks("elsewhere", "mail").watch
    data = _describe([LockRow(other, True, 3, "x", "h", 1)])
    assert data == {"unavailable": None, "queues": {}, "database": []}
    assert lock_view.render(data)[-1] == "  none held or waited on"


def test_a_server_that_cannot_show_locks_gives_one_line():
    known = lock_view.known_locks(DB, ["mail"], [])
    data = lock_view.describe(known, Reading([], "performance_schema is OFF on this server"), [])
    assert data["unavailable"] == "performance_schema is OFF on this server"
    assert lock_view.render(data) == ["locks: not shown: performance_schema is OFF on this server"]


def test_over_shards_each_shards_locks_are_its_own_in_json_and_in_the_table():
    from notifyq.ops import status
    from notifyq.sharding import status as sharded

    watch = locks.QueueLocks(DB, "mail").watch
    held = _describe([LockRow(watch, True, 11, "nq", "h", 1)])
    off = lock_view.describe({}, Reading([], "performance_schema is OFF on this server"), [])
    one = {"server_time": None, "queues": {"mail": status.blank()}, "consumers": [], "wakeup_degraded": [],
           "periodic": []}
    data = sharded.merge({"a": {**one, "locks": held}, "b": {**one, "locks": off}}, {})
    assert data["locks"] == {"by_shard": {"a": held, "b": off}}
    text = sharded.render(data)
    assert "shard a locks (performance_schema.metadata_locks):" in text
    assert "shard b locks: not shown: performance_schema is OFF on this server" in text
    assert text.count("not shown") == 1  # the one-server rendering does not print them again
