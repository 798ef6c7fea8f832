"""docs/exactly-once.md's worked example runs as printed: a real `notifyq consume` charges each
order once through job.transaction(), and the producer reads each job's result."""

from __future__ import annotations

import re

from conftest import REPO, RUNTIME_USER, admin_connect, run_cli
from test_readme import the_block

from notifyq import config as config_mod
from notifyq.produce.producer import Producer

PAGE = REPO / "docs" / "exactly-once.md"


def test_the_charge_a_card_once_example_charges_each_order_once_and_keeps_its_result(db, tmp_path):
    # Given the page's tables and handler module, exactly as printed
    sql = re.findall(r"^```sql\n(.*?)^```", PAGE.read_text(), flags=re.MULTILINE | re.DOTALL)[0]
    conn = admin_connect(db.admin, db.admin.database)
    try:
        for statement in filter(None, (s.strip() for s in sql.split(";"))):
            conn.cursor().execute(statement)
        for table in ("orders", "charge"):
            for host in ("%", "localhost"):
                conn.cursor().execute(f"GRANT SELECT, INSERT, UPDATE ON `{db.admin.database}`.`{table}` "
                                      f"TO '{RUNTIME_USER}'@'{host}'")
        conn.cursor().execute("INSERT INTO orders (id) VALUES (1), (2), (3)")
        conn.commit()
    finally:
        conn.close()
    (tmp_path / "payments.py").write_text(the_block(PAGE, "def charge_card"))
    settings = tmp_path / "notifyq.toml"
    settings.write_text("[defaults]\nresult_ttl_s = 3600\n")
    env = {**db.env, "NOTIFYQ_CONFIG": str(settings), "PYTHONPATH": f"{tmp_path}:{db.env['PYTHONPATH']}"}
    cfg = config_mod.load(env={k: v for k, v in env.items() if k.startswith("NOTIFYQ_")})
    with Producer("payments", cfg) as producer:
        ids = [producer.put({"order": n, "cents": 100 * n, "card": "tok_visa"}) for n in (1, 2, 3)]

    # When the page's consumer command runs them (until the queue is empty)
    done = run_cli(env, "consume", "-q", "payments", "--handler", "payments:charge_card", "--exit-when-empty")

    # Then each order is charged once and paid, and each job's result is the charge
    assert done.returncode == 0, done.stderr
    assert db.query("SELECT order_id, charge_id, cents FROM charge ORDER BY order_id") == [
        (1, "ch_order-1", 100), (2, "ch_order-2", 200), (3, "ch_order-3", 300)]
    assert db.query("SELECT id FROM orders WHERE paid = 1 ORDER BY id") == [(1,), (2,), (3,)]
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    with Producer("payments", cfg) as producer:
        assert [producer.result(i, wait=10) for i in ids] == [{"charge": f"ch_order-{n}"} for n in (1, 2, 3)]
