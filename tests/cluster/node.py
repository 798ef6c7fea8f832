"""One node of a throwaway MariaDB Galera cluster: a private mariadbd with wsrep on.

Started like notifyq.run.localserver starts its private server: --no-defaults and explicit
options only, so no my.cnf of the machine leaks in; its datadir, socket, pid file and error log
live under the node's own directory, and its four ports (client, group communication, IST, SST)
are bound to 127.0.0.1. GaleraCluster (galera.py) picks the ports and directories.
"""

from __future__ import annotations

import atexit
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import MySQLdb

# Debian/Ubuntu put galera-4 in /usr/lib/galera; RPM distributions in lib64/galera-4.
_PROVIDER_PATHS = ("/usr/lib/galera/libgalera_smm.so", "/usr/lib/libgalera_smm.so",
                   "/usr/lib64/galera-4/libgalera_smm.so", "/usr/lib64/galera/libgalera_smm.so")
_SERVER_DIRS = ("/usr/sbin", "/usr/bin", "/usr/local/mysql/bin")
# Strong refs: a node still running when the interpreter exits is killed then (it runs in its
# own session, so nothing else would stop it).
_LIVE: set["GaleraNode"] = set()


def _users_of(path: Path) -> list[str]:
    """The processes with a file open under `path` (pid and command line), from /proc."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(str(os.readlink(fd)).startswith(str(path)) for fd in (proc / "fd").iterdir()):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                out.append(f"{proc.name} {command[:120]}")
        except OSError:
            continue
    return out


def _which(name: str) -> str | None:
    path = os.pathsep.join(os.environ.get("PATH", "").split(os.pathsep) + list(_SERVER_DIRS))
    return shutil.which(name, path=path)


def _server_account() -> pwd.struct_passwd | None:
    """The account mariadbd runs as when we are root: never root itself, because rsync's SST
    daemon started by root drops to `nobody` and then cannot write the joiner's datadir."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("mysql")  # created by the mariadb-server package
    except KeyError:
        return None


def hand_over(path: Path) -> None:
    """Give `path` and everything under it to the server account (a no-op unless we are root)."""
    account = _server_account()
    if account is None:
        return
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, account.pw_uid, account.pw_gid)


def find_provider() -> str | None:
    """Path of the Galera 4 library (package galera-4), or None."""
    return next((p for p in _PROVIDER_PATHS if os.path.exists(p)), None)


def missing_requirements() -> list[str]:
    """Debian packages a cluster needs and this machine lacks (empty: a cluster can start)."""
    missing = []
    if _which("mariadbd") is None or _which("mariadb-install-db") is None:
        missing.append("mariadb-server")
    if find_provider() is None:
        missing.append("galera-4")
    if _which("rsync") is None:  # SST by rsync: the donor's datadir copied into the joiner's
        missing.append("rsync")
    if os.geteuid() == 0 and _server_account() is None:
        missing.append("a 'mysql' system account (mariadb-server creates it)")
    return missing


EXIT_AFTER_POSITION_S = 5.0  # a --wsrep-recover run that logged its position exits within this, or is killed


class RecoverFailed(RuntimeError):
    """mariadbd --wsrep-recover exited with an error or named no position."""


@dataclass(frozen=True)
class NodePorts:
    client: int  # the MySQL protocol port clients use
    galera: int  # group communication (gcomm), 4567 by default
    ist: int  # incremental state transfer receiver, 4568 by default
    sst: int  # state snapshot transfer receiver (the rsync daemon), 4444 by default


@dataclass(frozen=True)
class ClusterSettings:
    cluster_name: str
    provider: str
    # All nodes' gcomm addresses: a restarted node finds whichever members are alive.
    gcomm_address: str
    buffer_pool_mb: int = 32
    redo_log_mb: int = 16
    gcache_mb: int = 32
    # 1 = every commit is durable on the node's own disk, as on a single server, so latency
    # comparisons isolate the cost of replication. Galera installs often use 2 (durability from
    # the other nodes); pass it for speed.
    flush_log_at_trx_commit: int = 1
    # Extra wsrep_provider_options. Empty keeps Galera's defaults, which is what users run: a
    # killed or paused node is evicted ~6.3 s later, and the survivors' commits wait that long.
    # "evs.keepalive_period=PT0.5S;evs.suspect_timeout=PT2S;evs.inactive_timeout=PT4S" evicts in
    # ~3.2 s here (keepalive_period must stay under a third of suspect_timeout, or gcomm refuses).
    provider_options: str = ""


class GaleraNode:
    """One mariadbd of the cluster. `index` counts from 1 and names it (wsrep_node_name node1..);
    it is not its auto_increment_offset, which Galera reassigns at every membership change."""

    def __init__(self, index: int, basedir: Path, ports: NodePorts, settings: ClusterSettings):
        self.index = index
        self.basedir = basedir
        self.ports = ports
        self.settings = settings
        self.datadir = basedir / "data"
        self.socket_path = str(basedir / "mysqld.sock")
        self.log_path = basedir / "error.log"
        self._proc: subprocess.Popen | None = None
        self._log_mark = 0
        self.paused = False

    def __repr__(self) -> str:
        return f"<GaleraNode {self.index} port={self.ports.client}>"

    @property
    def port(self) -> int:
        return self.ports.client

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def dsn(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/"

    @property
    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def connect(self, **kwargs) -> MySQLdb.Connection:
        """A root session over TCP (autocommit on unless told otherwise)."""
        args = {"host": "127.0.0.1", "port": self.port, "user": "root", "passwd": "",
                "connect_timeout": 5, "autocommit": True, **kwargs}
        return MySQLdb.connect(**args)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def log_since_mark(self) -> str:
        """What the node logged since it was last started or resumed (e.g. to tell IST from SST)."""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_mark)
            return f.read().decode(errors="replace")

    def last_join(self) -> str | None:
        """"IST" or "SST": how the node received state when it last (re)joined, after its last start
        or resume (None: no transfer yet). On a start the rsync script runs for either, and the
        donor decides whether to copy the datadir; a running node (resumed) can only take IST."""
        log = self.log_since_mark()
        if "rsync SST completed on joiner" in log:
            return "SST"
        if "rsync IST completed on joiner" in log or re.search(r"Receiving IST: \d+ writesets", log):
            return "IST"
        return None

    # -- state ---------------------------------------------------------------
    def wsrep_status(self) -> dict[str, str] | None:
        """wsrep_* status of the node, or None while it does not answer (down, joining, paused).

        The read timeout bounds the probe: a paused node accepts the TCP connection in the
        kernel but never answers the handshake."""
        if not self.is_running() or self.paused:
            return None
        try:
            conn = self.connect(connect_timeout=2, read_timeout=2)
        except MySQLdb.Error:
            return None
        try:
            cur = conn.cursor()
            cur.execute("SHOW GLOBAL STATUS LIKE 'wsrep%'")
            return {name.lower(): value for name, value in cur.fetchall()}
        except MySQLdb.Error:
            return None
        finally:
            conn.close()

    def is_synced_member(self, cluster_size: int) -> bool:
        """Synced, in the primary component, and seeing exactly `cluster_size` members."""
        st = self.wsrep_status()
        return bool(st) and (st.get("wsrep_local_state_comment") == "Synced"
                             and st.get("wsrep_cluster_status") == "Primary"
                             and st.get("wsrep_ready") == "ON"
                             and st.get("wsrep_cluster_size") == str(cluster_size))

    # -- lifecycle -----------------------------------------------------------
    def _server_args(self) -> list[str]:
        s, p = self.settings, self.ports
        provider_options = ";".join(filter(None, [
            f"base_port={p.galera}", f"gmcast.listen_addr=tcp://127.0.0.1:{p.galera}",
            f"ist.recv_addr=127.0.0.1:{p.ist}", f"gcache.size={s.gcache_mb}M", s.provider_options]))
        args = [
            f"--datadir={self.datadir}", f"--tmpdir={self.basedir}",
            f"--socket={self.socket_path}", f"--pid-file={self.basedir / 'mysqld.pid'}",
            f"--port={p.client}", "--bind-address=127.0.0.1", f"--log-error={self.log_path}",
            "--skip-name-resolve", "--max-connections=200",
            f"--innodb-buffer-pool-size={s.buffer_pool_mb}M", f"--innodb-log-file-size={s.redo_log_mb}M",
            f"--innodb-flush-log-at-trx-commit={s.flush_log_at_trx_commit}",
            # What Galera requires of the server.
            "--binlog-format=ROW", "--default-storage-engine=InnoDB", "--innodb-autoinc-lock-mode=2",
            "--wsrep-on=ON", f"--wsrep-provider={s.provider}",
            f"--wsrep-cluster-name={s.cluster_name}", f"--wsrep-cluster-address={s.gcomm_address}",
            f"--wsrep-node-name=node{self.index}", "--wsrep-node-address=127.0.0.1",
            f"--wsrep-node-incoming-address=127.0.0.1:{p.client}",
            "--wsrep-sst-method=rsync", f"--wsrep-sst-receive-address=127.0.0.1:{p.sst}",
            f"--wsrep-provider-options={provider_options}",
        ]
        if _server_account():
            args.append(f"--user={_server_account().pw_name}")
        return args

    def initialise(self, timeout: float = 60) -> None:
        """A fresh datadir with the system tables (only the bootstrap node needs one: joiners
        receive theirs by SST)."""
        cmd = [_which("mariadb-install-db"), "--no-defaults", "--auth-root-authentication-method=normal",
               "--skip-test-db", "--skip-name-resolve", f"--datadir={self.datadir}",
               f"--innodb-log-file-size={self.settings.redo_log_mb}M"]
        if _server_account():
            cmd.append(f"--user={_server_account().pw_name}")
        with open(self.log_path, "ab") as log:
            rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                timeout=timeout).returncode
        if rc != 0:
            raise RuntimeError(f"mariadb-install-db failed for node {self.index} (rc={rc}):\n{self.log_tail()}")

    def recover_position(self, timeout: float = 150) -> str | None:
        """The last committed cluster position (uuid:seqno) InnoDB holds, or None for a datadir
        that has none yet. After a crash grastate.dat says seqno -1, and without this position
        the node would ask for a full SST; with it, the donor sends only what it missed (IST).
        The same step as the galera_recovery script of the packaged service."""
        if not (self.datadir / "mysql").is_dir():
            return None
        recover_log = self.basedir / "recover.log"
        recover_log.unlink(missing_ok=True)
        args = [a for a in self._server_args() if not a.startswith("--log-error=")]
        cmd = [_which("mariadbd"), "--no-defaults", *args, f"--log-error={recover_log}", "--wsrep-recover"]
        hand_over(self.basedir)
        # Usually a second or two; InnoDB waits up to 100 s for a datadir lock another process
        # still holds (it retries each second), and twice in CI the 60 s this once allowed ran out
        # with no log to say why: the log and the datadir's other users go in the error now.
        # Twice in CI the process logged the position at once and then never exited (150 s):
        # once the position is logged it has done its work, and is given EXIT_AFTER_POSITION_S
        # to exit before it is killed (a kill there is a crash the start recovers from).
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        positioned_at = None
        try:
            while proc.poll() is None:
                now = time.monotonic()
                if positioned_at is None and recover_log.exists() and \
                        "WSREP: Recovered position:" in recover_log.read_text(errors="replace"):
                    positioned_at = now
                if positioned_at is not None and now - positioned_at >= EXIT_AFTER_POSITION_S:
                    proc.kill()
                    proc.wait(30)
                    break
                if now >= deadline:
                    text = recover_log.read_text(errors="replace") if recover_log.exists() else "(no log)"
                    raise RuntimeError(f"--wsrep-recover of node {self.index} ran past {timeout:.0f} s; processes "
                                       f"using its datadir: {_users_of(self.datadir)}; its log ends:\n{text[-3000:]}\n"
                                       f"(--wsrep-recover of node {self.index} ran past {timeout:.0f} s)")
                time.sleep(0.1)  # poll interval inside a deadline loop
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        rc = 0 if positioned_at is not None else proc.returncode
        text = recover_log.read_text(errors="replace") if recover_log.exists() else ""
        with open(self.log_path, "a") as log:  # keep the whole story in one log
            log.write(text)
        found = re.findall(r"WSREP: Recovered position: (\S+)", text)
        if rc != 0 or not found:
            raise RecoverFailed(f"--wsrep-recover failed for node {self.index} (rc={rc}):\n{text[-2000:]}\n"
                               f"(--wsrep-recover of node {self.index}: rc={rc}, position found: {bool(found)})")
        return found[-1]

    def launch(self, bootstrap: bool = False) -> None:
        """Start mariadbd and return at once; wait with GaleraCluster.wait_synced."""
        if self.is_running():
            raise RuntimeError(f"node {self.index} is already running")
        self.datadir.mkdir(parents=True, exist_ok=True)
        self.log_path.touch()
        position = None if bootstrap else self.recover_position()
        hand_over(self.basedir)
        # --no-defaults must come first: no my.cnf of this machine may leak in.
        cmd = [_which("mariadbd"), "--no-defaults", *self._server_args()]
        if bootstrap:
            cmd.append("--wsrep-new-cluster")
        if position:
            cmd.append(f"--wsrep-start-position={position}")
        self._log_mark = self.log_path.stat().st_size
        with open(self.log_path, "ab") as log:
            # Own session: a Ctrl-C aimed at the test run must not kill a node mid-test.
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        self.paused = False
        _LIVE.add(self)

    def _signal_and_wait(self, sig: int, timeout: float) -> bool:
        if not self.is_running():
            return True
        self._proc.send_signal(sig)
        try:
            self._proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def kill(self) -> None:
        """SIGKILL: a crash. The node's clients lose their connections; the others evict it."""
        if self.paused:
            self.resume()  # a stopped process dies of SIGKILL too, but keep `paused` honest
        if not self._signal_and_wait(signal.SIGKILL, 30):
            raise RuntimeError(f"node {self.index} (pid {self.pid}) survived SIGKILL")
        _LIVE.discard(self)

    def stop(self, timeout: float = 60) -> None:
        """Clean shutdown (SIGTERM): the node leaves the cluster gracefully; SIGKILL at the deadline."""
        self.terminate()
        if not self.wait_exit(timeout):
            self.kill()
            raise RuntimeError(f"node {self.index} did not stop within {timeout}s; killed it:\n{self.log_tail()}")

    def terminate(self) -> None:
        """Send SIGTERM and return at once (see wait_exit)."""
        if self.paused:
            self.resume()
        if self.is_running():
            self._proc.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout: float) -> bool:
        """True once the process has exited; False if it still runs at the deadline."""
        if self._proc is None:
            return True
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        _LIVE.discard(self)
        return True

    def pause(self, timeout: float = 10) -> None:
        """SIGSTOP: the node stops answering, and the others evict it after evs.suspect_timeout.

        Returns once every thread is stopped: kill() only queues the stop, and a thread already
        on the other core can still answer a query for a moment (a test once saw its SELECT answered
        by the node it had just paused)."""
        self._proc.send_signal(signal.SIGSTOP)
        self.paused = True
        deadline = time.monotonic() + timeout
        while not self._all_threads_stopped():
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {self.index} not stopped {timeout} s after SIGSTOP")
            time.sleep(0.005)

    def _all_threads_stopped(self) -> bool:
        tasks = Path(f"/proc/{self._proc.pid}/task")
        for task in tasks.iterdir():
            try:
                stat = (task / "stat").read_text()
            except FileNotFoundError:  # the thread ended meanwhile
                continue
            # The state follows the command name, which is in parentheses and may hold spaces.
            if stat[stat.rindex(")") + 2] not in "tT":
                return False
        return True

    def resume(self) -> None:
        self._log_mark = self.log_path.stat().st_size
        self._proc.send_signal(signal.SIGCONT)
        self.paused = False


@atexit.register
def _kill_leftovers() -> None:
    for node in list(_LIVE):
        try:
            node.kill()
        except Exception:
            pass
