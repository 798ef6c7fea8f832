"""The private throwaway server used by the fault tests and the demo."""
import MySQLdb
import pytest

from notifyq.run.localserver import LocalServer, probe_dsn


def _connect(srv: LocalServer):
    # Over TCP, exactly as the DSN says: proves root@127.0.0.1 works without a password.
    return MySQLdb.connect(host="127.0.0.1", port=srv.port, user="root", passwd="",
                           connect_timeout=5, autocommit=True)


@pytest.fixture
def server(tmp_path):
    srv = LocalServer(tmp_path / "srv")
    srv.start()
    yield srv
    srv.cleanup()


def test_start_gives_working_tcp_dsn(server):
    assert server.is_running()
    assert server.dsn == f"mysql://root@127.0.0.1:{server.port}/"
    assert probe_dsn(server.dsn)
    assert probe_dsn(f"mysql://root@localhost/?unix_socket={server.socket_path}")
    conn = _connect(server)
    cur = conn.cursor()
    cur.execute("CREATE DATABASE nq_t")
    cur.execute("CREATE TABLE nq_t.t (id INT PRIMARY KEY) ENGINE=InnoDB")
    cur.execute("INSERT INTO nq_t.t VALUES (1), (2), (3)")
    cur.execute("SELECT COUNT(*) FROM nq_t.t")
    assert cur.fetchone() == (3,)
    conn.close()


def test_kill_then_restart_keeps_committed_rows(server):
    conn = _connect(server)
    cur = conn.cursor()
    cur.execute("CREATE DATABASE nq_t")
    cur.execute("CREATE TABLE nq_t.t (id INT PRIMARY KEY) ENGINE=InnoDB")
    cur.execute("INSERT INTO nq_t.t VALUES (1), (2), (3)")  # autocommit: durable once acked
    port = server.port

    server.kill()  # SIGKILL: no clean shutdown, InnoDB must recover
    assert not server.is_running()
    with pytest.raises(MySQLdb.OperationalError):
        cur.execute("SELECT 1")
    conn.close()
    assert not probe_dsn(server.dsn, timeout=1)

    server.restart()  # start() waits (with a deadline) until connections succeed
    assert server.is_running() and server.port == port
    conn = _connect(server)
    cur = conn.cursor()
    cur.execute("SELECT id FROM nq_t.t ORDER BY id")
    assert [r[0] for r in cur.fetchall()] == [1, 2, 3]
    conn.close()

    server.restart()  # a clean stop + start keeps the data as well
    conn = _connect(server)
    cur = conn.cursor()
    cur.execute("SELECT COUNT(*) FROM nq_t.t")
    assert cur.fetchone() == (3,)
    conn.close()


def test_context_manager_cleanup_removes_basedir(tmp_path):
    base = tmp_path / "ctx"
    with LocalServer(base) as srv:
        assert base.is_dir() and srv.is_running()
        dsn = srv.dsn
    assert not srv.is_running()
    assert not base.exists()
    assert not probe_dsn(dsn, timeout=1)
