"""Run by tests/apps/test_django_tasks.py as `manage.py test shop.task_framework_checks` (not a
test*.py file: `manage.py test shop` leaves it out, and it needs Django's task framework).
notifyq as the TASKS backend, inside Django: enqueue follows the transaction, priority,
run_after and queue_name land on the job, get_result reads it back."""
import datetime as dt
from unittest import mock

from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.test import TransactionTestCase, override_settings
from django.utils import timezone

from notifyq.contrib.django.task_api import InvalidTask, TaskResultDoesNotExist, TaskResultStatus
from notifyq.contrib.django.tasks import NotifyqBackend
from notifyq.produce.producer import Producer
from shop.dtasks import agreet, greet, note


def job_row(result_id):
    with connection.cursor() as cur:
        cur.execute("SELECT queue, status, priority, run_at, payload FROM nq_job WHERE id = %s", [int(result_id)])
        return cur.fetchone()


class EnqueueFollowsTheTransaction(TransactionTestCase):
    def test_a_committed_transaction_keeps_the_job_and_wakes_the_consumers_on_commit(self):
        with mock.patch.object(Producer, "wake", autospec=True) as wake:
            with transaction.atomic():
                result = greet.enqueue("ada", punct="?")
                self.assertEqual(result.status, TaskResultStatus.READY)
                # seen on the transaction's own connection before it commits
                self.assertEqual(greet.get_result(result.id).status, TaskResultStatus.READY)
                self.assertEqual(wake.call_count, 0)
            self.assertEqual(wake.call_count, 1)
        queue, status, priority, _, _ = job_row(result.id)
        self.assertEqual((queue, status, priority), ("default", 0, 0))
        again = greet.get_result(result.id)
        self.assertEqual((again.args, again.kwargs, again.attempts), (["ada"], {"punct": "?"}, 0))

    def test_a_rolled_back_transaction_leaves_no_job(self):
        try:
            with transaction.atomic():
                result = greet.enqueue("gone")
                raise RuntimeError("rolled back")
        except RuntimeError:
            pass
        self.assertIsNone(job_row(result.id))
        with self.assertRaises(TaskResultDoesNotExist):
            greet.get_result(result.id)

    @override_settings(TASKS={"default": {"BACKEND": "notifyq.contrib.django.tasks.NotifyqBackend",
                                          "QUEUES": ["default", "mail"], "OPTIONS": {"ENQUEUE_ON_COMMIT": False}}})
    def test_without_enqueue_on_commit_the_job_is_stored_at_once_whatever_the_transaction_does(self):
        try:
            with transaction.atomic():
                result = greet.enqueue("kept")
                raise RuntimeError("rolled back")
        except RuntimeError:
            pass
        self.assertEqual(job_row(result.id)[:3], ("default", 0, 0))

    def test_aenqueue_puts_the_job_too(self):
        result = async_to_sync(agreet.aenqueue)("bo")
        self.assertEqual(job_row(result.id)[0], "default")


class WhatLandsOnTheJob(TransactionTestCase):
    def test_priority_run_after_and_queue_name_are_the_jobs(self):
        later = timezone.now() + dt.timedelta(hours=1)
        result = note.using(priority=100, run_after=later).enqueue("x")
        queue, status, priority, run_at, _ = job_row(result.id)
        self.assertEqual((queue, status, priority), ("mail", 1, 100))  # scheduled until run_after
        self.assertLess(abs(run_at.replace(tzinfo=dt.timezone.utc) - later), dt.timedelta(seconds=1))
        back = note.get_result(result.id)
        self.assertEqual((back.status, back.task.queue_name, back.task.priority), (TaskResultStatus.READY, "mail", 100))
        low = note.using(priority=-100).enqueue("y")
        self.assertEqual(job_row(low.id)[2], -100)
        whole = note.using(priority=5.0).enqueue("z")  # a whole number, as Django allows it
        self.assertEqual(job_row(whole.id)[2], 5)

    def test_a_task_the_backend_cannot_take_is_refused_when_declared(self):
        with self.assertRaises(InvalidTask):
            greet.using(queue_name="elsewhere")  # not in QUEUES
        with self.assertRaises(InvalidTask):
            greet.using(priority=101)
        with self.assertRaises(ImproperlyConfigured):
            NotifyqBackend("x", {"QUEUES": ["bad name!"]})

    def test_an_id_that_is_no_task_of_this_backend_has_no_result(self):
        for result_id in ("abc", "-1", "99999999"):
            with self.assertRaises(TaskResultDoesNotExist):
                greet.get_result(result_id)
        from notifyq.contrib.django import enqueue_on_commit

        plain = enqueue_on_commit("default", {"n": 1})  # a job, but no task's
        with self.assertRaises(TaskResultDoesNotExist):
            greet.get_result(str(plain))
