"""pytest fixtures for an app's tests (docs/testing.md). Not loaded by itself: the app's root
conftest.py says `pytest_plugins = ["notifyq.testing.pytest"]` (or pytest runs with
`-p notifyq.testing.pytest`), so that installing notifyq never changes another project's test
run. The only module of notifyq that imports pytest.

- `notifyq_config`: the test database's Config. Override it in conftest.py; by default the
  project's database under Django with notifyq.contrib.django installed (its test database
  while tests run), else `notifyq.load_config()` ($NOTIFYQ_DSN, $NOTIFYQ_CONFIG).
- `notifyq_queue`: a QueueHarness on it (`drain`, `jobs`, `assert_enqueued`, `clear`), the
  schema created once per database, and every queue's jobs deleted before the test.
- `notifyq_drain`: `notifyq_queue.drain`.
"""

from __future__ import annotations

from typing import Any

import pytest

from notifyq.config import Config
from notifyq.testing.harness import QueueHarness
from notifyq.testing.peek import clear, ensure_schema
from notifyq.testing.target import config_of


@pytest.fixture
def notifyq_config() -> Config:
    """The database the other fixtures use: override this fixture to name another. Function
    scope on purpose: Django's test database exists only once pytest-django has set it up,
    which a session fixture would run before."""
    return config_of(None)


@pytest.fixture(scope="session")
def _notifyq_schemas_ready() -> set[tuple[Any, ...]]:
    return set()


@pytest.fixture
def notifyq_queue(notifyq_config: Config, _notifyq_schemas_ready: set[tuple[Any, ...]]) -> QueueHarness:
    """The harness on the test database, its queues empty."""
    config = config_of(notifyq_config)
    database = config.dsn.database
    # The fixture deletes every job of the database it is given: never one that is not a test's.
    if "test" not in database.lower():
        pytest.fail(f"notifyq_queue: database {database!r} has no 'test' in its name; notifyq_queue deletes "
                    f"every job there before each test: point notifyq_config at a test database (under "
                    f"pytest-django, mark the test django_db(transaction=True): its test database is "
                    f"set up first)", pytrace=False)
    where = (tuple(config.dsn.servers), config.dsn.unix_socket, database)
    if where not in _notifyq_schemas_ready:
        ensure_schema(config)
        _notifyq_schemas_ready.add(where)
    clear(config)
    return QueueHarness(config)


@pytest.fixture
def notifyq_drain(notifyq_queue: QueueHarness):
    """`notifyq_drain(queues, handler=None, **options)`: notifyq.testing.drain on the test database."""
    return notifyq_queue.drain
