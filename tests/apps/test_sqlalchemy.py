"""put(conn=...) with SQLAlchemy 2.x as it is (issue 28, item 4): a Session or a Connection, no
raw MySQLdb connection dug out by hand. The job commits and rolls back with the caller."""

from __future__ import annotations

import pytest

sqlalchemy = pytest.importorskip("sqlalchemy", reason="SQLAlchemy not installed: pip install 'notifyq[sqlalchemy]'")

from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from notifyq import errors  # noqa: E402
from notifyq.produce.producer import Producer  # noqa: E402


@pytest.fixture
def engine(db):
    d = db.dsn
    url = sqlalchemy.engine.URL.create("mysql+mysqldb", username=d.user, password=d.password, host=d.host,
                                       port=d.port, database=d.database)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("SELECT 1"))
    yield engine
    engine.dispose()


def _jobs(db, queue: str) -> list[int]:
    return [r[0] for r in db.query("SELECT id FROM nq_job WHERE queue = %s ORDER BY id", (queue,))]


def test_a_put_on_a_session_commits_and_rolls_back_with_it(db, engine):
    with Producer("sa", db.config()) as producer:
        # Given a Session whose transaction puts a job, When it commits
        with Session(engine) as session:
            committed = producer.put({"n": 1}, conn=session)
            session.commit()
        # And another's rolls back
        with Session(engine) as session:
            producer.put({"n": 2}, conn=session)
            session.rollback()
        # Then only the committed job is stored
        assert _jobs(db, "sa") == [committed]


def test_a_put_on_a_connection_commits_with_it_also_before_any_statement(db, engine):
    with Producer("sac", db.config()) as producer:
        # Given a Connection in "commit as you go" style, no statement run yet
        with engine.connect() as conn:
            first = producer.put({"n": 1}, conn=conn)
            conn.commit()  # Then its commit() commits the job (the put began the transaction)
            producer.put({"n": 2}, conn=conn)
            conn.rollback()
            ids = producer.put_many([{"n": 3}, {"n": 4}], conn=conn)
            conn.commit()
        # And in engine.begin()'s transaction
        with engine.begin() as conn:
            last = producer.put({"n": 5}, conn=conn)
        assert _jobs(db, "sac") == [first, *ids, last]


def test_a_put_inside_a_savepoint_that_rolls_back_is_gone(db, engine):
    with Producer("sas", db.config()) as producer:
        with Session(engine) as session:
            kept = producer.put({"n": 1}, conn=session)
            nested = session.begin_nested()
            producer.put({"n": 2}, conn=session)
            nested.rollback()
            session.commit()
        assert _jobs(db, "sas") == [kept]


def test_a_connection_of_another_database_kind_is_refused_in_one_line(db):
    engine = create_engine("sqlite://")
    with Producer("sal", db.config()) as producer, engine.connect() as conn:
        with pytest.raises(errors.InputError, match="a sqlite connection"):
            producer.put({"n": 1}, conn=conn)


def test_the_example_of_the_docs_stores_an_order_and_its_job_together(db, monkeypatch):
    from pathlib import Path
    from unittest import mock

    from sqlalchemy import event

    # Given the Python block of docs/sqlalchemy.md, its DATABASE_URL the test database's
    text = (Path(__file__).resolve().parents[2] / "docs" / "sqlalchemy.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    a = db.admin
    monkeypatch.setenv("DATABASE_URL", f"mysql+mysqldb://{a.user}@{a.host}:{a.port}/{a.database}")
    for key in ("NOTIFYQ_DSN", "NOTIFYQ_PASSWORD", "NOTIFYQ_CONFIG"):
        monkeypatch.setenv(key, db.env[key])
    import sys
    import types

    module = types.ModuleType("docs_sqlalchemy")  # SQLAlchemy resolves the annotations through it
    monkeypatch.setitem(sys.modules, module.__name__, module)
    ns = module.__dict__
    exec(compile(code, "docs/sqlalchemy.md", "exec"), ns)
    ns["Base"].metadata.create_all(ns["engine"])
    try:
        with mock.patch.object(ns["producer"], "wake", wraps=ns["producer"].wake) as wake:
            # When an order is placed
            order_id = ns["place_order"]("a@example.com")
            # Then the order and its job are stored, and the consumers were woken after the commit
            assert db.query("SELECT id, email FROM orders") == [(order_id, "a@example.com")]
            assert db.query("SELECT payload FROM nq_job WHERE queue = 'emails'") == [(f'{{"order":{order_id}}}',)]
            assert wake.call_count == 1
    finally:
        event.remove(ns["Session"], "after_commit", ns["wake_consumers"])
        ns["producer"].close()
        ns["engine"].dispose()
