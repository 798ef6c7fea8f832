"""What the test suite's second run, on a server with MySQL 8.0's defaults
(NOTIFYQ_TEST_SERVER_PROFILE=mysql80, scripts/test.sh), relies on: that server really has them,
and the ids a multi-row INSERT's jobs get are computed right under interleaved auto-increment
locking (innodb_autoinc_lock_mode = 2, MySQL 8's default) with producers racing, on the path
MySQL takes (no RETURNING: the first id and @@auto_increment_increment)."""

from __future__ import annotations

import json
import os
import threading

import pytest

from notifyq.produce.producer import Producer
from notifyq.store import inserts

PROFILE = os.environ.get("NOTIFYQ_TEST_SERVER_PROFILE", "")


@pytest.mark.skipif(PROFILE != "mysql80", reason="runs on the MySQL-defaults profile server only")
def test_the_profile_server_runs_with_mysql_80s_defaults(db):
    [(mode, isolation, binlog, fmt, charset, sql_mode)] = db.query(
        "SELECT @@innodb_autoinc_lock_mode, @@global.tx_isolation, @@log_bin, @@binlog_format, "
        "@@character_set_server, @@sql_mode")
    assert (int(mode), isolation, int(binlog), fmt, charset) == (2, "REPEATABLE-READ", 1, "ROW", "utf8mb4")
    assert "STRICT_TRANS_TABLES" in sql_mode and "ONLY_FULL_GROUP_BY" in sql_mode


def test_racing_multi_row_puts_get_the_ids_of_the_rows_they_stored_without_returning(db, monkeypatch):
    # Given four producers on the path a MySQL server takes (ids from the first one and the
    # increment, no RETURNING), each putting 100-row batches at the same time
    monkeypatch.setattr(inserts, "returns_ids", lambda conn: False)
    cfg = db.config()
    got: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            with Producer("q", cfg) as p:
                ids = []
                for batch in range(10):
                    ids += p.put_many([{"p": n, "i": batch * 100 + i} for i in range(100)])
                got[n] = ids
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(got) == 4
    # Then every id a put returned is the row of the payload it was given, in order
    stored = {job_id: json.loads(payload) for job_id, payload in db.query("SELECT id, payload FROM nq_job")}
    assert len(stored) == 4000
    for n, ids in got.items():
        assert [stored[job_id] for job_id in ids] == [{"p": n, "i": i} for i in range(1000)]
