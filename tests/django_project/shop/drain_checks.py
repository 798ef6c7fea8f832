"""Run by tests/apps/test_testing.py as `manage.py test shop.drain_checks` (not a test*.py file:
`manage.py test shop` leaves it out). notifyq.testing under Django's test database: a
TransactionTestCase's puts commit, so drain runs them; a TestCase's stay in its transaction,
which only the test's own connection sees."""
from django.db import connection
from django.test import TestCase, TransactionTestCase

from notifyq import testing
from notifyq.contrib.django import enqueue_on_commit
from shop.models import Order
from shop.tasks import make_order


class DrainInTransactionTestCase(TransactionTestCase):
    def test_drain_runs_the_tasks_jobs_here_and_their_orm_writes_are_seen(self):
        testing.clear(None, "orders")
        make_order.enqueue("ada", copies=2)
        enqueue_on_commit("orders", {"task": make_order.name, "args": ["bob"], "kwargs": {}})
        testing.assert_enqueued(None, "orders", task=make_order, count=2)
        result = testing.drain(None, "orders")
        self.assertEqual((result.done, result.failed), (2, 0))
        self.assertEqual(sorted(o.name for o in Order.objects.all()), ["ada", "ada", "bob"])
        self.assertEqual(testing.jobs(None, "orders"), [])


class InTestCaseOnlyTheTestsConnectionSeesItsJobs(TestCase):
    def test_a_job_put_in_the_testcase_transaction_is_pending_on_its_connection_only(self):
        enqueue_on_commit("orders", {"task": make_order.name, "args": ["cy"], "kwargs": {}})
        testing.assert_enqueued(None, "orders", task=make_order, args=["cy"], conn=connection)
        self.assertEqual(testing.jobs(None, "orders"), [])  # another session: not committed
        self.assertEqual(testing.drain(None, "orders").ran, 0)

    def test_a_job_put_by_notifyqs_own_session_commits_and_runs_into_the_testcase_transaction(self):
        testing.clear(None, "orders")
        make_order.enqueue("dee")  # the registry's producer: its own session, committed at once
        self.assertEqual(testing.drain(None, "orders").done, 1)
        # the handler ran on this thread: its ORM write is in this test's transaction, seen here
        self.assertEqual([o.name for o in Order.objects.all()], ["dee"])
        self.assertEqual(testing.clear(None, "orders"), 0)  # done and acked: nothing outlives the test
