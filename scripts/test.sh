#!/usr/bin/env bash
# Run the test suite: prepare the machine and .venv, check the import layers (lint-imports,
# contracts in pyproject.toml), build the docs (mkdocs --strict), then pytest (config in
# pyproject.toml). The suite includes tests/system/test_wheel_install.py: it builds the wheel,
# installs it (not editable) into a fresh venv and runs init, produce, consume and status from
# there, as `pip install .` users do.
# Extra arguments go to pytest, e.g. scripts/test.sh -k restart -x
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
.venv/bin/lint-imports --no-cache
# The documentation site builds strictly: a broken link or anchor, or a page missing from the
# nav, fails here (mkdocs.yml; the site goes to a temporary directory). Not --quiet: it hides the
# warnings that --strict counts, and the build passes.
site="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$site"
rm -rf "$site"
.venv/bin/python -m pytest "$@"
# The whole suite (no arguments) then runs the integration tests that a server's defaults can
# change once more, on a private server started with MySQL 8.0's defaults where MariaDB has
# them (autoinc lock mode 2, strict sql_mode, REPEATABLE READ, ROW binlog, utf8mb4): the
# nearest this machine comes to MySQL, which it cannot install (docs/compatibility.md).
if [ "$#" -eq 0 ]; then
    NOTIFYQ_TEST_SERVER_PROFILE=mysql80 .venv/bin/python -m pytest -p no:cacheprovider \
        tests/integration/test_server_profile.py tests/integration/test_enqueue.py \
        tests/integration/test_claim.py tests/integration/test_dedup_keys.py \
        tests/integration/test_store_edges.py tests/integration/test_taking_back.py
fi
