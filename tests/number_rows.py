"""Counting rows for fills done by the server itself (INSERT ... SELECT), in the tests and the
benchmarks alike, on MariaDB and MySQL.

MariaDB's seq_FIRST_to_LAST (its Sequence engine) does not exist on MySQL, and a recursive CTE
stops at MySQL's cte_max_recursion_depth (1000) there. A cross join of digit tables works on both.
The benchmarks put tests/ on their path to import this.
"""

from __future__ import annotations

DIGITS = "(SELECT 0 AS d UNION ALL " + " UNION ALL ".join(f"SELECT {i}" for i in range(1, 10)) + ")"


def numbers(last: int, first: int = 1) -> str:
    """A derived table `numbers` whose column seq runs first..last, for `INSERT ... SELECT ...
    FROM {numbers(n)}`. It joins only the digits the range's length needs, so a chunk far from 1
    costs what one near it does."""
    first, last = int(first), int(last)
    span = last - first  # seq = first + offset, offset 0..span; none when last < first
    places = len(str(max(0, span)))
    offset = " + ".join(f"d{i}.d * {10 ** i}" for i in range(places))
    tables = ", ".join(f"{DIGITS} AS d{i}" for i in range(places))
    # The bound on the leading digit is one table's own condition, so the server applies it before
    # the join: a span of 100000 joins 2 x 10^5 rows, not 10^6.
    top = places - 1
    return (f"(SELECT {first} + {offset} AS seq FROM {tables} "
            f"WHERE d{top}.d <= {max(0, span) // 10 ** top} AND {offset} <= {span}) AS numbers")
