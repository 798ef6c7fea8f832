"""Run by `manage.py test` (tests/apps/test_django.py): the test database gets notifyq's tables
from the migration, and enqueue_on_commit follows the transaction: commit, rollback, savepoint."""
from unittest import mock

from django.db import connection, transaction
from django.test import TestCase, TransactionTestCase

from notifyq.contrib.django import enqueue_on_commit, get_config
from notifyq.produce.producer import Producer
from notifyq.store import schema


def stored(queue):
    with connection.cursor() as cur:
        cur.execute("SELECT id FROM nq_job WHERE queue = %s ORDER BY id", [queue])
        return [r[0] for r in cur.fetchall()]


class SchemaTests(TestCase):
    def test_the_test_database_has_notifyqs_current_schema(self):
        with connection.cursor() as cur:
            cur.execute("SELECT value FROM nq_meta WHERE name = 'schema_version'")
            self.assertEqual(int(cur.fetchone()[0]), schema.code_version())
        self.assertEqual(get_config().dsn.database, connection.settings_dict["NAME"])


class EnqueueTests(TransactionTestCase):
    def test_a_committed_transaction_keeps_its_job_and_rings_on_commit(self):
        with mock.patch.object(Producer, "wake", autospec=True) as wake:
            with transaction.atomic():
                job_id = enqueue_on_commit("t_commit", {"n": 1})
                self.assertEqual(stored("t_commit"), [job_id])  # in the transaction
                self.assertEqual(wake.call_count, 0)  # not before the COMMIT
            self.assertEqual(wake.call_count, 1)
        self.assertEqual(stored("t_commit"), [job_id])

    def test_a_key_goes_with_the_job_into_the_transaction(self):
        from notifyq.contrib.django import enqueue_many_on_commit

        with transaction.atomic():
            one = enqueue_on_commit("t_key", {"n": 1}, key="customer-42")
            many = enqueue_many_on_commit("t_key", [{"n": 2}, {"n": 3}], key="customer-7")
        with connection.cursor() as cur:
            cur.execute("SELECT id, job_key FROM nq_job WHERE queue = 't_key' ORDER BY id")
            self.assertEqual(cur.fetchall(), ((one, "customer-42"), (many[0], "customer-7"), (many[1], "customer-7")))

    def test_a_rolled_back_transaction_leaves_no_job_and_no_ring(self):
        with mock.patch.object(Producer, "wake", autospec=True) as wake:
            try:
                with transaction.atomic():
                    enqueue_on_commit("t_rollback", {"n": 1})
                    raise RuntimeError("rolled back")
            except RuntimeError:
                pass
        self.assertEqual(stored("t_rollback"), [])
        self.assertEqual(wake.call_count, 0)

    def test_a_savepoint_rolled_back_drops_only_its_job(self):
        with transaction.atomic():
            kept = enqueue_on_commit("t_savepoint", {"n": 1})
            try:
                with transaction.atomic():
                    enqueue_on_commit("t_savepoint", {"n": 2})
                    raise RuntimeError("savepoint rolled back")
            except RuntimeError:
                pass
        self.assertEqual(stored("t_savepoint"), [kept])

    def test_outside_a_transaction_the_job_is_stored_at_once(self):
        job_id = enqueue_on_commit("t_autocommit", {"n": 1}, priority=3)
        self.assertEqual(stored("t_autocommit"), [job_id])

    def test_a_task_enqueued_on_djangos_connection_follows_its_transaction(self):
        from shop.tasks import make_order

        try:
            with transaction.atomic():
                make_order.enqueue("gone", conn=connection)
                raise RuntimeError("rolled back")
        except RuntimeError:
            pass
        with transaction.atomic():
            job_id = make_order.enqueue("kept", copies=2, conn=connection)
        self.assertEqual(stored("orders"), [job_id])
