#!/usr/bin/env bash
# Run the test suite: prepare the machine and .venv, check the import layers (lint-imports,
# contracts in pyproject.toml), then pytest (config in pyproject.toml). The suite includes
# tests/system/test_wheel_install.py: it builds the wheel, installs it (not editable) into a
# fresh venv and runs init, produce, consume and status from there, as `pip install .` users do.
# Extra arguments go to pytest, e.g. scripts/test.sh -k restart -x
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest "$@"
