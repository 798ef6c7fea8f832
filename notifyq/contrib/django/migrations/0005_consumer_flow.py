"""notifyq's schema version 9 (a consumer's row records the flow settings it applies),
applied by notifyq's own migration runner, as 0001 applies versions 1 to 5."""

from django.db import migrations

from notifyq.contrib.django.schema import apply_up_to

SCHEMA_VERSION = 9


class Migration(migrations.Migration):
    atomic = False  # DDL commits in MySQL anyway; notifyq's runner takes its own lock
    dependencies = [("notifyq", "0004_workflows")]
    operations = [migrations.RunPython(apply_up_to(SCHEMA_VERSION), reverse_code=migrations.RunPython.noop,
                                       elidable=False)]
