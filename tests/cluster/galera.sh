#!/usr/bin/env bash
# Hold a throwaway 3-node MariaDB Galera cluster on loopback until Ctrl-C, for trying things by
# hand; it prints each node's DSN and ports, and removes everything when stopped.
#   tests/cluster/galera.sh up [--nodes N] [--flush-log-at-trx-commit 0|1|2]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "$here/../../.venv/bin/python" "$here/galera.py" "$@"
