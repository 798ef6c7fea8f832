"""Named SQL: `-- name --` headers in queries.sql, parsed once (after procrastinate's sql/__init__.py)."""

import os
import re

# Files next to this module (importlib.resources would load zipfile at every start).
_HERE = os.path.dirname(os.path.abspath(__file__))

_HEADER = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split on `-- name --` lines; a block's other `--` comment lines are dropped."""
    parts = _HEADER.split(text)
    queries = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in queries:
            raise ValueError(f"query {name} defined twice")
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


def split_statements(text: str) -> list[str]:
    """A migration file: statements separated by ';' at line end, comments removed."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";\n") if s.strip().rstrip(";")]


def migrations() -> list[tuple[int, str]]:
    """(version, text) for every file in sql/migrations, in order."""
    folder = os.path.join(_HERE, "migrations")
    found = []
    for name in os.listdir(folder):
        if name.endswith(".sql"):
            found.append((int(name.split("_", 1)[0]), _read(os.path.join(folder, name))))
    return sorted(found)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


QUERIES = parse(_read(os.path.join(_HERE, "queries.sql")))
