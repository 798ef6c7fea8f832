"""notifyq's schema version 7 (flow control: a job's key, the tables limits and rates count in),
applied by notifyq's own migration runner, as 0001 applies versions 1 to 5."""

from django.db import migrations

from notifyq.contrib.django.schema import apply_up_to

SCHEMA_VERSION = 7


class Migration(migrations.Migration):
    atomic = False  # DDL commits in MySQL anyway; notifyq's runner takes its own lock
    dependencies = [("notifyq", "0002_attempts")]
    operations = [migrations.RunPython(apply_up_to(SCHEMA_VERSION), reverse_code=migrations.RunPython.noop,
                                       elidable=False)]
