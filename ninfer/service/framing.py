"""Incremental HTTP/1.x request framing: when has one whole request (headers and body) arrived?

The connection reader feeds the growing receive buffer to `RequestFraming.scan` after every read;
the answer says whether the request is complete (and where it ends), still arriving, or refused.
Only framing is decided here (Content-Length, chunked, none); gunicorn's parser still parses the
complete request on the handler thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

MAX_HEADER_BYTES = 64 * 1024  # request line and header fields together
MAX_CHUNK_LINE = 1024  # a chunk-size line with its extensions
_HEX = frozenset(b"0123456789abcdefABCDEF")


class Verdict(Enum):
    INCOMPLETE = "incomplete"
    COMPLETE = "complete"  # the request ends at `Scan.end`
    HEADERS_ONLY = "headers_only"  # declared body over the limit: hand the head over, never read the body
    REFUSED = "refused"  # answer `Scan.status` and close


@dataclass(frozen=True)
class Scan:
    verdict: Verdict
    end: int = 0
    status: int = 0
    reason: str = ""


_INCOMPLETE = Scan(Verdict.INCOMPLETE)


@dataclass(frozen=True)
class Head:
    """What the reader needs from the request head."""

    method: str
    path: str
    version: str
    headers: dict[str, str]  # lower-case names; repeated fields joined with ","
    end: int  # offset just past the blank line


def parse_head(buf: bytes | bytearray, end: int) -> Head | None:
    """The head in `buf[:end]` (which ends with CRLF CRLF); None when its request line is malformed."""
    lines = buf[: end - 4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        key = name.strip().lower().decode("latin-1")
        val = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]},{val}" if key in headers else val
    method, path, version = (p.decode("latin-1") for p in parts)
    return Head(method, path.split("?", 1)[0], version, headers, end)


class RequestFraming:
    """Scans one request as its bytes arrive; keeps its place so each byte is looked at about once."""

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self.head: Head | None = None
        self._length: int | None = None  # Content-Length framing
        self._chunked = False
        self._pos = 0  # chunked: where the next chunk-size line starts
        self._body = 0  # chunked: data bytes so far
        self._searched = 0  # head: bytes already searched for the blank line

    @property
    def wants_continue(self) -> bool:
        """An HTTP/1.1 `Expect: 100-continue` head whose body has not been sent yet."""
        head = self.head
        return (
            head is not None
            and head.version == "HTTP/1.1"
            and head.headers.get("expect", "").lower() == "100-continue"
        )

    def scan(self, buf: bytes | bytearray) -> Scan:
        if self.head is None:
            found = buf.find(b"\r\n\r\n", max(0, self._searched - 3))
            if found < 0:
                self._searched = len(buf)
                if len(buf) > MAX_HEADER_BYTES:
                    return Scan(Verdict.REFUSED, status=431, reason="the request head is too large")
                return _INCOMPLETE
            head = parse_head(buf, found + 4)
            if head is None:
                return Scan(Verdict.REFUSED, status=400, reason="malformed request line")
            self.head = head
            refused = self._framing(head)
            if refused is not None:
                return refused
        assert self.head is not None
        if self._chunked:
            return self._scan_chunks(buf)
        length = self._length or 0
        if length > self.max_body_bytes:
            return Scan(Verdict.HEADERS_ONLY, end=self.head.end)
        end = self.head.end + length
        return Scan(Verdict.COMPLETE, end=end) if len(buf) >= end else _INCOMPLETE

    def _framing(self, head: Head) -> Scan | None:
        te = head.headers.get("transfer-encoding")
        if te is not None:
            if te.strip().lower() != "chunked":
                return Scan(Verdict.REFUSED, status=400, reason="unsupported transfer-encoding")
            if "content-length" in head.headers:
                return Scan(Verdict.REFUSED, status=400, reason="both content-length and chunked")
            self._chunked = True
            self._pos = head.end
            return None
        cl = head.headers.get("content-length")
        if cl is None:
            return None
        if not cl.isdigit() or len(cl) > 18:
            return Scan(Verdict.REFUSED, status=400, reason="invalid content-length")
        self._length = int(cl)
        return None

    def _scan_chunks(self, buf: bytes | bytearray) -> Scan:
        pos = self._pos
        while True:
            eol = buf.find(b"\r\n", pos, pos + MAX_CHUNK_LINE + 2)
            if eol < 0:
                if len(buf) - pos > MAX_CHUNK_LINE:
                    return Scan(Verdict.REFUSED, status=400, reason="invalid chunk size line")
                return _INCOMPLETE
            digits = buf[pos:eol].split(b";", 1)[0].strip()
            if not digits or len(digits) > 15 or not set(digits) <= _HEX:
                return Scan(Verdict.REFUSED, status=400, reason="invalid chunk size")
            size = int(digits, 16)
            if size == 0:
                return self._scan_trailers(buf, eol + 2)
            self._body += size
            if self._body > self.max_body_bytes:
                return Scan(Verdict.REFUSED, status=413, reason="too_large")
            data_end = eol + 2 + size
            if len(buf) < data_end + 2:
                self._body -= size  # counted again once the chunk is whole
                return _INCOMPLETE
            if buf[data_end : data_end + 2] != b"\r\n":
                return Scan(Verdict.REFUSED, status=400, reason="chunk data not followed by CRLF")
            pos = self._pos = data_end + 2

    def _scan_trailers(self, buf: bytes | bytearray, start: int) -> Scan:
        if buf[start : start + 2] == b"\r\n":
            return Scan(Verdict.COMPLETE, end=start + 2)
        found = buf.find(b"\r\n\r\n", start)
        if found < 0:
            if len(buf) - start > MAX_HEADER_BYTES:
                return Scan(Verdict.REFUSED, status=431, reason="the trailer section is too large")
            return _INCOMPLETE
        return Scan(Verdict.COMPLETE, end=found + 4)
