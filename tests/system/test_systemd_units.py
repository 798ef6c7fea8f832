"""The systemd units: `systemd-analyze verify` is clean, and the settings the code relies on hold.

verify needs no running systemd (it loads units in a private test manager), so it works in
containers. It does insist that every Exec*= binary exists, hence the same rewrite as
`make verify-systemd`: ExecStart=/usr/local/bin/notifyq -> /bin/true on a temporary copy.
Unknown keys and unparsable values are only warnings with exit status 0, so the output is
checked too.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNITS = sorted(p for p in (REPO / "systemd").iterdir() if p.suffix in (".service", ".socket", ".target"))
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze not installed (Debian: apt-get install systemd)")


def verifiable_copies(dest: Path) -> list[Path]:
    """The approach of `make verify-systemd`: same files, notifyq swapped for /bin/true."""
    for unit in UNITS:
        text = re.sub(r"(?m)^ExecStart=/usr/local/bin/notifyq ", "ExecStart=/bin/true ",
                      unit.read_text())
        (dest / unit.name).write_text(text)
    return sorted(dest.iterdir())


def verify(paths):
    result = subprocess.run([ANALYZE, "verify", *map(str, paths)], capture_output=True,
                            text=True, timeout=120)
    return result.returncode, (result.stdout + result.stderr).splitlines()


def directives(unit: Path) -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    section = ""
    for line in unit.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.setdefault((section, key), []).append(value)
    return found


def test_all_four_units_are_shipped():
    assert [u.name for u in UNITS] == ["notifyq-consumer@.service", "notifyq-producer@.service",
                                       "notifyq-producer@.socket", "notifyq.target"]


@needs_analyze
def test_systemd_analyze_verify_is_clean(tmp_path):
    status, output = verify(verifiable_copies(tmp_path))
    assert status == 0, output
    assert [line for line in output if "notifyq" in line] == []


@needs_analyze
def test_verify_has_teeth(tmp_path):
    # A typo or a bad value only warns (exit 0): the output check above is what catches it.
    copies = verifiable_copies(tmp_path)
    consumer = tmp_path / "notifyq-consumer@.service"
    consumer.write_text(consumer.read_text().replace("WatchdogSec=60", "WatchdogSec=banana\nBogus=1"))
    status, output = verify(copies)
    assert status == 0
    assert any("notifyq-consumer@.service" in line and "banana" in line for line in output)
    assert any("Unknown key" in line and "Bogus" in line for line in output)
    # And the untouched originals fail only because /usr/local/bin/notifyq is not installed.
    if not Path("/usr/local/bin/notifyq").exists():
        status, output = verify([REPO / "systemd" / "notifyq-consumer@.service"])
        assert status != 0 and any("/usr/local/bin/notifyq" in line for line in output)


@needs_analyze
def test_make_verify_systemd_passes():
    if shutil.which("make") is None:
        pytest.skip("make not installed")
    result = subprocess.run(["make", "-s", "verify-systemd"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_analyze
def test_services_keep_a_low_exposure_score(tmp_path):
    verifiable_copies(tmp_path)
    services = [tmp_path / "notifyq-consumer@.service", tmp_path / "notifyq-producer@.service"]
    result = subprocess.run([ANALYZE, "security", "--offline=yes", "--threshold=25", *map(str, services)],
                            capture_output=True, text=True, timeout=120)
    if "--offline" in result.stderr or "--threshold" in result.stderr:
        pytest.skip("this systemd-analyze has no offline security mode (needs systemd >= 250)")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    scores = [float(s) for s in re.findall(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)]
    assert len(scores) == 2 and max(scores) <= 2.5, scores


def test_consumer_unit_has_the_settings_the_code_relies_on():
    d = directives(REPO / "systemd" / "notifyq-consumer@.service")
    one = {key: values[-1] for key, values in d.items()}
    assert one["Service", "ExecStart"] == "/usr/local/bin/notifyq consume --profile %i"
    assert one["Service", "Type"] == "notify" and one["Service", "NotifyAccess"] == "main"
    assert one["Service", "ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert one["Service", "WatchdogSec"] == "60"
    assert one["Service", "Restart"] == "on-failure" and one["Service", "RestartSec"] == "2"
    # SIGTERM starts a drain of up to 60 s (shutdown_timeout): systemd must wait longer.
    assert int(one["Service", "TimeoutStopSec"]) > 60
    assert one["Service", "KillSignal"] == "SIGTERM" and one["Service", "KillMode"] == "mixed"
    assert one["Service", "EnvironmentFile"] == "-/etc/notifyq/notifyq.env"
    assert "NOTIFYQ_CONFIG=/etc/notifyq/notifyq.toml" in d["Service", "Environment"]
    assert one["Service", "LoadCredential"] == "db_password:/etc/notifyq/db_password"
    assert one["Unit", "PartOf"] == "notifyq.target"
    assert one["Install", "WantedBy"] == "notifyq.target"
    assert_hardened(d)


def test_producer_reads_the_fifo_of_its_socket_unit():
    service = directives(REPO / "systemd" / "notifyq-producer@.service")
    socket = directives(REPO / "systemd" / "notifyq-producer@.socket")
    assert service["Service", "ExecStart"] == ["/usr/local/bin/notifyq produce --profile %i"]
    assert service["Service", "StandardInput"] == ["socket"]
    # stdout would otherwise default to the socket: our own input
    assert service["Service", "StandardOutput"] == ["journal"]
    assert service["Unit", "Requires"] == ["notifyq-producer@%i.socket"]
    assert socket["Socket", "ListenFIFO"] == ["/run/notifyq/%i.fifo"]
    assert socket["Socket", "Accept"] == ["no"]
    assert "notifyq.target" in socket["Install", "WantedBy"][0].split()
    assert_hardened(service)


def test_target_is_wanted_by_multi_user():
    d = directives(REPO / "systemd" / "notifyq.target")
    assert d["Install", "WantedBy"] == ["multi-user.target"]


def assert_hardened(d):
    for key, value in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                       ("ProtectHome", "yes"), ("PrivateTmp", "yes"), ("PrivateDevices", "yes"),
                       ("ProtectKernelTunables", "yes"), ("ProtectKernelModules", "yes"),
                       ("ProtectControlGroups", "yes"), ("RestrictNamespaces", "yes"),
                       ("LockPersonality", "yes"), ("SystemCallFilter", "@system-service"),
                       ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
                       ("CapabilityBoundingSet", ""), ("DynamicUser", "yes")]:
        assert d.get(("Service", key)) == [value], key
    # Would break cffi/ctypes callbacks in handler code.
    assert ("Service", "MemoryDenyWriteExecute") not in d


def test_install_never_overwrites_the_config_and_uninstall_keeps_it(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make not installed")
    if not (REPO / "etc" / "notifyq" / "notifyq.toml").exists():
        pytest.skip("etc/notifyq/notifyq.toml not written yet")

    def make(target):
        result = subprocess.run(["make", "-s", target, f"DESTDIR={tmp_path}"], cwd=REPO,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr

    make("install-systemd")
    config = tmp_path / "etc" / "notifyq" / "notifyq.toml"
    assert config.read_text() == (REPO / "etc" / "notifyq" / "notifyq.toml").read_text()
    assert (tmp_path / "etc" / "notifyq" / "conf.d").is_dir()
    units = tmp_path / "etc" / "systemd" / "system"
    assert sorted(p.name for p in units.iterdir()) == [u.name for u in UNITS]

    config.write_text("# edited by the operator\n")
    make("install-systemd")
    assert config.read_text() == "# edited by the operator\n"

    make("uninstall-systemd")
    assert list(units.iterdir()) == []
    assert config.read_text() == "# edited by the operator\n"
