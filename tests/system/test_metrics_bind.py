"""Where a consumer's metrics endpoint listens: loopback unless consumer.metrics_addr says otherwise."""

from __future__ import annotations

import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from conftest import notifyq_cmd, run_cli, wait_until

from notifyq import config as config_mod
from notifyq import errors


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc shows them) of the TCP sockets listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            addr, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.append(addr)
    return found


def test_the_metrics_endpoint_listens_on_loopback_only_by_default(db, tmp_path):
    # Given a consumer with a metrics port and no metrics_addr
    port = free_port()
    env = {**db.env, "NOTIFYQ_METRICS_PORT": str(port), "NQ_TEST_OUT": str(tmp_path)}
    with (tmp_path / "err").open("w") as err:
        proc = subprocess.Popen(notifyq_cmd("consume", "-q", "m", "--handler", "nqhandlers:record"),
                                env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        # When the endpoint is up
        addrs = wait_until(lambda: listening(port) or proc.poll() is not None, 30, message="endpoint up")
        assert proc.poll() is None, (tmp_path / "err").read_text()
        # Then it listens on 127.0.0.1 alone (not 0.0.0.0), and answers there
        assert addrs == ["0100007F"], addrs
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            assert r.status == 200
        assert f"addr=127.0.0.1 port={port}" in (tmp_path / "err").read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_metrics_addr_comes_from_the_config_file_or_notifyq_metrics_addr(tmp_path):
    path = tmp_path / "notifyq.toml"
    path.write_text('[consumer]\nmetrics_port = 9464\nmetrics_addr = "0.0.0.0"\n')
    assert config_mod.load(env={"NOTIFYQ_CONFIG": str(path)}).consumer.metrics_addr == "0.0.0.0"
    env = {"NOTIFYQ_CONFIG": "/dev/null", "NOTIFYQ_METRICS_ADDR": "::1"}
    assert config_mod.load(env=env).consumer.metrics_addr == "::1"
    assert config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"}).consumer.metrics_addr == "127.0.0.1"


@pytest.mark.parametrize("addr", ["::1", "127.0.0.2"])
def test_the_endpoint_binds_the_address_it_is_given(db, tmp_path, addr):
    if addr == "::1" and not socket.has_ipv6:
        pytest.skip("no IPv6")
    port = free_port()
    env = {**db.env, "NOTIFYQ_METRICS_PORT": str(port), "NOTIFYQ_METRICS_ADDR": addr, "NQ_TEST_OUT": str(tmp_path)}
    with (tmp_path / "err").open("w") as err:
        proc = subprocess.Popen(notifyq_cmd("consume", "-q", "m", "--handler", "nqhandlers:record"),
                                env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        addrs = wait_until(lambda: listening(port) or proc.poll() is not None, 30, message="endpoint up")
        assert proc.poll() is None, (tmp_path / "err").read_text()
        assert addrs == (["00000000000000000000000001000000"] if addr == "::1" else ["0200007F"]), addrs
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_an_address_it_cannot_listen_on_is_one_config_error_line(db):
    env = {**db.env, "NOTIFYQ_METRICS_PORT": str(free_port()), "NOTIFYQ_METRICS_ADDR": "192.0.2.1"}
    result = run_cli(env, "consume", "-q", "m", "--handler", "nqhandlers:record")
    assert result.returncode == errors.EXIT_CONFIG, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        "notifyq: error: consumer.metrics_addr '192.0.2.1' port ")
    assert "Traceback" not in result.stderr
