#!/usr/bin/env bash
# Run the test suite: prepare the machine and .venv, check the import layers (lint-imports,
# contracts in pyproject.toml), build the docs (mkdocs --strict), then pytest (config in
# pyproject.toml). The suite includes tests/system/test_wheel_install.py: it builds the wheel,
# installs it (not editable) into a fresh venv and runs init, produce, consume and status from
# there, as `pip install .` users do.
# Extra arguments go to pytest (one run, in one process), e.g. scripts/test.sh -k restart -x
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
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
# The whole suite. Most tests wait (for a server, a process, a lease) more than they compute,
# and each pytest-xdist worker starts its own private server (tests/conftest.py) in which every
# test has a database of its own: the unit, integration, apps, web and system tiers run on
# $NOTIFYQ_TEST_WORKERS workers (3 by default: most tests wait rather than compute, so on 2
# cores 3 finish sooner than 2; 0 runs them in one process), a file's tests on one worker (--dist
# loadfile: a module's fixtures, such as test_shards.py's two servers, are built once).
# Then the integration tests that a server's defaults can change run once more, on private
# servers started with MySQL 8.0's defaults where MariaDB has them (autoinc lock mode 2, strict
# sql_mode, REPEATABLE READ, ROW binlog, utf8mb4): the nearest this machine comes to MySQL,
# which it cannot install (docs/compatibility.md).
# Then the fault and Galera tiers run alone, in one process: they start private servers per
# test or per module and time recoveries against bounds, which no other test's load may
# stretch. Every part runs even when one fails; the script fails if any did.
workers="${NOTIFYQ_TEST_WORKERS:-3}"
parallel=()
[ "$workers" = 0 ] || parallel=(-n "$workers" --dist loadfile)
status=0
.venv/bin/python -m pytest "${parallel[@]}" --ignore=tests/fault --ignore=tests/cluster || status=$?
NOTIFYQ_TEST_SERVER_PROFILE=mysql80 .venv/bin/python -m pytest -p no:cacheprovider "${parallel[@]}" \
    tests/integration/test_server_profile.py tests/integration/test_enqueue.py \
    tests/integration/test_claim.py tests/integration/test_dedup_keys.py \
    tests/integration/test_store_edges.py tests/integration/test_taking_back.py \
    tests/integration/test_explain_large.py || status=$?
.venv/bin/python -m pytest -p no:cacheprovider tests/fault tests/cluster || status=$?
exit "$status"
