"""Statements a piece of work cost the server, from SHOW GLOBAL STATUS before and after it.

The benchmark's server (a private LocalServer) serves nothing else, so a global delta is the
work's own count. `Questions` counts every statement a client sent, one per statement of a
multi-statement query; the Com_* counters say what kind they were. The observer's own
SHOW (the second one: the first is counted before it is read) is taken off.
"""

from __future__ import annotations

# DELETE t FROM t FORCE INDEX (...) is the multi-table form: Com_delete_multi, not Com_delete.
COUNTERS = ("Questions", "Com_select", "Com_insert", "Com_insert_select", "Com_update", "Com_update_multi",
            "Com_delete", "Com_delete_multi", "Com_begin", "Com_commit", "Com_rollback", "Com_set_option",
            "Com_show_status", "Com_do")
_SHOW = "SHOW GLOBAL STATUS WHERE Variable_name IN ({})".format(", ".join(["%s"] * len(COUNTERS)))


def snapshot(conn) -> dict[str, int]:
    cur = conn.cursor()
    cur.execute(_SHOW, COUNTERS)
    values = {name: int(value) for name, value in cur.fetchall()}
    cur.close()
    return values


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What happened between two snapshots, less the observer's own second SHOW."""
    out = {name: after[name] - before[name] for name in before}
    out["Questions"] -= 1
    out["Com_show_status"] -= 1
    return out


def per_job(counts: dict[str, int], jobs: int) -> dict[str, float]:
    return {name: value / jobs for name, value in counts.items() if value}
