#!/usr/bin/env bash
# Run the test suite: prepare the machine and .venv, check the import layers (lint-imports,
# contracts in pyproject.toml), then pytest (config in pyproject.toml).
# Extra arguments go to pytest, e.g. scripts/test.sh -k restart -x
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest "$@"
