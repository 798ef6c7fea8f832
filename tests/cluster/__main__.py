"""Command line of the Galera cluster harness (run it through tests/cluster/galera.sh):

    up       start a cluster, print how to reach each node, keep it until Ctrl-C / SIGTERM
    observe  measure what Galera does to notifyq's assumptions (observe.py), then remove it all
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from . import observe
from .galera import GaleraCluster


def _hold_up(args: argparse.Namespace) -> int:
    """`up`: start a cluster, print how to reach it, keep it until SIGINT/SIGTERM, remove it."""
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.append(signum))
    flush = {"flush_log_at_trx_commit": args.flush_log_at_trx_commit}
    cluster = GaleraCluster(args.nodes, **flush)
    started = time.monotonic()
    cluster.start()
    print(f"cluster of {args.nodes} Synced in {time.monotonic() - started:.1f}s under {cluster.basedir}")
    for n in cluster.nodes:
        print(f"node{n.index} pid={n.pid} {n.dsn} socket={n.socket_path} galera={n.ports.galera} "
              f"ist={n.ports.ist} sst={n.ports.sst}")
    print(f"all nodes: {cluster.multi_host_dsn()}", flush=True)
    try:
        while not stop:
            signal.pause()
    finally:
        cluster.destroy()
        print("cluster stopped and removed", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="galera.sh", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster and keep it until Ctrl-C / SIGTERM")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--flush-log-at-trx-commit", type=int, default=1, choices=(0, 1, 2))
    observe_parser = sub.add_parser("observe", help="measure Galera's effects on notifyq, then clean up")
    observe.add_arguments(observe_parser)
    args = parser.parse_args(argv)
    return _hold_up(args) if args.command == "up" else observe.run(args)


if __name__ == "__main__":
    sys.exit(main())
