"""notifyq's migrations run inside Django's: on the migrating connection, through the runner of
`notifyq init` (store.schema.migrate), so the DDL lives in one place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from notifyq.store import schema


def apply_up_to(version: int) -> Callable[[Any, Any], None]:
    """A RunPython function applying notifyq's migrations up to `version` (the schema version a
    Django migration stands for: notifyq's newer ones come with a Django migration each)."""
    def apply(apps: Any, schema_editor: Any) -> None:
        connection = schema_editor.connection
        if connection.vendor != "mysql":
            return  # another database of the project: notifyq's tables are not there
        connection.ensure_connection()
        raw = connection.connection  # the MySQLdb connection
        was = raw.get_autocommit()
        raw.autocommit(True)
        cur = raw.cursor()
        try:
            schema.check_server(raw.get_server_info())
            schema.migrate(cur, connection.settings_dict["NAME"], upto=version)
        finally:
            cur.close()
            raw.autocommit(was)
    apply.__name__ = f"apply_notifyq_schema_up_to_{version}"
    return apply
