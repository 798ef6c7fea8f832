"""The DSN: where the queue lives, parsed once, checked once, never echoed with its password.

    mysql://user[:password]@host[:port][/database][?unix_socket=PATH&ssl_ca=FILE&ssl_mode=...]
    mysql://user[:password]@host[:port][/database]?server_public_key=PATH   (MySQL 8, plain TCP)
    mysql://user[:password]@host1[:port1],host2[:port2],...[/database][?ssl_...]

Several hosts name the nodes of one Galera cluster: every session connects to the first of them
that answers and is ready (store/db.py), so that every process writes through the same node.
"""

from __future__ import annotations

import os
import stat
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from notifyq import errors
from notifyq.config import values

# A DSN without a database name (mysql://root@127.0.0.1/) means this one: documented in the
# README and shown by `notifyq config` and `notifyq init`.
DEFAULT_DATABASE = "notifyq"
DEFAULT_DSN = f"mysql://root@localhost/{DEFAULT_DATABASE}"
# TLS options, as `ssl_*` DSN keys or `[tls]` keys. Any of them means TLS is required.
TLS_KEYS = ("ca", "cert", "key", "capath", "cipher", "mode")
TLS_MODES = ("REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY")
_TLS_FILES = ("ca", "cert", "key", "capath")
_ENCODE_PASSWORD = ("bad DSN: a '/', '?', '#' or '@' in the password (or user name) must be "
                    "percent-encoded: / as %2F, ? as %3F, # as %23, @ as %40")


@dataclass(frozen=True)
class DSN:
    """Where one server is and how to log in: what a mysql:// URL says (password masked in repr)."""

    user: str = "root"
    password: str | None = field(default=None, repr=False)
    host: str = "localhost"
    port: int = 3306
    database: str = "notifyq"
    unix_socket: str | None = None
    tls: dict[str, str] = field(default_factory=dict)
    # Every node of a multi-host DSN, in the order given; empty for one host (host, port).
    hosts: tuple[tuple[str, int], ...] = ()
    # MySQL 8's caching_sha2_password over a connection without TLS: the server's RSA public
    # key, which libmysqlclient needs on a cache miss (else error 2061).
    server_public_key: str | None = None

    @property
    def servers(self) -> tuple[tuple[str, int], ...]:
        """(host, port) of every server to try, in order: one for a plain DSN."""
        return self.hosts or ((self.host, self.port),)

    @classmethod
    def parse(cls, url: str) -> "DSN":
        """mysql://user:pw@host:port/db, or mysql://user@localhost/db?unix_socket=/run/mysqld/mysqld.sock

        No error quotes the URL: an unencoded '/', '?' or '#' in a password moves part of it
        into the host, path or query, so only parts proven free of it are ever echoed."""
        if not isinstance(url, str):
            raise errors.ConfigError("bad DSN: expected mysql://user:password@host:port/database")
        try:
            url.encode("utf-8")
        except UnicodeEncodeError:  # undecodable bytes from the environment or argv
            raise errors.ConfigError("bad DSN: not valid UTF-8") from None
        try:
            parts = urllib.parse.urlsplit(url)
        except ValueError:  # an unclosed [IPv6 literal
            raise errors.ConfigError("bad DSN: invalid host (an IPv6 address goes in [brackets])") from None
        if parts.scheme not in ("mysql", "mariadb"):
            raise errors.ConfigError("bad DSN: expected mysql://user:password@host:port/database")
        rest = url.split("//", 1)[-1][len(parts.netloc):]  # path, query and fragment as given
        hosts: tuple[tuple[str, int], ...] = ()
        if "," in parts.netloc.rpartition("@")[2] and "@" not in rest:
            hosts = _host_list(parts.netloc.rpartition("@")[2])
            # The rest of the checks see the first host alone, as in a one-host DSN.
            first = parts.netloc.rpartition("@")[0] + ("@" if "@" in parts.netloc else "")
            first += parts.netloc.rpartition("@")[2].split(",", 1)[0]
            parts = parts._replace(netloc=first)
        # urlsplit ends the user:password@host part at the first / ? #: an unencoded one in the
        # password leaves an '@' behind it. A database name, option or fragment never has one.
        if "@" in rest or parts.fragment or "#" in url:
            raise errors.ConfigError(_ENCODE_PASSWORD)
        try:
            port = parts.port
        except ValueError:
            raise errors.ConfigError("bad DSN: the port must be a number from 1 to 65535") from None
        if port == 0:
            raise errors.ConfigError("bad DSN: the port must be a number from 1 to 65535")
        try:
            query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False,
                                                errors="strict", max_num_fields=20))
        except ValueError:
            raise errors.ConfigError("bad DSN: too many or undecodable options") from None
        socket_path = query.pop("unix_socket", None) or query.pop("socket", None)
        if socket_path and hosts:
            raise errors.ConfigError("bad DSN: unix_socket names one server: not with several hosts")
        tls = {k: query.pop(k) for k in list(query) if k.startswith("ssl_")}
        server_public_key = query.pop("server_public_key", None) or None
        if query:
            names = sorted(query)
            shown = ", ".join(names) if all(n.isidentifier() for n in names) else "(not shown)"
            raise errors.ConfigError(f"bad DSN: unknown option(s) {shown}: expected unix_socket, "
                                     f"server_public_key or ssl_{', ssl_'.join(TLS_KEYS)}")
        bad_tls = sorted(k for k in tls if k.removeprefix("ssl_") not in TLS_KEYS)
        if bad_tls:
            raise errors.ConfigError(f"bad DSN: unknown TLS option(s) {', '.join(values.shown(k) for k in bad_tls)}: "
                                     f"expected ssl_{', ssl_'.join(TLS_KEYS)}")
        database = urllib.parse.unquote(parts.path.lstrip("/")) or DEFAULT_DATABASE
        if not values.DATABASE_NAME_RE.fullmatch(database):
            raise errors.ConfigError(f"bad DSN: invalid database name {values.shown(database)}: "
                                     "use 1-64 characters from A-Z a-z 0-9 _")
        password = urllib.parse.unquote(parts.password) if parts.password is not None else None
        return cls(
            user=urllib.parse.unquote(parts.username or "root"),
            password=password,
            host=parts.hostname or "localhost",
            port=port or 3306,
            database=database,
            unix_socket=socket_path,
            tls=tls_options(tls, "bad DSN: ssl_mode"),
            hosts=hosts,
            server_public_key=server_public_key,
        )

    def masked(self) -> str:
        """The DSN as a URL with the password replaced: safe for logs and `notifyq config`."""
        auth = self.user + (":***" if self.password else "")
        host = ",".join(f"{_bracketed(h)}:{p}" for h, p in self.servers) if not self.unix_socket else self.host
        params = dict(self.tls)
        if self.unix_socket:
            params["unix_socket"] = self.unix_socket
        if self.server_public_key:
            params["server_public_key"] = self.server_public_key
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        return f"mysql://{auth}@{host}/{self.database}{query}"

    def connect_args(self, server: int = 0) -> dict[str, Any]:
        """The driver's arguments for one server: `server` indexes `servers`."""
        args: dict[str, Any] = {"user": self.user, "database": self.database, "charset": "utf8mb4"}
        if self.password:
            args["password"] = self.password
        if self.unix_socket:
            args["unix_socket"] = self.unix_socket
        else:
            args["host"], args["port"] = self.servers[server]
        if self.tls:
            # Passed through to the driver as its `ssl` mapping (ca, cert, key, capath, cipher).
            # The driver alone does not refuse a server without TLS (MariaDB Connector/C ignores
            # ssl_mode): store.db checks the session's cipher after connecting (_require_tls).
            args["ssl"] = {k.removeprefix("ssl_"): v for k, v in self.tls.items() if k != "ssl_mode"}
            args["ssl_mode"] = self.tls_mode
        if self.server_public_key:
            args["server_public_key_path"] = self.server_public_key
        return args

    def check_files(self) -> None:
        """Files the driver would open later, checked now: a missing CA is an error, not plaintext."""
        for key in _TLS_FILES:
            path = self.tls.get(f"ssl_{key}")
            if path is not None:
                values.readable_file(f"TLS {key} file" if key != "capath" else "TLS capath", path)
        if self.server_public_key:
            values.readable_file("server_public_key file", self.server_public_key)
        if self.unix_socket:
            # A socket that is not there yet may be a server still starting (retried); a path that
            # can never become one is a typo.
            try:
                st = os.stat(self.unix_socket)
            except FileNotFoundError:
                if not os.path.isdir(os.path.dirname(self.unix_socket) or "."):
                    raise errors.ConfigError(f"unix_socket {values.shown(self.unix_socket)}: its directory "
                                             "does not exist") from None
                return
            except (OSError, ValueError):
                raise errors.ConfigError(f"unix_socket {values.shown(self.unix_socket)}: not a valid path") from None
            if not stat.S_ISSOCK(st.st_mode):
                raise errors.ConfigError(f"unix_socket {values.shown(self.unix_socket)} is not a socket")

    @property
    def tls_mode(self) -> str | None:
        """None: no TLS option given. Else the mode: a named CA means the CA is verified."""
        if not self.tls:
            return None
        if "ssl_mode" in self.tls:
            return self.tls["ssl_mode"]
        return "VERIFY_CA" if ("ssl_ca" in self.tls or "ssl_capath" in self.tls) else "REQUIRED"


def tls_options(tls: dict[str, str], where: str) -> dict[str, str]:
    """Normalise ssl_mode; a mode that allows plaintext is refused (any TLS option means TLS)."""
    if "ssl_mode" not in tls:
        return tls
    mode = str(tls["ssl_mode"]).upper()
    if mode not in TLS_MODES:
        raise errors.ConfigError(f"{where} {values.shown(tls['ssl_mode'])}: expected {', '.join(TLS_MODES)} "
                                 "(leave out every TLS option for a connection without TLS)")
    return {**tls, "ssl_mode": mode}


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _host_list(text: str) -> tuple[tuple[str, int], ...]:
    """`h1:p1,h2:p2,...` (ports optional, IPv6 in brackets) -> ((h1, p1), (h2, p2), ...)."""
    out = []
    for entry in text.split(","):
        try:
            one = urllib.parse.urlsplit("//" + entry)
            port = one.port
        except ValueError:
            raise errors.ConfigError("bad DSN: in a list of hosts, each is host or host:port, the port "
                                     "a number from 1 to 65535 (an IPv6 address goes in [brackets])") from None
        if not one.hostname or one.username is not None or one.path or one.query or port == 0:
            raise errors.ConfigError("bad DSN: an empty or invalid host in the list of hosts "
                                     "(expected host1:port1,host2:port2,...)")
        out.append((one.hostname, port or 3306))
    if len(set(out)) != len(out):
        raise errors.ConfigError("bad DSN: a host is named twice in the list of hosts")
    return tuple(out)
