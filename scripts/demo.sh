#!/usr/bin/env bash
# Run the live demo: prepare the machine and .venv, then `notifyq demo`.
# Extra arguments go to the demo command.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec .venv/bin/notifyq demo "$@"
