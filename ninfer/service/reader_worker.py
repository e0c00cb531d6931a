"""The gunicorn worker: requests are read whole on the event loop, threads only run the app.

gunicorn's gthread worker hands a connection to a pool thread as soon as one byte is readable,
and the thread then blocks in the parser until the head and body have arrived: a client that
sends its head slowly, lies about its Content-Length or never finishes a chunked body holds a
thread for as long as it likes, and a few dozen of them leave nothing to answer `/health`.

`ReaderWorker` keeps every connection on the worker's selector until one complete request is
buffered (`framing.RequestFraming`), under deadlines: an idle connection is closed after the
keep-alive time, a started request must have its head within `header_timeout_s` and its body
within `body_timeout_s` of the head (else 408 and close), and all buffered bytes together stay
under a budget (else 429). Only then does a thread parse the buffered bytes with gunicorn's own
parser and run the WSGI app. An idle connection therefore costs one file descriptor and a few
hundred bytes, and the thread pool is sized for requests being served, not for clients.
"""

from __future__ import annotations

import errno
import resource
import select
import selectors
import socket
import time
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

from gunicorn import http
from gunicorn.http.errors import NoMoreData
from gunicorn.workers.gthread import TConn, ThreadWorker

from ninfer.api.errors import ApiError, dialect_for_path
from ninfer.service.framing import RequestFraming, Verdict

RECV_BYTES = 256 * 1024
IO_TIMEOUT_S = 30.0  # handler threads: bound on one blocked send (a client that stops reading)
SWEEP_EVERY_S = 0.1  # how often deadlines are checked
OPEN_FILES = 8192  # soft RLIMIT_NOFILE wanted for many cheap connections (capped by the hard limit)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_REASONS = {400: "Bad Request", 408: "Request Timeout", 413: "Payload Too Large", 429: "Too Many Requests"}
_REASONS[431] = "Request Header Fields Too Large"


@dataclass(frozen=True)
class ReaderTimeouts:
    """Read deadlines and the buffer budget (bound to a worker class by `worker_class`)."""

    header_s: float = 10.0
    body_s: float = 60.0
    max_body_bytes: int = 384 * 1024 * 1024
    buffer_budget: int = 1024 * 1024 * 1024


class ReaderConn(TConn):
    """gthread's connection, and whether its last request was answered before its body was read."""

    partial = False  # set per request by `_dispatch`: no keep-alive after the answer


class Reading:
    """A connection on the selector: its receive buffer, framing state and current deadline."""

    def __init__(self, conn: ReaderConn, data: bytes, max_body_bytes: int) -> None:
        self.conn = conn
        self.buf = bytearray(data)
        self.framing = RequestFraming(max_body_bytes)
        self.deadline = 0.0
        self.continued = False

    @property
    def started(self) -> bool:
        return bool(self.buf)


def error_response(status: int, code: str, message: str, path: str) -> bytes:
    """A complete `Connection: close` HTTP/1.1 error in the route's protocol envelope."""
    kind = None if status == 429 else "invalid_request_error"  # the client's doing, not the server's
    body = ApiError(status, code, message, type=kind).body_bytes(dialect_for_path(path))
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class BoundedSource:
    """The parser's socket: a read that finds nothing buffered waits at most `timeout_s`.

    A complete request never reaches it; a refused-early body (over the limit) or a request
    gunicorn frames differently could, and then a silent client must not hold the thread.
    """

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        self.sock = sock
        self.timeout_ms = int(timeout_s * 1000)

    def recv(self, size: int) -> bytes:
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        if not poller.poll(self.timeout_ms):
            raise NoMoreData()
        return self.sock.recv(size)


def worker_class(timeouts: ReaderTimeouts) -> type[ReaderWorker]:
    """A `ReaderWorker` subclass bound to these limits (gunicorn instantiates the class itself)."""
    return type("ReaderWorker", (ReaderWorker,), {"timeouts": timeouts})


def raise_open_files() -> None:
    """Let the worker hold many idle connections (the usual soft limit is 1024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = OPEN_FILES if hard == resource.RLIM_INFINITY else min(OPEN_FILES, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class ReaderWorker(ThreadWorker):
    """gthread with whole-request reads on the event loop (HTTP/1.x only; no TLS, no HTTP/2)."""

    timeouts = ReaderTimeouts()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reading: dict[int, Reading] = {}  # by the connection's fd
        self.buffered = 0
        self._swept = 0.0

    def init_process(self) -> None:
        raise_open_files()
        super().init_process()

    # ----- event loop side -----
    def accept(self, listener: socket.socket) -> None:
        try:
            client, addr = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = ReaderConn(self.cfg, client, addr, listener.getsockname())  # non-blocking
        self._start_reading(conn, b"")

    def _start_reading(self, conn: ReaderConn, data: bytes) -> None:
        state = Reading(conn, data, self.timeouts.max_body_bytes)
        state.deadline = time.monotonic() + self.cfg.keepalive
        conn.sock.setblocking(False)
        self.reading[conn.sock.fileno()] = state
        self.buffered += len(data)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, state))
        if data:
            self._advance(state)

    def _stop_reading(self, state: Reading) -> None:
        self.buffered -= len(state.buf)
        self.reading.pop(state.conn.sock.fileno(), None)
        try:
            self.poller.unregister(state.conn.sock)
        except (KeyError, ValueError, OSError):
            pass

    def _close(self, state: Reading, answer: bytes = b"") -> None:
        self._stop_reading(state)
        self.nr_conns -= 1
        if answer:
            try:
                state.conn.sock.send(answer)  # small; a full send buffer just loses it
            except OSError:
                pass
        state.conn.close()

    def _on_readable(self, state: Reading, _sock: Any) -> None:
        try:
            data = state.conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(state)
            return
        if not data:
            self._close(state)
            return
        if not state.started:  # the head's deadline runs from its first byte
            state.deadline = time.monotonic() + self.timeouts.header_s
        state.buf += data
        self.buffered += len(data)
        if self.buffered > self.timeouts.buffer_budget:
            self._refuse(state, 429, "server_overloaded", "the server is buffering too many request bodies")
            return
        self._advance(state)

    def _advance(self, state: Reading) -> None:
        had_head = state.framing.head is not None
        scan = state.framing.scan(state.buf)
        head = state.framing.head
        if head is not None and not had_head:  # the body's deadline runs from the end of the head
            state.deadline = time.monotonic() + self.timeouts.body_s
        if scan.verdict is Verdict.INCOMPLETE:
            if state.framing.wants_continue and not state.continued and head is not None:
                state.continued = True
                try:
                    state.conn.sock.send(_CONTINUE)
                except OSError:
                    pass
            return
        if scan.verdict is Verdict.REFUSED:
            if scan.status == 413:
                mib = self.timeouts.max_body_bytes / (1024 * 1024)
                self._refuse(
                    state, 413, "request_too_large", f"request body exceeds max_request_mib ({mib:g} MiB)"
                )
            else:
                self._refuse(state, scan.status, "invalid_request", scan.reason)
            return
        self._dispatch(state, scan.end, whole=scan.verdict is Verdict.COMPLETE)

    def _refuse(self, state: Reading, status: int, code: str, message: str) -> None:
        path = state.framing.head.path if state.framing.head is not None else "/"
        self._close(state, error_response(status, code, message, path))

    def _dispatch(self, state: Reading, end: int, whole: bool) -> None:
        """Hand one buffered request (and any pipelined bytes after it) to a thread."""
        self._stop_reading(state)
        conn = state.conn
        conn.initialized = True
        conn.data_ready = True
        conn.partial = not whole  # the body was never read: no keep-alive after the answer
        conn.parser = http.get_parser(self.cfg, BoundedSource(conn.sock, self.timeouts.body_s), conn.client)
        conn.parser.unreader.unread(bytes(state.buf))
        self.enqueue_req(conn)

    def _sweep(self, now: float, force: bool = False) -> None:
        for state in [s for s in self.reading.values() if force or s.deadline <= now]:
            if state.started and not force:
                self._refuse(state, 408, "request_timeout", "the request was not received in time")
            else:
                self._close(state)

    def murder_keepalived(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._swept >= SWEEP_EVERY_S:
            self._swept = now
            self._sweep(now, force)
        super().murder_keepalived(force)

    def _cap_keepalive(self, deadline: float) -> None:
        """Stopping: idle connections go within the linger; started requests keep their deadline."""
        for state in self.reading.values():
            if not state.started:
                state.deadline = min(state.deadline, deadline)
        super()._cap_keepalive(deadline)

    def finish_request(self, conn: TConn, fs: Future[bool]) -> None:
        """Back from the thread: a kept-alive connection returns to reading, with what it pipelined."""
        try:
            keep = fs.result() if not fs.cancelled() else False
        except Exception:
            keep = False
        if not keep:
            self.nr_conns -= 1
            conn.close()
            return
        try:
            rest = conn.parser.unreader.take_buffered()
            self._start_reading(conn, rest or b"")
        except Exception:
            self.nr_conns -= 1
            conn.close()

    # ----- thread side -----
    def handle_request(self, req: Any, conn: TConn) -> bool:
        req._expected_100_continue = False  # answered by the reader while the body was pending
        conn.sock.settimeout(IO_TIMEOUT_S)  # a client that stops reading the answer
        return super().handle_request(req, conn)

    def _keepalive_after(self, conn: TConn, keepalive: bool) -> bool:
        if isinstance(conn, ReaderConn) and conn.partial:
            return False
        return super()._keepalive_after(conn, keepalive)
