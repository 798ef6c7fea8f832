"""`notifyq status --locks` on a server that does not show advisory locks (the shared server runs
with performance_schema off; a default MariaDB does): one line says why, status works as before.
(A server that shows them: tests/fault/test_status_locks.py.)"""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from notifyq.ops import status
from notifyq.store.db import Session


def _shows_locks(db) -> bool:
    [(on,)] = db.query("SELECT @@performance_schema")
    if not int(on):
        return False
    return db.scalar("SELECT ENABLED FROM performance_schema.setup_instruments "
                     "WHERE NAME = 'wait/lock/metadata/sql/mdl'") == "YES"


def test_without_performance_schema_status_locks_says_so_in_one_line_and_works(db):
    if _shows_locks(db):
        pytest.skip("this server shows metadata locks")
    # Given a queue with a job, read as root (who may read performance_schema: only its being off is in the way)
    assert run_cli(db.env, "produce", "-q", "mail", input='{"n": 1}\n').returncode == 0
    session = Session(db.admin, autocommit=True)
    try:
        data = status.collect(session, locks=True)
    finally:
        session.close()
    # Then the locks say why they are not shown, and the figures are the ones without --locks
    assert data["locks"]["unavailable"].startswith("performance_schema is OFF")
    assert data["queues"]["mail"]["ready"] == 1
    assert status.render(data).splitlines()[-1].startswith("locks: not shown: performance_schema is OFF")


def test_the_cli_prints_the_one_line_and_exits_zero_as_the_runtime_user(db):
    assert run_cli(db.env, "produce", "-q", "mail", input='{"n": 1}\n').returncode == 0
    plain = run_cli(db.env, "status")
    shown = run_cli(db.env, "status", "--locks")
    assert shown.returncode == 0, shown.stderr
    # (the ages move between the two runs: compare the lines' count and the table's head)
    lines = shown.stdout.splitlines()
    assert len(lines) == len(plain.stdout.splitlines()) + 1 and lines[0] == plain.stdout.splitlines()[0]
    assert lines[-1].startswith("locks: not shown: "), shown.stdout
    as_json = run_cli(db.env, "status", "--locks", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["locks"]["unavailable"]
    assert "locks" not in json.loads(run_cli(db.env, "status", "--json").stdout)  # read on demand only
