#!/usr/bin/env bash
# Run the test suite: prepare the machine and .venv, then pytest (config in pyproject.toml).
# Extra arguments go to pytest, e.g. scripts/test.sh -k restart -x
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec .venv/bin/python -m pytest "$@"
