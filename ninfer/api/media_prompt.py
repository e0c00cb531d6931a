"""Media of a rendered prompt: preprocess the items, expand their placeholders, build the engine's multimodal input.

`MediaPrompts.expand(token_ids, parts, deadline, turn, response)` runs the request's media through
`MediaPreprocessor` (bounded pool, cache, budgets; the permit waits until the request's deadline),
expands every ``<|image_pad|>`` / ``<|video_pad|>`` to its grid, moves the checkpoint boundaries
accordingly and returns the engine's `MultimodalPrompt` (which owns the payload references until
the engine or the caller closes it) plus the request-log fields.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ninfer.api.errors import ApiError
from ninfer.engine.multimodal import MultimodalPrompt
from ninfer.frontend.conversation import ImagePart, VideoPart
from ninfer.media.cache import PreparationTimeout
from ninfer.media.config import IMAGE, VIDEO, ImageProcessing, PreparedMedia, VideoProcessing
from ninfer.media.errors import MediaError
from ninfer.media.mrope_index import MMTokenIds, build_mm_positions, expand_placeholders
from ninfer.media.preprocess import MediaItem, MediaPreprocessor, PreparedRequest, RequestLimits


class MediaSettings(Protocol):
    """The `vision` settings group as the media path reads it (`ninfer.config`'s `VisionSettings`)."""

    @property
    def media_cache_mib(self) -> int: ...
    @property
    def media_live_mib(self) -> int: ...
    @property
    def media_preprocess_threads(self) -> int: ...
    @property
    def media_max_fetch_mib(self) -> int: ...
    @property
    def media_fetch_timeout_s(self) -> float: ...
    @property
    def allow_private_media_urls(self) -> bool: ...


class VisionTokens(Protocol):
    """The artifact's text config as the media path reads it (`ninfer.model.config.TextConfig`)."""

    @property
    def image_token_id(self) -> int: ...
    @property
    def video_token_id(self) -> int: ...
    @property
    def vision_start_token_id(self) -> int: ...
    @property
    def vision_end_token_id(self) -> int: ...
    @property
    def vision(self) -> dict[str, Any] | None:
        """The vision tower's Hugging Face config (its patch geometry), when the checkpoint has one."""
        ...


class MediaArtifact(Protocol):
    """The opened artifact as the media path reads it (`ninfer.artifact.Artifact`)."""

    @property
    def config(self) -> VisionTokens: ...

    def media_config(self, name: str) -> dict[str, Any] | None:
        """A processor config carried from the checkpoint, or None when it shipped none."""
        ...


@dataclass(frozen=True)
class ExpandedMedia:
    token_ids: tuple[int, ...]
    multimodal: MultimodalPrompt
    turn_checkpoint: int | None
    response_checkpoint: int | None
    log: dict[str, Any]


def media_api_error(exc: BaseException) -> ApiError:
    """MediaError -> 400 with its code; a preparation timeout -> 503 request_queue_timeout."""
    if isinstance(exc, MediaError):
        return ApiError(400, exc.code, exc.message, "messages")
    if isinstance(exc, PreparationTimeout):
        return ApiError(503, "request_queue_timeout", f"media preparation did not finish in time: {exc}")
    raise TypeError(f"not a media error: {exc!r}")


def _log(prep: PreparedRequest) -> dict[str, Any]:
    c = prep.counters
    return {
        "acquire_seconds": prep.acquire_seconds,
        "preprocess_seconds": prep.preprocess_seconds,
        "preprocess_work_seconds": c.build_seconds,
        "cache_hits": c.hits,
        "cache_misses": c.misses,
        "single_flight_waits": c.single_flight_waits,
        "source_bytes": prep.source_bytes,
        "payload_bytes": prep.payload_bytes,
        "built_bytes": c.built_bytes,
        "reused_bytes": c.reused_bytes,
    }


def _item_log(media: PreparedMedia, merge: int) -> dict[str, Any]:
    """One prepared item for the request log: modality, patch grid, vision tokens and, for a video,
    the timestamp of each frame (temporal patch) the prompt labels ``<t seconds>``."""
    out: dict[str, Any] = {
        "modality": media.modality,
        "grid_thw": list(media.grid_thw),
        "vision_tokens": media.merged_tokens(merge),
    }
    if media.modality == VIDEO:
        out["frame_timestamps_seconds"] = list(media.timestamps)
    return out


class MediaPrompts:
    """The media half of prompt preparation for one loaded artifact (vision enabled)."""

    def __init__(
        self,
        preprocessor: MediaPreprocessor,
        max_context: int,
        encode_text: Callable[[str], list[int]],
        ids: MMTokenIds = MMTokenIds(),
        merge: int = 2,
    ) -> None:
        self.preprocessor = preprocessor
        self.limits = RequestLimits.for_context(max_context)
        self.encode_text = encode_text
        self.ids = ids
        self.merge = merge

    def expand(
        self,
        token_ids: Sequence[int],
        parts: Sequence[ImagePart | VideoPart],
        deadline: float | None,
        turn: int | None,
        response: int | None,
    ) -> ExpandedMedia:
        items = [MediaItem(IMAGE if isinstance(p, ImagePart) else VIDEO, p.url) for p in parts]
        try:
            prep = self.preprocessor.preprocess(items, self.limits, deadline)
        except (MediaError, PreparationTimeout) as exc:
            raise media_api_error(exc) from None
        try:
            return self._expand(token_ids, prep, turn, response)
        except BaseException:
            prep.release()
            raise

    def _expand(
        self, token_ids: Sequence[int], prep: PreparedRequest, turn: int | None, response: int | None
    ) -> ExpandedMedia:
        media = prep.media
        try:
            exp = expand_placeholders(token_ids, media, self.encode_text, self.ids, self.merge)
        except ValueError as exc:
            raise ApiError(400, "invalid_media", f"media placeholders: {exc}", "messages") from None
        images = [m.grid_thw for m in media if m.modality == IMAGE]
        videos = [m.grid_thw for m in media if m.modality == VIDEO]
        positions, delta = build_mm_positions(exp.token_ids, images, videos, self.ids, self.merge)
        shift = self._shifts(token_ids, media)
        mm = MultimodalPrompt(media, exp.spans, positions, delta, prep.release)
        log = {
            **_log(prep),
            "items": len(media),
            "prepared_items": [_item_log(m, self.merge) for m in media],
        }
        return ExpandedMedia(tuple(exp.token_ids), mm, shift(turn), shift(response), log)

    def _shifts(
        self, token_ids: Sequence[int], media: Sequence[PreparedMedia]
    ) -> Callable[[int | None], int | None]:
        """Map a boundary in the unexpanded prompt to the expanded one."""
        pads = [i for i, t in enumerate(token_ids) if t in (self.ids.image_pad, self.ids.video_pad)]
        grow = [
            len(expand_placeholders([token_ids[i]], [m], self.encode_text, self.ids, self.merge).token_ids)
            - 1
            for i, m in zip(pads, media, strict=True)
        ]

        def shift(pos: int | None) -> int | None:
            if pos is None:
                return None
            return pos + sum(g for i, g in zip(pads, grow, strict=True) if i < pos)

        return shift


def _processing(artifact: MediaArtifact, vision: dict[str, Any]) -> tuple[ImageProcessing, VideoProcessing]:
    """Image / video processing from the artifact's processor configs, or the class defaults with the
    tower's patch geometry when the checkpoint shipped none."""
    geometry = {
        "patch_size": vision.get("patch_size", 16),
        "temporal_patch_size": vision.get("temporal_patch_size", 2),
        "merge_size": vision.get("spatial_merge_size", 2),
    }
    image = artifact.media_config("preprocessor_config.json") or geometry
    video = artifact.media_config("video_preprocessor_config.json") or geometry
    return ImageProcessing.from_hf(image), VideoProcessing.from_hf(video)


def build_media_prompts(
    vs: MediaSettings, max_context: int, artifact: MediaArtifact, encode_text: Callable[[str], list[int]]
) -> MediaPrompts:
    """The --vision media path: cache, fetch policy and processing from the `vision` settings and the
    artifact; request budgets from the engine's `max_context`."""
    from ninfer.media.cache import MediaCache
    from ninfer.media.fetch import FetchLimits

    cfg = artifact.config
    image, video = _processing(artifact, cfg.vision or {})
    cache = MediaCache(vs.media_cache_mib << 20, vs.media_live_mib << 20, vs.media_preprocess_threads)
    fetch = FetchLimits(
        max_bytes=vs.media_max_fetch_mib << 20,
        total_timeout_s=float(vs.media_fetch_timeout_s),
        allow_private_media_urls=bool(vs.allow_private_media_urls),
    )
    ids = MMTokenIds(
        cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id
    )
    preprocessor = MediaPreprocessor(cache, fetch, image, video)
    return MediaPrompts(preprocessor, max_context, encode_text, ids, image.merge_size)
