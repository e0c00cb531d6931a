"""Media fetching: data URIs, a local HTTP server, every SSRF refusal, byte / time / redirect bounds."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ninfer.media.errors import MediaError
from ninfer.media.fetch import FetchLimits, fetch_media

BODY = bytes(range(256)) * 40
LOCAL = FetchLimits(allow_private_media_urls=True, total_timeout_s=5)
STALL_S = 60.0  # how long /stall holds its connection open at most
STALL_RELEASE = threading.Event()  # set by the test once its fetch has given up


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path
        if path == "/ok":
            self._send(200, BODY)
        elif path.startswith("/to/"):
            self.send_response(302)
            self.send_header("Location", path[len("/to/") :].replace("_", "/"))
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path.startswith("/loop/"):
            n = int(path.rsplit("/", 1)[1])
            self.send_response(301)
            self.send_header("Location", f"/loop/{n + 1}")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/big-declared":
            self._send(200, b"x" * 5000)
        elif path == "/big-undeclared":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"x" * 5000)
            self.close_connection = True
        elif path == "/stall":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"x")
            self.wfile.flush()
            STALL_RELEASE.wait(STALL_S)  # the rest never comes while the test waits
        elif path == "/host":
            self._send(200, self.headers["Host"].encode())
        else:
            self._send(404, b"")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _code(url: str, limits: FetchLimits, **kw) -> str:
    with pytest.raises(MediaError) as e:
        fetch_media(url, limits, **kw)
    return e.value.code


def test_data_uri() -> None:
    uri = "data:image/png;base64," + base64.b64encode(BODY).decode()
    got = fetch_media(uri, FetchLimits())
    assert got.data == BODY and got.content_type == "image/png"
    assert fetch_media("data:,a%20b", FetchLimits()).data == b"a b"
    assert _code(uri, FetchLimits(max_bytes=100)) == "media_budget_exceeded"
    assert _code("data:image/png;base64,@@@@", FetchLimits()) == "invalid_media"
    assert _code("data:image/png;base64", FetchLimits()) == "invalid_media"


def test_local_server_allowed(server: str) -> None:
    got = fetch_media(server + "/ok", LOCAL)
    assert got.data == BODY and got.url == server + "/ok"
    port = server.rsplit(":", 1)[1]
    assert fetch_media(server + "/host", LOCAL).data == f"127.0.0.1:{port}".encode()


def test_http_errors(server: str) -> None:
    assert _code(server + "/missing", LOCAL) == "media_fetch_failed"
    assert _code("ftp://example.com/a.png", LOCAL) == "invalid_media"
    assert _code("http:///nohost", LOCAL) == "invalid_media"


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "[::1]",
        "169.254.169.254",
        "10.1.2.3",
        "192.168.0.7",
        "172.16.5.5",
        "0.0.0.0",
        "224.0.0.1",
        "100.64.0.1",
        "[::ffff:127.0.0.1]",
        "[fe80::1]",
        "[fc00::1]",
        "localhost",
    ],
)
def test_non_public_refused(host: str) -> None:
    assert _code(f"http://{host}:9/x.png", FetchLimits()) == "media_url_forbidden"


def test_every_resolved_address_is_checked() -> None:
    def resolver(host: str, port: int) -> list[str]:
        return ["93.184.216.34", "127.0.0.1"]

    assert _code("http://mixed.example/x", FetchLimits(), resolver=resolver) == "media_url_forbidden"


def test_connects_to_the_checked_address(server: str) -> None:
    """The resolver is asked once per hop and its (allowed) answer is what is connected to."""
    port = int(server.rsplit(":", 1)[1])
    calls: list[str] = []

    def resolver(host: str, p: int) -> list[str]:
        calls.append(host)
        return ["127.0.0.1"]

    limits = FetchLimits(allow_addresses=frozenset({"127.0.0.1"}))
    got = fetch_media(f"http://media.example:{port}/host", limits, resolver=resolver)
    assert got.data == f"media.example:{port}".encode() and calls == ["media.example"]


def test_refused_when_setting_disabled(server: str) -> None:
    assert _code(server + "/ok", FetchLimits()) == "media_url_forbidden"


def test_redirects(server: str) -> None:
    limits = FetchLimits(allow_addresses=frozenset({"127.0.0.1"}))
    assert fetch_media(server + "/to/_ok", limits).data == BODY
    assert _code(server + "/to/http:__10.0.0.1_x", limits) == "media_url_forbidden"
    port = server.rsplit(":", 1)[1]

    def resolver(host: str, p: int) -> list[str]:
        return {"127.0.0.1": ["127.0.0.1"], "rebind.example": ["127.0.0.2"]}[host]

    evil = server + f"/to/http:__rebind.example:{port}_ok"
    assert _code(evil, limits, resolver=resolver) == "media_url_forbidden"
    assert _code(server + "/to/http:__169.254.169.254_latest", limits) == "media_url_forbidden"
    assert _code(server + "/loop/0", LOCAL) == "media_fetch_failed"
    one = server + "/to/_ok"
    assert _code(one, FetchLimits(allow_private_media_urls=True, max_redirects=0)) == "media_fetch_failed"
    assert fetch_media(one, FetchLimits(allow_private_media_urls=True, max_redirects=1)).data == BODY


def test_byte_cap(server: str) -> None:
    small = FetchLimits(allow_private_media_urls=True, max_bytes=1000)
    assert _code(server + "/big-declared", small) == "media_budget_exceeded"
    assert _code(server + "/big-undeclared", small) == "media_budget_exceeded"


def test_total_timeout(server: str) -> None:
    """The stalled body ends only when the test releases it, so a fetch that gives up before that
    gave up by its own total timeout (a wall-clock bound on how soon would depend on the load)."""
    t0 = time.monotonic()
    try:
        limits = FetchLimits(allow_private_media_urls=True, total_timeout_s=0.5)
        assert _code(server + "/stall", limits) == "media_fetch_failed"
        assert 0.5 <= time.monotonic() - t0 < STALL_S / 2  # by its bound, long before the stall ends
    finally:
        STALL_RELEASE.set()
