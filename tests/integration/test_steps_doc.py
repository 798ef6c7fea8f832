"""The code of docs/steps.md runs as printed: a job whose first run fails after its first step
ends done on its second with each step's effect once (the stock held once, one shipment)."""

from __future__ import annotations

import re

from conftest import REPO, RUNTIME_USER, admin_connect
from test_steps import drain

from notifyq.produce.producer import Producer

DOC = REPO / "docs" / "steps.md"


def blocks(kind: str) -> list[str]:
    return [b.split("```", 1)[0] for b in DOC.read_text().split(f"```{kind}\n")[1:]]


def test_the_pages_job_fails_after_its_first_step_and_its_retry_skips_it(db):
    # Given the page's tables (writable by the runtime user) and its handler, as printed
    conn = admin_connect(db.admin, db.admin.database)
    try:
        cur = conn.cursor()
        for statement in re.split(r";\s*", blocks("sql")[0].strip()):
            if statement:
                cur.execute(statement)
        cur.execute("INSERT INTO stock (item) VALUES ('lamp')")
        for table in ("stock", "shipment"):
            for host in ("%", "localhost"):
                cur.execute(f"GRANT SELECT, INSERT, UPDATE ON `{db.admin.database}`.`{table}` "
                            f"TO '{RUNTIME_USER}'@'{host}'")
        conn.commit()
    finally:
        conn.close()
    namespace: dict = {}
    exec(compile(blocks("python")[0], str(DOC), "exec"), namespace)
    # The provider's stand-in, failing its first call: the run fails after its first step
    calls: list[str] = []
    provider = namespace["provider_charge"]

    def provider_charge(*args, **kwargs):
        calls.append(kwargs["idempotency_key"])
        if len(calls) == 1:
            raise ConnectionError("the provider is unreachable")
        return provider(*args, **kwargs)

    namespace["provider_charge"] = provider_charge
    with Producer("q", db.config()) as p:
        job_id = p.put({"order": {"id": 7, "item": "lamp", "card": "tok_visa", "cents": 1250}})

    # When workers run it until it is done
    drain(db, namespace["fulfil"])

    # Then the retry skipped the reservation: the stock is held once, the order shipped once
    assert calls == ["order-7", "order-7"]
    assert db.scalar("SELECT held FROM stock WHERE item = 'lamp'") == 1
    assert [tuple(r) for r in db.query("SELECT order_id, charge_id FROM shipment")] == [(7, "ch_order-7")]
    assert [tuple(r) for r in db.query("SELECT name, attempt FROM nq_step WHERE job_id = %s ORDER BY attempt, name",
                                       (job_id,))] == [("reserve", 1), ("charge", 2), ("ship", 2)]
