"""notifyq's schema version 10 (each key's running jobs counted in its nq_flow_key row, and the
job's key in ix_state), applied by notifyq's own migration runner, as 0001 applies versions 1 to 5."""

from django.db import migrations

from notifyq.contrib.django.schema import apply_up_to

SCHEMA_VERSION = 10


class Migration(migrations.Migration):
    atomic = False  # DDL commits in MySQL anyway; notifyq's runner takes its own lock
    dependencies = [("notifyq", "0005_consumer_flow")]
    operations = [migrations.RunPython(apply_up_to(SCHEMA_VERSION), reverse_code=migrations.RunPython.noop,
                                       elidable=False)]
