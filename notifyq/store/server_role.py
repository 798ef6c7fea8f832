"""Whether a server may be notifyq's writer: MySQL Group Replication (InnoDB Cluster) and the
read-only switches, asked at every connect (store.db). notifyq's wake-ups and liveness stand
on named locks (GET_LOCK), which a group does not certify across its members: two members
would each grant the same lock, so a group must be single-primary and notifyq must write
through its primary only. A server that is read-only for everyone (super_read_only) or that
refuses ordinary users (offline_mode) is no writer either.

The answer comes from the connection's first round trip on MySQL (queries.sql
writer_variables: a SHOW that lists only the variables the server has); MariaDB has none of
them, which its handshake's version says, so nothing is asked there (the SHOW doubled that
round trip's time on MariaDB: p50 0.47 -> 0.99 ms). Only a member of a replication group is
asked one more thing, its role (group_member). `refusal` decides, from those answers alone: a
pure function, tested on recorded answers (tests/unit)."""

from __future__ import annotations

from collections.abc import Mapping

GROUP_NAME = "group_replication_group_name"
IN_GROUP = ("ONLINE", "RECOVERING")  # member states of a server that is part of its group now


def has_writer_variables(server_info: str) -> bool:
    """Whether the server (its version, from the handshake) has the variables refusal reads:
    MySQL (and its forks) has them, MariaDB none."""
    return "mariadb" not in server_info.lower()


def in_group(variables: Mapping[str, str]) -> bool:
    """Whether the server belongs to a replication group, so that its role must be asked."""
    return bool(variables.get(GROUP_NAME, "").strip())


def refusal(variables: Mapping[str, str], member: tuple[str, str] | None = None) -> str | None:
    """Why notifyq must not write through this server, or None.

    variables: SHOW GLOBAL VARIABLES' answer, {lower-case name: value}, of writer_variables;
    member: (MEMBER_ROLE, MEMBER_STATE) of this server in its group (group_member), None when
    it was not asked or has no row."""
    if _on(variables.get("offline_mode")):
        return ("offline_mode is ON: the server is being taken out of service (it refuses ordinary users' "
                "connections); connect to another server")
    role, state = (str(member[0]).upper(), str(member[1]).upper()) if member else ("", "")
    if in_group(variables) and state in IN_GROUP:
        if not _on(variables.get("group_replication_single_primary_mode", "ON")):
            return ("the server is a member of a multi-primary Group Replication group: notifyq's named locks "
                    "(GET_LOCK) are not certified across members, so two of them could grant the same lock; "
                    "run the group in single-primary mode")
        if role != "PRIMARY":
            return (f"the server is a {role.lower() or 'non-primary'} member of its Group Replication group, "
                    "not its primary: connect to the primary (MySQL Router's read-write port)")
    if _on(variables.get("super_read_only")):
        return ("super_read_only is ON: the server takes no writes (a replica, or a group member not yet or no "
                "longer primary); connect to the primary")
    return None


def _on(value: str | None) -> bool:
    return str(value or "").strip().upper() in ("ON", "1", "TRUE", "YES")
