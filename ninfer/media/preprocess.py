"""Request-level media preprocessing: acquire, hash, build through the cache, and enforce the request budgets.

`MediaPreprocessor.preprocess(items, limits, deadline)` runs under the cache's preparation permit:
each item is acquired (`fetch_media`) on the calling thread, keyed by SHA-256 of its bytes plus
its modality, and built on the worker pool (all misses of the request in parallel). The request
holds one `MediaRef` per item until `PreparedRequest.release()`; hand the engine `share()`d
references for as long as it needs the payloads.

Budgets per request (`RequestLimits`, any excess -> 400 media_budget_exceeded): acquired source
bytes, decoded pixels (image pixels; sampled video frames x frame pixels), raw patches and merged
vision tokens, the latter two from the Vision envelope min(max_context, 32768) tokens
(4 raw patches each). An image is charged from its header (`ninfer.media.image.probe_image`)
before anything is decoded, and its build holds the decode's transient bytes against the live
media limit (`MediaCache.hold`); a decode larger than that whole limit is refused at once.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from ninfer.media.cache import MediaCache, MediaCounters, MediaRef, Pending
from ninfer.media.config import IMAGE, VIDEO, ImageProcessing, PreparedMedia, VideoProcessing
from ninfer.media.errors import BUDGET_EXCEEDED, INVALID_MEDIA, MediaError
from ninfer.media.fetch import FetchLimits, fetch_media
from ninfer.media.image import load_image, probe_image
from ninfer.media.video import load_video

VISION_TOKEN_ENVELOPE = 32768


@dataclass(frozen=True)
class RequestLimits:
    """Aggregate media budgets of one request."""

    max_source_bytes: int = 256 << 20
    max_decoded_pixels: int = 1 << 30
    max_raw_patches: int = 4 * VISION_TOKEN_ENVELOPE
    max_vision_tokens: int = VISION_TOKEN_ENVELOPE

    @classmethod
    def for_context(cls, max_context: int, **overrides: int) -> RequestLimits:
        """Vision tokens min(max_context, 32768) and raw patches 4x that; other budgets as given."""
        tokens = min(max_context, VISION_TOKEN_ENVELOPE)
        return cls(max_vision_tokens=tokens, max_raw_patches=4 * tokens, **overrides)


@dataclass(frozen=True)
class MediaItem:
    """One media part of the prompt, in prompt order."""

    modality: str  # IMAGE | VIDEO
    url: str


@dataclass
class PreparedRequest:
    """The request's references (prompt order) and what the request log reports about them."""

    refs: list[MediaRef]
    counters: MediaCounters = field(default_factory=MediaCounters)
    source_bytes: int = 0
    acquire_seconds: float = 0.0
    preprocess_seconds: float = 0.0

    @property
    def media(self) -> list[PreparedMedia]:
        """The payloads in prompt order (also the items `ninfer.media.mrope_index.expand_placeholders` takes)."""
        return [r.media for r in self.refs]

    @property
    def payload_bytes(self) -> int:
        return sum(r.media.nbytes for r in self.refs)

    def release(self) -> None:
        for r in self.refs:
            r.release()


class _Usage:
    def __init__(self, limits: RequestLimits, merge: int) -> None:
        self.limits, self.merge = limits, merge
        self.source = self.pixels = self.patches = 0

    def charge_source(self, n: int) -> None:
        self.source += n
        if self.source > self.limits.max_source_bytes:
            raise MediaError(BUDGET_EXCEEDED, f"media sources exceed {self.limits.max_source_bytes} bytes")

    def charge_media(self, ref: MediaRef) -> None:
        """A prepared video's pixels and patches (images are charged from their header)."""
        if ref.media.modality == VIDEO:
            self.charge(ref.media.decoded_pixels, ref.media.raw_patches)

    def charge(self, pixels: int, patches: int) -> None:
        self.pixels += pixels
        self.patches += patches
        lim = self.limits
        if self.pixels > lim.max_decoded_pixels:
            raise MediaError(BUDGET_EXCEEDED, f"decoded media exceed {lim.max_decoded_pixels} pixels")
        if self.patches > lim.max_raw_patches:
            raise MediaError(
                BUDGET_EXCEEDED, f"media need {self.patches} patches; the limit is {lim.max_raw_patches}"
            )
        tokens = self.patches // (self.merge * self.merge)
        if tokens > lim.max_vision_tokens:
            raise MediaError(
                BUDGET_EXCEEDED, f"media need {tokens} vision tokens; the limit is {lim.max_vision_tokens}"
            )


class MediaPreprocessor:
    """Acquisition + preparation front of one `MediaCache`."""

    def __init__(
        self,
        cache: MediaCache,
        fetch_limits: FetchLimits = FetchLimits(),
        image: ImageProcessing = ImageProcessing(),
        video: VideoProcessing = VideoProcessing(),
    ) -> None:
        self.cache, self.fetch_limits, self.image, self.video = cache, fetch_limits, image, video

    def preprocess(
        self, items: Sequence[MediaItem], limits: RequestLimits, deadline: float | None = None
    ) -> PreparedRequest:
        """All items prepared and referenced, or MediaError / PreparationTimeout with nothing held."""
        out = PreparedRequest([])
        usage = _Usage(limits, self.image.merge_size)
        pending: list[Pending] = []
        t0 = time.perf_counter()
        try:
            with self.cache.gate(deadline):
                for item in items:
                    pending.append(self._start(item, usage, limits, out, deadline))
                out.acquire_seconds = time.perf_counter() - t0
                while pending:
                    ref = pending.pop(0).result(deadline, out.counters)
                    out.refs.append(ref)
                    usage.charge_media(ref)
        except BaseException:
            for p in pending:  # builds already started still have to be joined and let go
                try:
                    p.result(deadline).release()
                except BaseException:  # the first error is the one reported
                    pass
            out.release()
            raise
        out.source_bytes = usage.source
        out.preprocess_seconds = time.perf_counter() - t0
        return out

    def _start(
        self,
        item: MediaItem,
        usage: _Usage,
        limits: RequestLimits,
        out: PreparedRequest,
        deadline: float | None,
    ) -> Pending:
        if item.modality not in (IMAGE, VIDEO):
            raise MediaError(INVALID_MEDIA, f"unsupported media modality {item.modality!r}")
        fetched = fetch_media(item.url, self.fetch_limits)
        usage.charge_source(len(fetched.data))
        digest = hashlib.sha256(fetched.data).hexdigest()
        data, cap = fetched.data, limits.max_decoded_pixels
        cfg_i, cache = self.image, self.cache

        def hold(nbytes: int) -> AbstractContextManager[None]:
            return cache.hold(nbytes, deadline)

        if item.modality == IMAGE:
            plan = probe_image(data, cfg_i, cap)
            usage.charge(plan.decoded_pixels, plan.raw_patches)
            if (digest, IMAGE) not in cache:
                cache.check_fits(plan.transient_bytes)
            return cache.start(
                (digest, IMAGE), lambda: load_image(data, cfg_i, cap, digest, hold), out.counters
            )
        cfg_v = self.video
        return cache.start((digest, VIDEO), lambda: load_video(data, cfg_v, cap, digest, hold), out.counters)
