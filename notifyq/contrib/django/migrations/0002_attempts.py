"""notifyq's schema version 6 (nq_attempt: every attempt's record, and a handler's kept result),
applied by notifyq's own migration runner, as 0001 applies versions 1 to 5."""

from django.db import migrations

from notifyq.contrib.django.schema import apply_up_to

SCHEMA_VERSION = 6


class Migration(migrations.Migration):
    atomic = False  # DDL commits in MySQL anyway; notifyq's runner takes its own lock
    dependencies = [("notifyq", "0001_initial")]
    operations = [migrations.RunPython(apply_up_to(SCHEMA_VERSION), reverse_code=migrations.RunPython.noop,
                                       elidable=False)]
