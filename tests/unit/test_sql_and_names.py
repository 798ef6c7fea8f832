"""The named-query file, lock names and the retry policy: pure functions."""

import random
import re
from pathlib import Path

from notifyq.consume import retry
from notifyq.store import locks
from notifyq.store.sql import QUERIES, migrations, parse, split_statements

PACKAGE = Path(__file__).resolve().parents[2] / "notifyq"
# The hot path, operators' statements, DDL: all in the store.
SQL_RUNNERS = {"store/queries.py", "store/completion.py", "store/inserts.py", "store/dedup.py", "store/bells.py",
               "store/liveness.py", "store/admin_queries.py", "store/advisory.py", "store/results.py", "store/rates.py",
               "store/steps.py", "store/schema.py", "store/slot_rows.py", "store/db.py",  # db: tls_cipher
               "store/workflows.py", "store/signal.py",
               "store/metadata_locks.py", "store/flow.py", "store/key_gate.py", "store/key_sweep.py",
               "store/count_trust.py"}  # status --locks


def test_parser_splits_named_blocks_and_drops_comments():
    q = parse("-- a --\n-- why a\nSELECT 1\n\n-- b --\nSELECT 2;\n")
    assert q == {"a": "SELECT 1", "b": "SELECT 2"}


def test_every_query_is_used_and_only_the_store_modules_and_schema_run_sql():
    users = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
             if "QUERIES" in p.read_text() and p.parent.name != "sql"}
    assert users == SQL_RUNNERS
    source = "".join((PACKAGE / name).read_text() for name in sorted(SQL_RUNNERS))
    literals = set(re.findall(r'"([a-z_]+)"', source))
    unused = set(QUERIES) - literals
    assert not unused, f"queries nobody runs: {unused}"


def test_no_query_interpolates_values():
    for name, text in QUERIES.items():
        assert "{" not in text and "'%s'" not in text, name


def test_migrations_are_numbered_and_split():
    versions = [v for v, _ in migrations()]
    assert versions == sorted(set(versions)) and versions[0] == 1
    statements = split_statements(migrations()[0][1])
    assert any("CREATE TABLE IF NOT EXISTS nq_job" in s for s in statements)
    assert all(s.lstrip().upper().startswith("CREATE") for s in statements)


def test_lock_names_fit_64_chars_include_the_database_and_never_collide():
    short = locks.lock_name("app", "watch", "emails")
    assert short == "nq:app:watch:emails"
    long = locks.lock_name("a_very_long_database_name_for_tests", "watch", "q" * 64)
    assert len(long) <= 64 and long.startswith("nq:watch:")
    assert locks.lock_name("db1", "watch", "Emails") != locks.lock_name("db1", "watch", "emails")
    assert locks.lock_name("db1", "watch", "q") != locks.lock_name("db2", "watch", "q")
    for name in (long, locks.lock_name("db", "watch", "MiXeD")):
        assert name == name.lower()  # MySQL folds case, MariaDB does not: never depend on it


def test_retry_delay_grows_is_capped_and_jittered():
    rng = random.Random(7)
    delays = [retry.backoff_s(n, 1.0, 60.0, rng) for n in range(1, 12)]
    assert all(0.5 * min(60, 2 ** (n - 1)) <= d <= min(60, 2 ** (n - 1)) for n, d in enumerate(delays, 1))
    assert retry.next_delay_s(5, 5, 1.0, 60.0) is None
    assert retry.next_delay_s(1, 5, 1.0, 60.0) is not None
