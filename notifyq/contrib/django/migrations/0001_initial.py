"""notifyq's schema, versions 1 to 5, applied by notifyq's own migration runner (the same SQL
and lock `notifyq init` uses) on this migration's connection. A later notifyq schema version
comes with a Django migration of its own that applies up to it."""

from django.db import migrations

from notifyq.contrib.django.schema import apply_up_to

SCHEMA_VERSION = 5


class Migration(migrations.Migration):
    initial = True
    atomic = False  # DDL commits in MySQL anyway; notifyq's runner takes its own lock
    dependencies: list = []
    operations = [migrations.RunPython(apply_up_to(SCHEMA_VERSION), reverse_code=migrations.RunPython.noop,
                                       elidable=False)]
