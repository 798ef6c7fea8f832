#!/usr/bin/env bash
# The Galera cluster harness from the shell (python -m cluster, with tests/ on the path):
#   tests/cluster/galera.sh up [--nodes N] [--flush-log-at-trx-commit 0|1|2]
#       hold a throwaway cluster on loopback until Ctrl-C; prints each node's DSN and ports
#   tests/cluster/galera.sh observe [--commits N] [--kills N] [--latency-only]
#       measure what Galera does to notifyq's assumptions (observe.py), then remove everything
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONPATH="$here/..${PYTHONPATH:+:$PYTHONPATH}"
exec "$here/../../.venv/bin/python" -m cluster "$@"
