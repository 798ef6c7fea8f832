from django.db import models


class Order(models.Model):
    name = models.CharField(max_length=100)


class Handled(models.Model):
    """A job a handler ran: by which database connection, and when (CLOCK_MONOTONIC)."""
    job_id = models.BigIntegerField()
    connection_id = models.BigIntegerField()
    started = models.FloatField()
