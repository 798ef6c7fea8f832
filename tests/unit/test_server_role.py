"""store/server_role.py: whether a server may be notifyq's writer, decided from what a new
connection reads (writer_variables, and group_member on a member of a replication group).
No MySQL Group Replication here: the answers below are the ones such servers give, as
SHOW GLOBAL VARIABLES and performance_schema.replication_group_members print them (MySQL 8.0
manual, Group Replication: single-primary and multi-primary modes, InnoDB Cluster)."""

import pytest

from notifyq.store import server_role

# SHOW GLOBAL VARIABLES WHERE Variable_name IN (...) as each server answers it
MARIADB = {}  # none of the four exists there
MYSQL_PLAIN = {"offline_mode": "OFF", "super_read_only": "OFF"}  # no Group Replication plugin
GR_SINGLE_PRIMARY = {"offline_mode": "OFF", "super_read_only": "OFF",
                     "group_replication_group_name": "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa",
                     "group_replication_single_primary_mode": "ON"}
GR_SECONDARY = {**GR_SINGLE_PRIMARY, "super_read_only": "ON"}  # the group keeps secondaries read-only
GR_MULTI_PRIMARY = {**GR_SINGLE_PRIMARY, "group_replication_single_primary_mode": "OFF"}
GR_PLUGIN_NOT_CONFIGURED = {"offline_mode": "OFF", "super_read_only": "OFF", "group_replication_group_name": "",
                            "group_replication_single_primary_mode": "ON"}
REPLICA = {"offline_mode": "OFF", "super_read_only": "ON"}  # an async replica kept read-only
DRAINING = {"offline_mode": "ON", "super_read_only": "OFF"}


@pytest.mark.parametrize(("variables", "member"), [
    (MARIADB, None),
    (MYSQL_PLAIN, None),
    (GR_PLUGIN_NOT_CONFIGURED, None),
    (GR_SINGLE_PRIMARY, ("PRIMARY", "ONLINE")),
    # a group member whose group replication is stopped is a server on its own (no longer in
    # the group): only its read-only switches count
    ({**GR_SINGLE_PRIMARY}, ("SECONDARY", "OFFLINE")),
    ({**GR_MULTI_PRIMARY}, None),  # no row for this server: not in a group now
])
def test_a_server_notifyq_may_write_through_is_accepted(variables, member):
    assert server_role.refusal(variables, member) is None


@pytest.mark.parametrize(("variables", "member", "says"), [
    (GR_SECONDARY, ("SECONDARY", "ONLINE"), "secondary member of its Group Replication group, not its primary"),
    (GR_SECONDARY, ("SECONDARY", "RECOVERING"), "secondary member"),
    (GR_MULTI_PRIMARY, ("PRIMARY", "ONLINE"), "multi-primary Group Replication group"),
    (GR_MULTI_PRIMARY, ("PRIMARY", "RECOVERING"), "multi-primary"),
    (REPLICA, None, "super_read_only is ON"),
    (GR_SECONDARY, ("SECONDARY", "ERROR"), "super_read_only is ON"),  # left its group in error: read-only
    (DRAINING, None, "offline_mode is ON"),
    ({**GR_SECONDARY, "offline_mode": "ON"}, ("SECONDARY", "ONLINE"), "offline_mode is ON"),
])
def test_a_server_notifyq_must_not_write_through_is_refused_with_one_line_saying_why(variables, member, says):
    why = server_role.refusal(variables, member)
    assert why is not None and says in why and "\n" not in why


def test_only_a_member_of_a_group_is_asked_its_role():
    # the one round trip more is paid only on a server that has a group name
    assert [server_role.in_group(v) for v in (MARIADB, MYSQL_PLAIN, GR_PLUGIN_NOT_CONFIGURED, GR_SINGLE_PRIMARY)] \
        == [False, False, False, True]


@pytest.mark.parametrize(("server_info", "asked"), [
    ("10.11.6-MariaDB-0+deb12u1", False), ("11.4.2-MariaDB-log", False),
    ("8.0.36", True), ("8.4.0-commercial", True), ("8.0.35-27 Percona Server (GPL)", True),
])
def test_only_a_mysql_is_asked_the_variables(server_info, asked):
    # from the handshake's version: MariaDB pays nothing for the check
    assert server_role.has_writer_variables(server_info) is asked
