"""TLS and basic auth from a web configuration file in the format Prometheus exporters share.

The format of prometheus/exporter-toolkit (``--web.config.file``), so that a file written for
node_exporter works here unchanged::

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # or NoClientCert, VerifyClientCertIfGiven
      client_ca_file: clients.crt
      min_version: TLS12
    http_server_config:
      headers:
        Strict-Transport-Security: max-age=31536000
    basic_auth_users:
      prometheus: $2y$10$...   # bcrypt, e.g. from `htpasswd -nBC 10 prometheus`

A user's hash must be of bcrypt's exact 60-character form, at a cost of 4 to 17 (htpasswd's most), checked from its
text before bcrypt runs. Relative paths are relative to the file. The file and the certificates it names are watched:
a change takes effect for new connections within a second or two, and a broken change is logged while the last
good configuration stays. ``RequestClientCert``, ``RequireAnyClientCert`` (accepting certificates
nobody verified), ``cipher_suites``, ``curve_preferences`` and ``client_allowed_sans`` are Go TLS
settings this server does not offer: a file with them is refused with that reason, not half obeyed.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import logging
import re
import ssl
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt

from crossover_monitor.config.yamlfile import YamlFileError, read_document
from crossover_monitor.errors import ConfigError, Problem

log = logging.getLogger(__name__)

_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_UNSUPPORTED_CLIENT_AUTH = {
    "RequestClientCert": "asks for a certificate it does not verify",
    "RequireAnyClientCert": "accepts any certificate without verifying it",
}
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# The response headers exporter-toolkit lets a web config set.
_HEADERS = (
    "Strict-Transport-Security",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Content-Security-Policy",
)
_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",  # ignored, as Go itself ignores it since 1.18
}
_UNSUPPORTED_TLS_KEYS = ("cipher_suites", "curve_preferences", "client_allowed_sans", "cert", "key")
_CACHE_SIZE = 1024  # checked credentials remembered (successes and failures), least recently used out
# Failed logins are logged one line per window, with the count, not one line per try (a flood wrote 15,000
# lines in 12 s).
_REFUSAL_LOG_WINDOW_S = 10.0
_PEERS_NAMED = 5
# A bcrypt hash as bcrypt writes it: version, two-digit cost, 22 characters of salt, 31 of hash, 60 in all. Checked
# before bcrypt sees it: bcrypt reads only the first 29 characters (a truncated hash was taken, and then no password
# matched it), and the 22nd salt character carries 2 bits, so bcrypt refuses all but these four there.
_BCRYPT_HASH = re.compile(rb"\$2[aby]\$(?P<cost>[0-9]{2})\$[./A-Za-z0-9]{21}[.Oeu][./A-Za-z0-9]{31}")
_MIN_COST = 4  # bcrypt's own least
# The most this server takes, htpasswd's own most (-C 17), so any hash it makes is taken. Each step doubles a check:
# 17 is ~8 s of a core here (10: 0.06 s), and 31 would be days, at every start, reload and new login.
_MAX_COST = 17


@functools.cache
def _dummy_hash(cost: int) -> bytes:
    """Checked against for unknown users, at the configured users' cost: the time does not tell who exists."""
    return bcrypt.hashpw(b"crossover-monitor: no such user", bcrypt.gensalt(rounds=cost))


def _cost(hashed: bytes) -> int:
    """The cost of a bcrypt hash ($2b$10$...)."""
    return int(hashed.split(b"$")[2])


@dataclass(frozen=True, kw_only=True)
class TlsFiles:
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None
    verify: ssl.VerifyMode
    min_version: ssl.TLSVersion
    max_version: ssl.TLSVersion | None


@dataclass(frozen=True, kw_only=True)
class WebConfig:
    tls: TlsFiles | None
    users: Mapping[str, bytes]  # user -> bcrypt hash
    headers: tuple[tuple[str, str], ...]


def parse(path: Path) -> WebConfig:
    """The web config in ``path``; a ConfigError naming every problem."""
    source = str(path)
    try:
        data = read_document(path, what="a web config")
    except YamlFileError as exc:
        raise ConfigError(source, [Problem("", str(exc))]) from None
    problems: list[Problem] = []
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(
            source, [Problem("", "must be a mapping of tls_server_config, http_server_config, basic_auth_users")]
        )
    known = ("tls_server_config", "http_server_config", "basic_auth_users")
    problems.extend(Problem(str(k), f"unknown key (known: {', '.join(known)})") for k in sorted(set(data) - set(known)))
    tls = _tls(data.get("tls_server_config"), path.parent, problems)
    users = _users(data.get("basic_auth_users"), problems)
    headers = _headers(data.get("http_server_config"), problems)
    if problems:
        raise ConfigError(source, problems)
    return WebConfig(tls=tls, users=users, headers=headers)


def _section(value: Any, name: str, problems: list[Problem]) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.append(Problem(name, f"must be a mapping, got {type(value).__name__}"))
        return None
    return value


def _tls(value: Any, base: Path, problems: list[Problem]) -> TlsFiles | None:
    section = _section(value, "tls_server_config", problems)
    if section is None:
        return None
    for key in sorted(set(section) - _TLS_KEYS):
        reason = "not supported by this server" if key in _UNSUPPORTED_TLS_KEYS else "unknown key"
        problems.append(Problem(f"tls_server_config.{key}", reason))
    cert_file = _file(section, "cert_file", base, problems, required=True)
    key_file = _file(section, "key_file", base, problems, required=True)
    verify = _client_auth(section, problems)
    ca_file = _file(section, "client_ca_file", base, problems, required=verify not in (None, ssl.CERT_NONE))
    low = _version(section, "min_version", "TLS12", problems)
    high = _version(section, "max_version", None, problems)
    if cert_file is None or key_file is None or verify is None or low is None:
        return None
    files = TlsFiles(
        cert_file=cert_file, key_file=key_file, client_ca_file=ca_file, verify=verify, min_version=low, max_version=high
    )
    if not any(p.path.startswith("tls_server_config") for p in problems):
        try:
            context(files)
        except (OSError, ssl.SSLError, ValueError) as exc:
            problems.append(Problem("tls_server_config", f"the certificate, key or CA does not load: {exc}"))
    return files


def _file(section: dict[str, Any], key: str, base: Path, problems: list[Problem], *, required: bool) -> Path | None:
    raw = section.get(key)
    if raw is None or raw == "":
        if required:
            problems.append(Problem(f"tls_server_config.{key}", "required"))
        return None
    # Not resolved: certbot's live/cert.pem is a symlink switched to a new archive file at each renewal,
    # and the watcher must follow the name, not the file it named at start.
    found = (base / str(raw)).absolute()
    if not found.is_file():
        problems.append(Problem(f"tls_server_config.{key}", f"no such file: {found}"))
    return found


def _client_auth(section: dict[str, Any], problems: list[Problem]) -> ssl.VerifyMode | None:
    auth = str(section.get("client_auth_type") or "NoClientCert")
    verify = _CLIENT_AUTH.get(auth)
    if verify is None:
        why = _UNSUPPORTED_CLIENT_AUTH.get(auth)
        message = (
            f"{auth} {why}; use VerifyClientCertIfGiven or RequireAndVerifyClientCert"
            if why
            else f"unknown {auth!r} (choose from {', '.join(_CLIENT_AUTH)})"
        )
        problems.append(Problem("tls_server_config.client_auth_type", message))
    return verify


def _version(section: dict[str, Any], key: str, default: str | None, problems: list[Problem]) -> ssl.TLSVersion | None:
    raw = section.get(key, default)
    version = None if raw is None else _VERSIONS.get(str(raw))
    if raw is not None and version is None:
        problems.append(Problem(f"tls_server_config.{key}", f"unknown {raw!r} (choose from {', '.join(_VERSIONS)})"))
    return version


def _users(value: Any, problems: list[Problem]) -> dict[str, bytes]:
    section = _section(value, "basic_auth_users", problems)
    users: dict[str, bytes] = {}
    for user, hashed in (section or {}).items():
        name = f"basic_auth_users.{user}"
        if ":" in str(user) or not str(user):
            problems.append(Problem(name, "a user name must be non-empty and have no ':'"))
            continue
        raw = str(hashed or "").encode()
        problem = _hash_problem(raw)
        if problem is not None:
            problems.append(Problem(name, problem))
            continue
        users[str(user)] = raw
    return users


def _hash_problem(raw: bytes) -> str | None:
    """What is wrong with a user's bcrypt hash, from its form and cost field alone, or None: bcrypt never runs here."""
    shape = _BCRYPT_HASH.fullmatch(raw)
    if shape is None:
        return (
            f"must be a bcrypt hash of 60 characters (this one has {len(raw)}): $2a$, $2b$ or $2y$, "
            "a two-digit cost, $, then 53 of bcrypt's base64 (./A-Za-z0-9), e.g. from `htpasswd -nBC 10 USER`"
        )
    cost = int(shape["cost"])
    if cost > _MAX_COST:
        return (
            f"bcrypt cost {cost} is over {_MAX_COST}, the most this server takes: each check would take "
            f"{2 ** (cost - 10):,} times as long as one at cost 10; hash it again, e.g. `htpasswd -nBC 10 USER`"
        )
    if cost < _MIN_COST:
        return f"bcrypt cost {cost} is under {_MIN_COST}, bcrypt's least; hash it again, e.g. `htpasswd -nBC 10 USER`"
    return None


def _headers(value: Any, problems: list[Problem]) -> tuple[tuple[str, str], ...]:
    section = _section(value, "http_server_config", problems) or {}
    unknown = sorted(set(section) - {"headers", "http2"})  # http2: accepted and ignored (HTTP/1.1 here)
    problems.extend(Problem(f"http_server_config.{k}", "unknown key (known: headers, http2)") for k in unknown)
    headers = _section(section.get("headers"), "http_server_config.headers", problems) or {}
    allowed = {h.lower(): h for h in _HEADERS}
    found: list[tuple[str, str]] = []
    for header, text in headers.items():
        canonical = allowed.get(str(header).lower())
        if canonical is None:
            problems.append(
                Problem(f"http_server_config.headers.{header}", f"not settable (choose from {', '.join(_HEADERS)})")
            )
        elif isinstance(text, (dict, list)) or text is None or not _field_value(str(text)):
            problems.append(Problem(f"http_server_config.headers.{header}", "must be one line of ASCII text"))
        else:
            found.append((canonical, str(text)))  # X-XSS-Protection: 0 is read by YAML as a number
    return tuple(found)


def _field_value(text: str) -> bool:
    """Whether ``text`` can be an HTTP header value (visible ASCII, spaces and tabs)."""
    return all(char == "\t" or " " <= char <= "~" for char in text)


def context(files: TlsFiles) -> ssl.SSLContext:
    """A server SSLContext for ``files``."""
    made = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    made.minimum_version = files.min_version
    if files.max_version is not None:
        made.maximum_version = files.max_version
    made.load_cert_chain(files.cert_file, files.key_file)
    made.verify_mode = files.verify
    if files.client_ca_file is not None:
        made.load_verify_locations(cafile=files.client_ca_file)
    return made


class WebGate:
    """The web config in force: TLS context, who may in, which headers go out; follows the files as they change."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._lock = threading.Lock()
        # Checked credentials: a hash of (user, password, the user's bcrypt hash) -> allowed. Kept across
        # reloads (a changed password changes the key), so a reload does not send every scraper to bcrypt.
        self._checked: OrderedDict[bytes, bool] = OrderedDict()
        self._refusals = _RefusalLog()
        self._config = parse(path) if path is not None else WebConfig(tls=None, users={}, headers=())
        self._dummy = self._dummy_for(self._config)
        self._stamps = self._files_stamp()
        self._tls_context = context(self._config.tls) if self._config.tls is not None else None

    @property
    def tls(self) -> bool:
        return self._tls_context is not None

    def tls_context(self) -> ssl.SSLContext:
        """The TLS context in force now; a reload builds a new one rather than changing this one in use."""
        with self._lock:
            assert self._tls_context is not None  # noqa: S101 - asked only when TLS is on
            return self._tls_context

    def headers(self) -> tuple[tuple[str, str], ...]:
        return self._config.headers

    def _files(self) -> list[Path]:
        files = [self._path] if self._path is not None else []
        tls = self._config.tls
        if tls is not None:
            files += [tls.cert_file, tls.key_file, *([tls.client_ca_file] if tls.client_ca_file else [])]
        return files

    def _files_stamp(self) -> tuple[tuple[str, int, int, int, int], ...]:
        """Each watched file as (name, device, inode, mtime, size), through symlinks: a switched link changes it."""
        stamps = []
        for file in self._files():
            try:
                stat = file.stat()
                stamps.append((str(file), stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_size))
            except OSError:
                stamps.append((str(file), 0, 0, 0, -1))
        return tuple(stamps)

    def refresh(self) -> None:
        """Reread the file and the certificates if any changed; a broken change is logged and not taken.

        Called once a second: also writes the count of refusals logged in short.
        """
        self._refusals.flush()
        stamps = self._files_stamp()
        if stamps == self._stamps or self._path is None:
            return
        self._stamps = stamps
        try:
            config = parse(self._path)
            if (config.tls is None) != (self._tls_context is None):
                log.error("web config: turning TLS on or off takes a restart; the running configuration stays")
                return
            # A whole new context: a removed client CA or a changed version takes effect too.
            fresh = context(config.tls) if config.tls is not None else None
            dummy = self._dummy_for(config)
        except (ConfigError, OSError, ssl.SSLError) as exc:
            log.error(f"web config: the change was refused; the running configuration stays: {exc}")  # noqa: TRY400 - a user's file: no traceback
            return
        with self._lock:
            self._config = config
            self._tls_context = fresh
            self._dummy = dummy
        self._stamps = self._files_stamp()  # the new set of files, if the file now names others
        log.info("web config reloaded", extra={"web_config": str(self._path)})

    @staticmethod
    def _dummy_for(config: WebConfig) -> bytes:
        costs = sorted({_cost(hashed) for hashed in config.users.values()})
        if len(costs) > 1:
            log.warning(
                "web config: basic_auth_users are hashed at different bcrypt costs, so a client can tell them "
                "apart by the time an answer takes; hash them at one cost",
                extra={"costs": costs},
            )
        return _dummy_hash(costs[-1] if costs else 10)

    def quick(self, authorization: str | None) -> bool | None:
        """Whether this Authorization header may in, if that is known without bcrypt; None: ``check`` it."""
        users = self._config.users
        if not users:
            return True
        user, password = _basic(authorization)
        if user is None or password is None:
            return False
        with self._lock:
            return self._checked.get(_key(user, password, users))

    def check(self, authorization: str | None) -> bool:
        """Whether this Authorization header may in, by bcrypt (tens of milliseconds by design); remembered."""
        users = self._config.users  # one snapshot: a reload meanwhile must not key an old check by a new hash
        user, password = _basic(authorization)
        if not users or user is None or password is None:
            return not users
        key = _key(user, password, users)
        hashed = users.get(user)
        try:
            # An unknown user costs the same bcrypt as a known one: the answer's time does not say which exist.
            ok = bcrypt.checkpw(password, hashed or self._dummy) and hashed is not None
        except ValueError:  # e.g. a password over bcrypt's 72 bytes: a failed login, not a 500
            ok = False
        with self._lock:
            self._checked[key] = ok
            self._checked.move_to_end(key)
            while len(self._checked) > _CACHE_SIZE:
                self._checked.popitem(last=False)
        return ok

    def refused(self, authorization: str | None, peer: str, path: str) -> None:
        """Log a refused request without its secret: the first of a window in full, the rest counted."""
        user, _ = _basic(authorization)
        known = user is not None and user in self._config.users
        who = "no credentials" if user is None else f"user {user!r}" + ("" if known else " (unknown)")
        self._refusals.add(peer=peer, path=path, credentials=who)

    def close(self) -> None:
        """The refusals still only counted, logged: at a stop they would be lost."""
        self._refusals.flush(final=True)


def _key(user: str, password: bytes, users: Mapping[str, bytes]) -> bytes:
    """The cache key: a hash, so the cache holds no secret; with the user's hash, so a new password misses."""
    return hashlib.sha256(b"\0".join((user.encode(), password, users.get(user, b"")))).digest()


class _RefusalLog:
    """Refused requests in the log: the first of each window in full, then one line with the count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._window_ends = 0.0
        self._held: Counter[tuple[str, str]] = Counter()

    def add(self, *, peer: str, path: str, credentials: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now < self._window_ends:
                self._held[(peer, credentials)] += 1
                return
        self.flush()
        with self._lock:
            self._window_ends = now + _REFUSAL_LOG_WINDOW_S
        log.warning("unauthorized request", extra={"peer": peer, "path": path, "credentials": credentials})

    def flush(self, *, final: bool = False) -> None:
        """The count held since the window's first line, once the window is over (or now, if ``final``)."""
        with self._lock:
            if not self._held or (time.monotonic() < self._window_ends and not final):
                return
            held, self._held = self._held, Counter()
        peers = sorted({peer for peer, _ in held})
        named = ", ".join(peers[:_PEERS_NAMED]) + (" …" if len(peers) > _PEERS_NAMED else "")
        log.warning(
            f"{sum(held.values())} more unauthorized requests in {_REFUSAL_LOG_WINDOW_S:.0f} s",
            extra={"peers": named, "sources": len(held)},
        )


def _basic(authorization: str | None) -> tuple[str | None, bytes | None]:
    """(user, password) from a Basic Authorization header, or (None, None)."""
    if not authorization or authorization[:6].lower() != "basic ":
        return None, None
    try:
        decoded = base64.b64decode(authorization[6:].strip(), validate=True)
    except (binascii.Error, ValueError):
        return None, None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None, None
    return user.decode("utf-8", "replace"), password
