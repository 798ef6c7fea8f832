"""Schema version 5 (fewer index entries per job) upgrading a version-4 database with data in
place: the pending jobs keep their dedup keys, finished jobs free theirs, nothing else changes,
and an init interrupted anywhere in the migration can simply run again."""

from __future__ import annotations

from conftest import admin_connect

from notifyq.produce.producer import Producer
from notifyq.store import schema
from notifyq.store.sql import migrations, split_statements

TABLES = ("nq_job", "nq_dedup", "nq_queue", "nq_signal", "nq_consumer", "nq_periodic", "nq_attempt", "nq_meta",
          "nq_rate", "nq_rate_hold", "nq_step")


def _apply(db, versions) -> None:
    conn = admin_connect(db.admin, db.admin.database)  # one session: the statements share @nq_ddl
    try:
        for version, text in migrations():
            if version in versions:
                for statement in split_statements(text):
                    conn.cursor().execute(statement)
    finally:
        conn.close()


def _version_4(db) -> None:
    """The database as version 4 left it: the current tables dropped, migrations 1-4 applied."""
    db.query(f"DROP TABLE {', '.join(TABLES)}")
    _apply(db, range(1, 5))
    db.query("INSERT INTO nq_meta (name, value) VALUES ('schema_version', '4')")


def _indexes(db, table: str) -> set[str]:
    return {r[0] for r in db.query("SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS "
                                   "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s", (table,))}


def _columns(db, table: str) -> set[str]:
    return {r[0] for r in db.query("SELECT COLUMN_NAME FROM information_schema.COLUMNS "
                                   "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s", (table,))}


def test_init_upgrades_a_version_4_database_with_jobs_and_keys_in_place(db):
    # Given a version-4 database with jobs: keyed pending (ready, scheduled, claimed), keyed
    # finished (done, dead), and plain ones
    _version_4(db)
    assert "ux_dedup" in _indexes(db, "nq_job") and "bell" in _columns(db, "nq_queue")
    db.query("INSERT INTO nq_queue (queue) VALUES ('q')")
    db.query(
        "INSERT INTO nq_job (id, queue, status, run_at, max_attempts, payload, dedup_key, owner, "
        "                    lease_until, finished_at) VALUES "
        "(1, 'q', 0, NOW(6), 5, '{\"n\":1}', 'ready', NULL, NULL, NULL), "
        "(2, 'q', 1, NOW(6) + INTERVAL 1 HOUR, 5, '{\"n\":2}', 'later', NULL, NULL, NULL), "
        "(3, 'q', 2, NOW(6), 5, '{\"n\":3}', 'running', 'o', NOW(6) + INTERVAL 1 HOUR, NULL), "
        "(4, 'q', 3, NOW(6), 5, '{\"n\":4}', 'done', NULL, NULL, NOW(6)), "
        "(5, 'q', 4, NOW(6), 5, '{\"n\":5}', 'dead', NULL, NULL, NOW(6)), "
        "(6, 'q', 0, NOW(6), 5, '{\"n\":6}', NULL, NULL, NULL, NULL)")
    before = db.query("SELECT id, queue, status, run_at, payload, dedup_key, owner FROM nq_job ORDER BY id")

    # When `notifyq init` runs
    assert schema.init(db.admin) == (4, schema.code_version())

    # Then nq_job has the three indexes of version 5, the jobs are as they were, the pending
    # jobs' keys moved to nq_dedup, and nq_queue.bell is gone
    assert _indexes(db, "nq_job") == {"PRIMARY", "ix_state", "ix_key"}  # ix_key: version 7
    assert "dedup_active" not in _columns(db, "nq_job") and "bell" not in _columns(db, "nq_queue")
    assert db.query("SELECT id, queue, status, run_at, payload, dedup_key, owner FROM nq_job ORDER BY id") == before
    assert db.query("SELECT queue, dedup_key, job_id FROM nq_dedup ORDER BY job_id") == [
        ("q", "ready", 1), ("q", "later", 2), ("q", "running", 3)]
    # And the keys behave as before the upgrade: a pending job's key is held, a finished one's free
    with Producer("q", db.config()) as p:
        assert [p.put({}, dedup_key=k) for k in ("ready", "later", "running")] == [1, 2, 3]
        fresh = [p.put({}, dedup_key=k) for k in ("done", "dead")]
    assert min(fresh) > 6 and len(set(fresh)) == 2
    assert db.scalar("SELECT COUNT(*) FROM nq_dedup") == 5


def test_migration_5_runs_again_after_an_interrupted_init(db):
    # Given a version-4 database with a keyed pending job, upgraded, whose init stopped before
    # recording the version (the whole of migration 5 applied)
    _version_4(db)
    db.query("INSERT INTO nq_job (id, queue, status, run_at, max_attempts, payload, dedup_key) "
             "VALUES (1, 'q', 0, NOW(6), 5, '{}', 'k')")
    _apply(db, [5])
    # When `notifyq init` runs migration 5 again
    assert schema.init(db.admin) == (4, schema.code_version())
    # Then it is a no-op: the same indexes, the key still held by its job
    assert _indexes(db, "nq_job") == {"PRIMARY", "ix_state", "ix_key"}  # ix_key: version 7
    assert db.query("SELECT queue, dedup_key, job_id FROM nq_dedup") == [("q", "k", 1)]
    with Producer("q", db.config()) as p:
        assert p.put({}, dedup_key="k") == 1


def test_migration_5_runs_again_after_it_stopped_between_its_steps(db):
    # Given a version-4 database with a keyed pending job whose migration 5 stopped right after
    # copying the keys (the nq_job ALTER not yet run)
    _version_4(db)
    db.query("INSERT INTO nq_job (id, queue, status, run_at, max_attempts, payload, dedup_key) "
             "VALUES (1, 'q', 0, NOW(6), 5, '{}', 'k')")
    text = dict(migrations())[5]
    first_two = split_statements(text)[:5]  # CREATE TABLE; SET, PREPARE, EXECUTE, DEALLOCATE
    conn = admin_connect(db.admin, db.admin.database)
    try:
        for statement in first_two:
            conn.cursor().execute(statement)
    finally:
        conn.close()
    assert db.query("SELECT queue, dedup_key, job_id FROM nq_dedup") == [("q", "k", 1)]
    assert "ux_dedup" in _indexes(db, "nq_job")
    # When `notifyq init` runs
    assert schema.init(db.admin) == (4, schema.code_version())
    # Then the upgrade is complete and the key copied once
    assert _indexes(db, "nq_job") == {"PRIMARY", "ix_state", "ix_key"}  # ix_key: version 7
    assert db.query("SELECT queue, dedup_key, job_id FROM nq_dedup") == [("q", "k", 1)]


def test_init_upgrades_a_version_5_database_to_attempt_records_and_the_jobs_run_on(db):
    # Given a version-5 database (no attempt records) with a ready job
    db.query("DROP TABLE nq_attempt")
    db.query("UPDATE nq_meta SET value = '5' WHERE name = 'schema_version'")
    with Producer("q", db.config()) as p:
        job_id = p.put({"n": 1})
    # When `notifyq init` runs, twice (an interrupted init runs again)
    assert schema.init(db.admin) == (5, schema.code_version())
    _apply(db, [6])
    assert schema.init(db.admin) == (schema.code_version(), schema.code_version())
    # Then nq_attempt exists, and the job is still there to run
    assert "outcome" in _columns(db, "nq_attempt")
    assert db.query("SELECT id, status FROM nq_job") == [(job_id, 0)]


def test_init_upgrades_a_version_6_database_to_job_keys_and_runs_again(db):
    # Given a version-6 database (no job keys, nor version 7's flow table and index) with a ready job
    db.query("ALTER TABLE nq_job DROP INDEX ix_key, DROP COLUMN ready_key, DROP COLUMN key_prio, DROP COLUMN job_key")
    db.query("DROP TABLE nq_flow_key")
    db.query("UPDATE nq_meta SET value = '6' WHERE name = 'schema_version'")
    # (put as a version-6 producer did: this version's producers write job_key)
    db.query("INSERT INTO nq_job (queue, status, run_at, max_attempts, payload) VALUES ('q', 0, NOW(6), 5, '{}')")
    job_id = db.scalar("SELECT MAX(id) FROM nq_job")
    # When `notifyq init` runs, and migration 7 runs once more (an interrupted init runs again)
    assert schema.init(db.admin) == (6, schema.code_version())
    _apply(db, [7])
    # Then the column is there once, and the job is still there to run
    assert "job_key" in _columns(db, "nq_job")
    assert db.query("SELECT id, status, job_key FROM nq_job") == [(job_id, 0, None)]
    # and the flow table and ix_key are there once
    assert "ix_key" in _indexes(db, "nq_job") and db.query("SELECT COUNT(*) FROM nq_flow_key") == [(0,)]


def test_an_upgrade_names_every_table_each_version_adds_for_the_runtime_users_grants(db, caplog):
    # Given a version-4 database
    _version_4(db)
    # When `notifyq init` upgrades it
    with caplog.at_level("WARNING", logger="notifyq.schema"):
        assert schema.init(db.admin) == (4, schema.code_version())
    # Then each version that adds tables says which (code before: 6, 7 and 8, not 5's nq_dedup)
    said = {r.args[0]: r.args[1] for r in caplog.records if "adds tables" in r.msg}
    assert said == {5: "nq_dedup", 6: "nq_attempt", 7: "nq_flow_key, nq_rate, nq_rate_hold, nq_step",
                    8: "nq_edge"}


def test_init_upgrades_a_version_8_database_to_recorded_flow_settings_and_runs_again(db):
    # Given a version-8 database (consumers record no flow settings) with a consumer's row in it
    db.query("ALTER TABLE nq_consumer DROP COLUMN flow")
    db.query("UPDATE nq_meta SET value = '8' WHERE name = 'schema_version'")
    db.query("INSERT INTO nq_consumer (id, lock_name, host, pid, queues) VALUES ('c8', 'l', 'h', 1, 'api')")
    # When `notifyq init` runs, and migration 9 runs once more (an interrupted init runs again)
    assert schema.init(db.admin) == (8, schema.code_version())
    _apply(db, [9])
    # Then the column is there once, and the old row records nothing (unknown), its other columns kept
    assert "flow" in _columns(db, "nq_consumer")
    assert db.query("SELECT id, host, pid, queues, flow FROM nq_consumer") == [("c8", "h", 1, "api", None)]
