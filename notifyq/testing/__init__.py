"""notifyq.testing: an app's tests run its jobs in the test's own process, on the test's real
database, with no daemon (docs/testing.md).

    from notifyq import testing

    send_email.enqueue("a@example.com")
    testing.assert_enqueued(config, "emails", task=send_email, args=["a@example.com"])
    result = testing.drain(config, "emails")          # runs them here, until none is ready
    assert result.done == 1

The pytest fixtures are in notifyq.testing.pytest (`pytest_plugins = ["notifyq.testing.pytest"]`);
importing this package does not import pytest.
"""

from notifyq.testing.drainer import Drained, DrainTimeout, Failure, drain
from notifyq.testing.harness import QueueHarness
from notifyq.testing.peek import QueuedJob, assert_enqueued, clear, ensure_schema, jobs

__all__ = ["DrainTimeout", "Drained", "Failure", "QueueHarness", "QueuedJob", "assert_enqueued", "clear",
           "drain", "ensure_schema", "jobs"]
