"""Who may act, and proof that a form came from our own page.

Read-only unless an actions token is configured (`--actions-token-file FILE` or
$NOTIFYQ_WEB_TOKEN; never a flag's value, which every user sees in the process list). A
browser signs in once with the token and a name (who the action log names); a script may send
`Authorization: Bearer TOKEN` instead, which no browser adds by itself to a forged request.

CSRF: every browser gets a random session id in a cookie (HttpOnly, SameSite=Strict), and
every form carries HMAC(secret, session id): a page of another site can neither read our
cookie nor compute the token, so its forms are refused. The secret is random per process, so
a restart signs every browser out. Signing in gives a new session id (no fixation).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import threading
import time

from notifyq import errors

TOKEN_MIN_CHARS = 16
SESSION_TTL_S = 12 * 3600
MAX_SIGNED_IN = 1000  # signed-in sessions kept; the oldest is dropped beyond it
COOKIE = "nq_web"
_NAME = re.compile(r"^[\w .@+-]{1,64}$")
_SID = re.compile(r"^[0-9a-f]{32}$")


def load_token(path: str | None, env: dict[str, str] | None = None) -> str | None:
    """The actions token: from the file, else $NOTIFYQ_WEB_TOKEN, else None (read-only)."""
    env = os.environ if env is None else env
    where = f"--actions-token-file {path}" if path else "NOTIFYQ_WEB_TOKEN"
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                token = f.read().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise errors.ConfigError(f"{where}: cannot read it: {getattr(e, 'strerror', None) or e}") from None
    else:
        raw = env.get("NOTIFYQ_WEB_TOKEN", "")
        if raw == "":  # unset or empty: read-only; blanks only are a token set wrong, refused below
            return None
        token = raw.strip()
    if len(token) < TOKEN_MIN_CHARS or any(c.isspace() for c in token):
        raise errors.ConfigError(f"{where}: the token must be at least {TOKEN_MIN_CHARS} characters "
                                 "without spaces (for example: openssl rand -hex 24)")
    return token


class Guard:
    """The actions token, the CSRF secret and the signed-in browsers of one server process."""

    def __init__(self, token: str | None):
        self.token = token
        self._secret = secrets.token_bytes(32)
        self._signed_in: dict[str, tuple[str, float]] = {}  # session id -> (who, since, monotonic)
        self._lock = threading.Lock()

    @property
    def actions(self) -> bool:
        return self.token is not None

    @staticmethod
    def new_session() -> str:
        return secrets.token_hex(16)

    @staticmethod
    def valid_session(sid: str | None) -> bool:
        return bool(sid) and bool(_SID.match(sid or ""))

    def csrf(self, sid: str) -> str:
        return hmac.new(self._secret, b"csrf:" + sid.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, sid: str | None, value: str | None) -> bool:
        return self.valid_session(sid) and bool(value) and hmac.compare_digest(self.csrf(sid or ""), value or "")

    def token_ok(self, value: str | None) -> bool:
        return self.token is not None and bool(value) and hmac.compare_digest(
            self.token.encode(), (value or "").encode())

    def sign_in(self, token: str, who: str) -> str | None:
        """A new session id for a right token and a plain name, else None."""
        if not self.token_ok(token) or not _NAME.match(who):
            return None
        sid = self.new_session()
        with self._lock:
            while len(self._signed_in) >= MAX_SIGNED_IN:
                self._signed_in.pop(next(iter(self._signed_in)))
            self._signed_in[sid] = (who, time.monotonic())
        return sid

    def who(self, sid: str | None) -> str | None:
        if not self.actions or not sid:
            return None
        with self._lock:
            entry = self._signed_in.get(sid)
            if entry is None:
                return None
            if time.monotonic() - entry[1] > SESSION_TTL_S:
                del self._signed_in[sid]
                return None
            return entry[0]

    def sign_out(self, sid: str | None) -> None:
        with self._lock:
            self._signed_in.pop(sid or "", None)


# ------------------------------------------------------------------ where requests come from and go

# A Host header: a name or an IPv4 literal, or an IPv6 literal in brackets; then a port or not.
_HOST = re.compile(r"(?:\[([0-9a-f:.]+)\]|([a-z0-9.-]+))(?::\d{1,5})?")
_ANY_HOST = re.compile(r"(?:\[[0-9a-f:.]+\]|[a-z0-9._-]+)(?::\d{1,5})?")  # any address's, proxies' names too
# Where a form may send the browser back to: a path of this site in printable ASCII. No
# whitespace or control character: CR/LF would end the Location header and start another (a
# Set-Cookie), and browsers drop tabs and newlines from a URL, so "/\t/evil.example/" is
# "//evil.example/", another site. No backslash: browsers read it as "/".
_BACK = re.compile(r"/(?![/\\])[!-~]{0,1998}")


def loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_named(host: str) -> bool:
    """A Host header that names a host: a name (letters, digits, dots, hyphens, underscores), an
    IPv4 literal or a bracketed IPv6 one, then a port or not. Never empty: a blank Host names no
    site, and a page answered to it is answered to whatever the client meant."""
    return _ANY_HOST.fullmatch(host.strip().lower()) is not None


def host_ok(on_loopback: bool, host: str | None) -> bool:
    """On loopback, only requests addressed to loopback: `localhost` or a loopback address
    literal (127.0.0.1, [::1]), with or without a port. A page of another site whose name was
    made to point at 127.0.0.1 (DNS rebinding) sends its own name and reads nothing, and so
    does a name that merely starts like an address (127.0.0.1.nip.io, 127.evil.example)."""
    if not on_loopback:
        return True
    m = _HOST.fullmatch((host or "").strip().lower())
    if m is None:
        return False
    v6, name = m.groups()
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(v6 or name)
    except ValueError:
        return False
    return address.is_loopback and address.version == (6 if v6 else 4)


def safe_back(text: str | None) -> str:
    """Where a form returns to: a path of this site only (never `//host`, a scheme, or a
    character that a header or a browser would read otherwise); anything else is "/"."""
    if text and _BACK.fullmatch(text) and "\\" not in text:
        return text
    return "/"
