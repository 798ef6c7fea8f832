"""docs/schema.md describes the schema `notifyq init` creates: every table and every column of it,
at the version the code migrates to (read from a fresh database, not from the migration files)."""

from __future__ import annotations

import re

from conftest import REPO

from notifyq.store import schema

PAGE = REPO / "docs" / "schema.md"


def test_the_schema_page_names_every_table_and_column_of_the_current_version(db):
    # Given the tables and columns of a database `notifyq init` made
    columns = db.query("SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.COLUMNS "
                       "WHERE TABLE_SCHEMA = DATABASE() ORDER BY TABLE_NAME, ORDINAL_POSITION")
    assert {t for t, _ in columns} >= {"nq_job", "nq_attempt", "nq_meta"}
    text = PAGE.read_text()
    # Then the page says which version it describes, and it is the code's
    assert f"schema version **{schema.code_version()}**" in text
    # And it names each table, and each column in the table's own section or row
    job_section = text.split("## `nq_job`", 1)[1].split("\n## ", 1)[0]
    missing = []
    for table, column in columns:
        if table == "nq_job":
            where = job_section
        else:
            row = re.search(rf"^\| `{table}` \|.*$", text, flags=re.MULTILINE)
            where = row.group(0) if row else ""
        if f"`{column}`" not in where:
            missing.append(f"{table}.{column}")
    assert missing == []
