"""Whether an HTTP client is still there: a probe on the request's socket, set on every request.

A non-streaming request writes nothing until its answer is complete, so a client that gives up
is noticed only by looking at the socket: the pipeline calls `req.context.client_gone()` while it
waits on the engine and cancels the request once it returns True. The request was read whole
before the app ran (`reader_worker`), so a readable socket means end of stream (or pipelined
bytes, which `MSG_PEEK` leaves in place and which do not count as gone). The same middleware
records the caller's `x-request-id` so the request log can name it.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Callable

import falcon

from ninfer.service.request_id import client_request_id

_GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL


def client_gone_probe(sock: socket.socket) -> Callable[[], bool]:
    """True once the peer has closed or reset the connection; never blocks."""

    def gone() -> bool:
        poller = select.poll()
        try:
            poller.register(sock, select.POLLIN)
        except (OSError, ValueError):  # closed under us
            return True
        events = poller.poll(0)
        if not events:
            return False
        if events[0][1] & _GONE:
            return True
        try:
            return not sock.recv(1, socket.MSG_PEEK)  # readable: returns at once
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    return gone


class ClientWatch:
    """Falcon middleware: `req.context.client_gone` is the probe (None off gunicorn, e.g. in tests)
    and `req.context.client_request_id` the caller's valid `x-request-id` (or None)."""

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        sock = req.env.get("gunicorn.socket")
        req.context.client_gone = client_gone_probe(sock) if isinstance(sock, socket.socket) else None
        req.context.client_request_id = client_request_id(req.env)
