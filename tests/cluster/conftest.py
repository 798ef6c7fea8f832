"""Fixtures for tests against a real 3-node MariaDB Galera cluster on loopback (galera.py).

The cluster costs ~10 s to start on a 2-core machine, so the tests share one (`galera`, for the
session), and every test gets it back whole (`cluster`): a test that killed or paused a node and
then failed must not leave the next one a cluster of two. Each module works in a database of its
own. The fault schedule (test_cluster_fault_schedule.py) runs a cluster of its own, and runs first
(its file name sorts first), before the shared one starts: no idle cluster beside it.

tests/cluster is a package (it has __init__.py), like tests/fault: a package-less conftest.py would
be imported as plain `conftest` and shadow tests/conftest.py.
"""

from __future__ import annotations

import pytest

from .galera import GaleraCluster, missing_requirements

MISSING = missing_requirements()
# Applied by the test modules as `pytestmark`: the default suite runs them wherever the packages
# are installed (scripts/bootstrap.sh installs them) and says what is missing everywhere else.
requires_galera = pytest.mark.skipif(
    bool(MISSING), reason=f"needs {', '.join(MISSING)} for a Galera cluster (scripts/bootstrap.sh installs them)")


# A lost node is evicted after ~3.2 s instead of Galera's ~6.3 s: each kill or pause costs the
# suite half as much. Measurements of real failover times use the defaults (observe.py).
FAST_EVICTION = "evs.keepalive_period=PT0.5S;evs.suspect_timeout=PT2S;evs.inactive_timeout=PT4S"


@pytest.fixture(scope="session")
def galera() -> GaleraCluster:
    """Three nodes, Synced, for every cluster test; stopped and removed at the end."""
    cluster = GaleraCluster(3, provider_options=FAST_EVICTION)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def cluster(galera: GaleraCluster) -> GaleraCluster:
    """The module's cluster, with all three nodes running and Synced when the test starts."""
    galera.heal()
    return galera
