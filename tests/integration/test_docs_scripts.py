"""The code of docs/scripts-and-threads.md runs as printed: 8 threads share one producer and every
id they got back is stored; an order and its job commit together, and the job is woken for."""

from __future__ import annotations

from pathlib import Path

import MySQLdb

DOC = Path(__file__).resolve().parents[2] / "docs" / "scripts-and-threads.md"


def blocks() -> list[str]:
    return [b.split("```", 1)[0] for b in DOC.read_text().split("```python\n")[1:]]


def test_the_pages_threads_share_one_producer_and_its_order_commits_with_its_job(db, monkeypatch):
    for key in ("NOTIFYQ_DSN", "NOTIFYQ_PASSWORD", "NOTIFYQ_CONFIG"):
        if key in db.env:
            monkeypatch.setenv(key, db.env[key])
    shared, orders = blocks()
    namespace: dict = {}
    # When the first block runs (8 threads, one signup each) and the second places an order
    exec(compile(shared, str(DOC), "exec"), namespace)
    exec(compile(orders, str(DOC), "exec"), namespace)
    db.query("CREATE TABLE orders (id INT AUTO_INCREMENT PRIMARY KEY, email VARCHAR(100))")
    conn = MySQLdb.connect(**db.admin.connect_args(), autocommit=False)
    try:
        order_id = namespace["place_order"](conn, "a@example.com")
    finally:
        conn.close()
        namespace["producer"].close()
    # Then the 8 jobs and the order's job are stored, the order with it
    assert db.query("SELECT COUNT(*) FROM nq_job WHERE payload LIKE '%%example.com%%' AND dedup_key LIKE 'welcome:%%'") == [(8,)]
    assert db.query("SELECT id, email FROM orders") == [(order_id, "a@example.com")]
    assert db.query("SELECT COUNT(*) FROM nq_job WHERE payload = %s", (f'{{"order":{order_id},"to":"a@example.com"}}',)) == [(1,)]
