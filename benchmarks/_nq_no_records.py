"""`notifyq consume` with the ack's attempt record left out: cost.py's "no_records" variant,
which prices what every ack pays for that record. A benchmark's patch, never a setting."""

from __future__ import annotations

from notifyq.store import queries

_statements = queries.Acks.statements


def _without_record(self):
    return [s for s in _statements(self) if s[0] not in (queries.Q["attempt_acked"], queries.Q["attempt_acked_dense"])]


queries.Acks.statements = _without_record
queries.Acks.COUNTED = 0

if __name__ == "__main__":
    import sys

    from notifyq.run.cli import main

    sys.argv[0] = "notifyq"
    main()
