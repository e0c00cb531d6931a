"""Run as a script: preprocess one generated PNG bomb through a fresh MediaCache and report, as JSON,
the outcome and how far the process's peak and resident memory rose (from /proc/self/status)."""

from __future__ import annotations

import json
import struct
import sys
import time
import zlib

from ninfer.media.cache import MediaCache
from ninfer.media.config import ImageProcessing
from ninfer.media.errors import MediaError
from ninfer.media.preprocess import MediaItem, MediaPreprocessor, RequestLimits


def png_bomb(side: int, bit_depth: int = 1) -> bytes:
    """A `side` x `side` grayscale PNG of zeros, compressed row by row (never held decoded)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    row = b"\0" * (1 + (side * bit_depth + 7) // 8)
    z = zlib.compressobj(9)
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, bit_depth, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def main(side: int, bit_depth: int, live_mib: int) -> None:
    import base64

    data = png_bomb(side, bit_depth)
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    cfg = ImageProcessing(min_pixels=64, max_pixels=16384)
    prep = MediaPreprocessor(MediaCache(0, live_mib << 20, threads=1), image=cfg)
    hwm0, rss0 = status_kib("VmHWM"), status_kib("VmRSS")
    t0 = time.perf_counter()
    out: dict = {"source_bytes": len(data)}
    try:
        done = prep.preprocess([MediaItem("image", uri)], RequestLimits(), time.monotonic() + 60)
        out["grid_thw"] = list(done.media[0].grid_thw)
        done.release()
    except MediaError as exc:
        out["code"], out["message"] = exc.code, exc.message
    out["seconds"] = time.perf_counter() - t0
    out["hwm_growth_mib"] = (status_kib("VmHWM") - hwm0) / 1024
    out["rss_growth_mib"] = (status_kib("VmRSS") - rss0) / 1024
    print(json.dumps(out))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
