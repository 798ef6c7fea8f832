"""The counting rows the tests and the benchmarks fill tables from (tests/number_rows.py) are
exactly first..last, whatever the range's length and distance from 1."""

import pytest
from number_rows import numbers


@pytest.mark.parametrize("first, last", [(1, 1), (1, 10), (1, 11), (7, 1006), (900_001, 1_000_000), (5, 4)])
def test_the_rows_run_from_first_to_last_once_each(db, first, last):
    # Given a range; When the server counts it
    rows = db.query(f"SELECT seq FROM {numbers(last, first)}")
    # Then every number in it comes once, and no other
    assert sorted(r[0] for r in rows) == list(range(first, last + 1))


def test_a_count_alone_starts_at_one(db):
    assert db.query(f"SELECT MIN(seq), MAX(seq), COUNT(*) FROM {numbers(20_005)}") == [(1, 20_005, 20_005)]
