"""Media cache: hits / misses, single flight, LRU by bytes, live budget with refcounts, request budgets."""

from __future__ import annotations

import base64
import threading
import time

import pytest
import torch
from PIL import Image

from ninfer.media.cache import MediaCache, MediaCounters, PreparationTimeout, worker_count
from ninfer.media.config import IMAGE, PreparedMedia
from ninfer.media.errors import MediaError
from ninfer.media.preprocess import MediaItem, MediaPreprocessor, RequestLimits
from tests.vision.media_samples import encode, smooth_rgb

KB = 1024


def media(kib: int, tag: str = "") -> PreparedMedia:
    """A payload of exactly `kib` KiB (bf16, 512 values per KiB)."""
    return PreparedMedia(IMAGE, tag, torch.zeros(kib, 512, dtype=torch.bfloat16), (1, 1, kib))


def key(name: str) -> tuple[str, str]:
    return (name, IMAGE)


def test_hit_and_miss_counters() -> None:
    cache = MediaCache(100 * KB, 200 * KB, threads=2)
    c = MediaCounters()
    builds = []
    r1 = cache.get(key("a"), lambda: builds.append(1) or media(10), counters=c)
    r2 = cache.get(key("a"), lambda: builds.append(1) or media(10), counters=c)
    assert builds == [1] and r1.media is r2.media
    assert (c.misses, c.hits, c.built_bytes, c.reused_bytes) == (1, 1, 10 * KB, 10 * KB)
    assert cache.counters.misses == 1 and cache.counters.hits == 1
    assert cache.live_bytes == 10 * KB and cache.retained_bytes == 10 * KB
    r1.release()
    r2.release()
    r2.release()  # idempotent
    assert cache.live_bytes == 10 * KB  # still retained by the LRU


def test_single_flight() -> None:
    cache = MediaCache(100 * KB, 200 * KB, threads=4)
    started, gate = threading.Event(), threading.Event()
    calls = []

    def build() -> PreparedMedia:
        calls.append(1)
        started.set()
        gate.wait(5)
        return media(8)

    counters = [MediaCounters() for _ in range(8)]
    refs = [None] * 8

    def worker(i: int) -> None:
        refs[i] = cache.get(key("same"), build, counters=counters[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    started.wait(5)
    time.sleep(0.1)
    gate.set()
    for t in threads:
        t.join(5)
    assert calls == [1]
    assert sum(c.misses for c in counters) == 1
    assert sum(c.single_flight_waits + c.hits for c in counters) == 7
    assert len({id(r.media) for r in refs}) == 1
    for r in refs:
        r.release()
    assert cache.live_bytes == 8 * KB  # only the LRU's reference remains


def test_single_flight_error_reaches_waiters() -> None:
    cache = MediaCache(100 * KB, 200 * KB, threads=2)
    release = threading.Event()

    def build() -> PreparedMedia:
        release.wait(5)
        raise MediaError("invalid_media", "boom")

    owner = cache.start(key("bad"), build)
    waiter = cache.start(key("bad"), build)
    release.set()
    for p in (owner, waiter):
        with pytest.raises(MediaError, match="boom"):
            p.result(time.monotonic() + 5)
    assert cache.live_bytes == 0 and key("bad") not in cache


def test_lru_by_bytes() -> None:
    cache = MediaCache(30 * KB, 1000 * KB, threads=1)
    for name in "abc":
        cache.get(key(name), lambda: media(10)).release()
    cache.get(key("a"), lambda: media(10)).release()  # touch a: b is now least recent
    cache.get(key("d"), lambda: media(10)).release()
    assert key("b") not in cache and all(key(n) in cache for n in "acd")
    assert cache.retained_bytes == 30 * KB == cache.live_bytes
    cache.get(key("big"), lambda: media(40)).release()  # larger than the cache: never retained
    assert key("big") not in cache and cache.live_bytes == 30 * KB
    off = MediaCache(0, 1000 * KB, threads=1)
    off.get(key("x"), lambda: media(1)).release()
    assert key("x") not in off and off.live_bytes == 0


def test_eviction_keeps_request_references() -> None:
    cache = MediaCache(10 * KB, 100 * KB, threads=1)
    held = cache.get(key("a"), lambda: media(10, "a"))
    cache.get(key("b"), lambda: media(10)).release()  # evicts a from the LRU
    assert key("a") not in cache
    assert held.media.digest == "a" and held.media.patches.shape == (10, 512)
    assert cache.live_bytes == 20 * KB
    shared = held.share()
    held.release()
    assert cache.live_bytes == 20 * KB
    shared.release()
    assert cache.live_bytes == 10 * KB


def test_live_budget_waits_for_release_and_refuses_the_impossible() -> None:
    cache = MediaCache(0, 30 * KB, threads=2)
    a = cache.get(key("a"), lambda: media(20))
    with pytest.raises(MediaError) as e:
        cache.get(key("huge"), lambda: media(31))
    assert e.value.code == "media_budget_exceeded"
    with pytest.raises(PreparationTimeout):
        cache.get(key("b"), lambda: media(20), deadline=time.monotonic() + 0.2)
    assert cache.live_bytes == 20 * KB
    threading.Timer(0.2, a.release).start()
    b = cache.get(key("b"), lambda: media(20), deadline=time.monotonic() + 5)
    assert cache.live_bytes == 20 * KB
    b.release()
    assert cache.live_bytes == 0


def test_live_budget_evicts_retained_payloads_first() -> None:
    cache = MediaCache(30 * KB, 30 * KB, threads=1)
    for name in "abc":
        cache.get(key(name), lambda: media(10)).release()
    assert cache.live_bytes == 30 * KB
    cache.get(key("d"), lambda: media(10), deadline=time.monotonic() + 1).release()
    assert cache.live_bytes == 30 * KB and key("a") not in cache


def test_gate_is_exclusive_with_deadline() -> None:
    cache = MediaCache(0, KB, threads=1)
    with cache.gate():
        with pytest.raises(PreparationTimeout):
            with cache.gate(time.monotonic() + 0.1):
                pass
    with cache.gate(time.monotonic() + 0.1):
        pass


def test_worker_count() -> None:
    assert worker_count(3) == 3 and 1 <= worker_count(0) <= 16


def _uri(w: int, h: int, seed: int = 0) -> str:
    return (
        "data:image/png;base64," + base64.b64encode(encode(Image.fromarray(smooth_rgb(w, h, seed)))).decode()
    )


def test_preprocessor_budgets_and_reuse() -> None:
    cache = MediaCache(64 << 20, 128 << 20, threads=2)
    prep = MediaPreprocessor(cache)
    items = [
        MediaItem(IMAGE, _uri(256, 256)),
        MediaItem(IMAGE, _uri(256, 256)),
        MediaItem(IMAGE, _uri(64, 300, 1)),
    ]
    done = prep.preprocess(items, RequestLimits(), time.monotonic() + 30)
    assert [m.grid_thw for m in done.media] == [(1, 16, 16), (1, 16, 16), (1, 36, 8)]
    assert done.counters.misses == 2 and done.counters.single_flight_waits + done.counters.hits == 1
    again = prep.preprocess(items[:1], RequestLimits())
    assert again.counters.hits == 1 and again.media[0] is done.media[0]
    done.release()
    again.release()
    live = cache.live_bytes
    for limits, what in [
        (RequestLimits(max_source_bytes=1000), "bytes"),
        (RequestLimits(max_decoded_pixels=256 * 256 * 2), "pixels"),
        (RequestLimits(max_vision_tokens=150), "vision tokens"),
        (RequestLimits(max_raw_patches=600), "patches"),
        (RequestLimits.for_context(128), "limit is 512"),
    ]:
        with pytest.raises(MediaError) as e:
            prep.preprocess(items, limits)
        assert e.value.code == "media_budget_exceeded" and what in e.value.message
        assert cache.live_bytes == live  # nothing left referenced by the refused request
    assert RequestLimits.for_context(262144).max_raw_patches == 131072


def test_preprocessor_reports_fetch_errors() -> None:
    prep = MediaPreprocessor(MediaCache(0, 1 << 20, threads=1))
    with pytest.raises(MediaError) as e:
        prep.preprocess([MediaItem(IMAGE, "http://127.0.0.1:9/x.png")], RequestLimits())
    assert e.value.code == "media_url_forbidden"
