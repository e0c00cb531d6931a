"""Bounded media acquisition from ``data:`` URIs and HTTP(S) URLs, refusing non-public addresses.

Every HTTP hop (the first request and each redirect) resolves the host, checks *every* resolved
address, and connects to a checked address itself (TLS still verifies the certificate against the
host name), so a second DNS answer cannot slip a private address in between check and connect.
Refused unless allowed: loopback, link-local, private, multicast, reserved, unspecified, shared
(100.64/10) addresses, and IPv4-mapped / NAT64-embedded forms of them.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import ipaddress
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

from ninfer.media.errors import BUDGET_EXCEEDED, FETCH_FAILED, INVALID_MEDIA, URL_FORBIDDEN, MediaError

REDIRECTS = {301, 302, 303, 307, 308}
CHUNK = 1 << 16
Resolver = Callable[[str, int], list[str]]


@dataclass(frozen=True)
class FetchLimits:
    """Per-item acquisition limits; `allow_private_media_urls` lifts the address policy entirely,
    `allow_addresses` admits exact addresses only (e.g. one internal media host)."""

    max_bytes: int = 64 << 20
    connect_timeout_s: float = 10.0
    total_timeout_s: float = 30.0
    max_redirects: int = 5
    allow_private_media_urls: bool = False
    allow_addresses: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Fetched:
    """Acquired bytes, the declared media type (may be empty) and the final URL."""

    data: bytes
    content_type: str
    url: str


def system_resolver(host: str, port: int) -> list[str]:
    """All addresses `host` resolves to (TCP), in resolver order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is None and ip in ipaddress.IPv6Network("64:ff9b::/96"):
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None and not _public(embedded):
            return False
    return not (
        ip.is_loopback
        or ip.is_link_local
        or ip.is_private
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or (isinstance(ip, ipaddress.IPv4Address) and ip in ipaddress.IPv4Network("100.64.0.0/10"))
        or (isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local)
    )


def check_addresses(host: str, addresses: list[str], limits: FetchLimits) -> list[str]:
    """The addresses to connect to; MediaError(media_url_forbidden) if any one is not allowed."""
    if not addresses:
        raise MediaError(FETCH_FAILED, f"{host} did not resolve")
    if limits.allow_private_media_urls:
        return addresses
    for a in addresses:
        ip = ipaddress.ip_address(a.split("%", 1)[0])
        if a not in limits.allow_addresses and not _public(ip):
            raise MediaError(URL_FORBIDDEN, f"media URL host {host} resolves to a non-public address ({a})")
    return addresses


def decode_data_uri(uri: str, max_bytes: int) -> Fetched:
    """``data:[type][;base64],payload`` -> bytes, refusing payloads over `max_bytes` before decoding."""
    head, sep, payload = uri[5:].partition(",")
    if not sep:
        raise MediaError(INVALID_MEDIA, "malformed data URI (no comma)")
    params = head.split(";")
    is_b64 = params[-1].strip().lower() == "base64"
    if (len(payload) * 3 // 4 if is_b64 else len(payload) // 3) > max_bytes:
        raise MediaError(BUDGET_EXCEEDED, f"data URI payload exceeds {max_bytes} bytes")
    try:
        data = (
            base64.b64decode("".join(payload.split()), validate=True)
            if is_b64
            else urllib.parse.unquote_to_bytes(payload)
        )
    except (binascii.Error, ValueError) as exc:
        raise MediaError(INVALID_MEDIA, f"malformed base64 in data URI: {exc}") from None
    if len(data) > max_bytes:
        raise MediaError(BUDGET_EXCEEDED, f"data URI payload exceeds {max_bytes} bytes")
    return Fetched(data, params[0].strip().lower(), "data:")


class _PinnedHTTP(http.client.HTTPConnection):
    """HTTP to a pre-checked address; the Host header still names the URL's host."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to a pre-checked address; SNI and certificate checks use the URL's host."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)  # type: ignore[attr-defined]


def _target(url: str) -> tuple[str, str, int, str]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise MediaError(INVALID_MEDIA, f"unsupported media URL scheme {scheme!r}: use http(s) or data")
    if not parts.hostname:
        raise MediaError(INVALID_MEDIA, "media URL has no host")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise MediaError(INVALID_MEDIA, "media URL has an invalid port") from None
    path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    return scheme, parts.hostname, port, path


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise MediaError(FETCH_FAILED, "media fetch timed out")
    return left


def _get_once(url: str, limits: FetchLimits, resolver: Resolver, deadline: float):
    scheme, host, port, path = _target(url)
    try:
        addresses = resolver(host, port)
    except OSError as exc:
        raise MediaError(FETCH_FAILED, f"cannot resolve {host}: {exc}") from None
    last: Exception | None = None
    for address in check_addresses(host, addresses, limits):
        timeout = min(limits.connect_timeout_s, _remaining(deadline))
        cls = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
        conn = cls(host, port, address, timeout)
        try:
            conn.connect()
        except OSError as exc:
            last = exc
            conn.close()
            continue
        sock = conn.sock
        sock.settimeout(min(_remaining(deadline), limits.total_timeout_s))
        conn.request("GET", path, headers={"Accept": "image/*, video/*, */*", "Accept-Encoding": "identity"})
        return conn, sock, conn.getresponse()
    raise MediaError(FETCH_FAILED, f"cannot connect to {host}: {last}")


def _read_body(sock: socket.socket, resp, limits: FetchLimits, deadline: float) -> bytes:
    length = resp.getheader("Content-Length")
    if length is not None and length.isdigit() and int(length) > limits.max_bytes:
        raise MediaError(BUDGET_EXCEEDED, f"media of {length} bytes exceeds {limits.max_bytes} bytes")
    chunks: list[bytes] = []
    total = 0
    while True:
        sock.settimeout(_remaining(deadline))
        chunk = resp.read1(CHUNK) if hasattr(resp, "read1") else resp.read(CHUNK)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limits.max_bytes:
            raise MediaError(BUDGET_EXCEEDED, f"media exceeds {limits.max_bytes} bytes")
        chunks.append(chunk)


def fetch_http(url: str, limits: FetchLimits, resolver: Resolver = system_resolver) -> Fetched:
    """GET `url` within the limits, following at most `max_redirects` checked redirects."""
    deadline = time.monotonic() + limits.total_timeout_s
    for _ in range(limits.max_redirects + 1):
        conn = None
        try:
            conn, sock, resp = _get_once(url, limits, resolver, deadline)
            if resp.status in REDIRECTS:
                location = resp.getheader("Location")
                if not location:
                    raise MediaError(FETCH_FAILED, f"redirect {resp.status} without Location")
                url = urllib.parse.urljoin(url, location)
                continue
            if resp.status != 200:
                raise MediaError(FETCH_FAILED, f"media URL answered HTTP {resp.status}")
            data = _read_body(sock, resp, limits, deadline)
            return Fetched(data, (resp.getheader("Content-Type") or "").split(";")[0].strip().lower(), url)
        except TimeoutError:
            raise MediaError(FETCH_FAILED, "media fetch timed out") from None
        except (OSError, http.client.HTTPException) as exc:
            raise MediaError(FETCH_FAILED, f"media fetch failed: {exc}") from None
        finally:
            if conn is not None:
                conn.close()
    raise MediaError(FETCH_FAILED, f"more than {limits.max_redirects} redirects")


def fetch_media(url: str, limits: FetchLimits, resolver: Resolver = system_resolver) -> Fetched:
    """Acquire the bytes behind a media URL (``data:`` or ``http(s)://``); MediaError on any failure."""
    if url[:5].lower() == "data:":
        return decode_data_uri(url, limits.max_bytes)
    return fetch_http(url, limits, resolver)
