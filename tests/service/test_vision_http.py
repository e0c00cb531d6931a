"""--vision through HTTP with the official SDKs: images by data URI and URL, cache hits in the request
log, videos through Chat Completions and Responses (token counts against transformers' expansion),
budget and address-policy refusals as 400 codes, and live media bytes returning to the retained
level after a disconnected stream and a queue timeout (tiny VL artifact with the real tokenizer)."""

from __future__ import annotations

import base64
import io
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anthropic
import av
import jsonschema
import numpy as np
import openai
import pytest
from PIL import Image
from tokenizers import Tokenizer
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as ref_smart_resize
from transformers.video_utils import read_video_pyav

from ninfer.artifact import open_artifact
from ninfer.artifact.convert import convert
from ninfer.media.image import PREPARE_BYTES_PER_PIXEL
from tests.service.conftest import API_KEY, Server, start_server, stop_server
from tests.vision.media_samples import encode, smooth_rgb

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from hf_fixtures import make_hf_checkpoint

# patch 4 x merge 2: a 32x32 image is an (1, 8, 8) grid = 16 merged tokens; up to 128x128 unresized
PREPROCESSOR = {
    "patch_size": 4,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "size": {"shortest_edge": 64, "longest_edge": 128 * 128},
}
# 32x32 frames stay 32x32 (t*h*w within [1024, 65536]): 16 merged tokens per temporal patch
VIDEO_PREPROCESSOR = {
    **PREPROCESSOR,
    "size": {"shortest_edge": 1024, "longest_edge": 65536},
    "fps": 2.0,
    "min_frames": 4,
    "max_frames": 16,
}
PATCH_BYTES = 3 * 2 * 4 * 4 * 2  # one BF16 patch: channels x temporal x patch x patch x 2 bytes
SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "request-log.schema.json").read_text())


def png(seed: int, size: int = 32) -> bytes:
    return encode(Image.fromarray(smooth_rgb(size, size, seed)))


def data_uri(seed: int, size: int = 32) -> str:
    return "data:image/png;base64," + base64.b64encode(png(seed, size)).decode()


def mp4(frames: int, fps: int, size: int = 32) -> bytes:
    """A small MPEG-4 clip written with PyAV (each frame a shifted smooth pattern)."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = size, size, "yuv420p"
        for i in range(frames):
            img = np.roll(smooth_rgb(size, size, i % 3), 3 * i, axis=1)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        out.mux(stream.encode())
    return buf.getvalue()


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("vl")
    hf = make_hf_checkpoint(tmp / "hf", "dense", vl=True, vocab_size=248320, with_mtp=False)
    (hf / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    (hf / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PREPROCESSOR))
    return convert(hf, tmp / "vl.ninfer")


@pytest.fixture(scope="module")
def media_host() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = png(int(self.path.strip("/").split(".")[0]))
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _serve(tmp: Path, artifact: Path, *extra: str, stats_ms: int = 0, max_context: int = 512) -> Server:
    return start_server(
        tmp,
        [
            f"model.artifact={artifact}",
            "vision.enabled=true",
            f"engine.max_context={max_context}",
            "engine.max_concurrency=1",
            f"logging.log_stats_interval_ms={stats_ms}",
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def vserver(tmp_path_factory: pytest.TempPathFactory, artifact: Path) -> Iterator[Server]:
    srv = _serve(tmp_path_factory.mktemp("vsrv"), artifact, "vision.allow_private_media_urls=true")
    yield srv
    assert stop_server(srv) == 0, srv.stderr_path.read_text()[-3000:]


@pytest.fixture(scope="module")
def lean_server(tmp_path_factory: pytest.TempPathFactory, artifact: Path) -> Iterator[Server]:
    """Default URL policy, nothing retained by the media cache (live bytes are request-held bytes
    only), a 2 s pending timeout, a throughput event every 100 ms, and room for a stream long
    enough to outlast that timeout on any machine."""
    srv = _serve(
        tmp_path_factory.mktemp("lean"),
        artifact,
        "vision.media_cache_mib=0",
        "engine.pending_timeout_ms=2000",
        stats_ms=100,
        max_context=16384,
    )
    yield srv
    assert stop_server(srv) == 0, srv.stderr_path.read_text()[-3000:]


def _oa(srv: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key=API_KEY, max_retries=0)


def _chat(srv: Server, *urls: str, max_tokens: int = 3):
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return _oa(srv).chat.completions.create(
        model="hf",
        messages=[{"role": "user", "content": [*parts, {"type": "text", "text": "Describe."}]}],
        max_tokens=max_tokens,
    )


def _starts(srv: Server) -> list[dict]:
    return [e for e in srv.events() if e["event"] == "request_start"]


def test_images_by_data_uri_and_url_and_cache_hits(vserver: Server, media_host: str) -> None:
    text_only = _oa(vserver).chat.completions.create(
        model="hf", messages=[{"role": "user", "content": "Describe."}], max_tokens=1
    )
    one = _chat(vserver, data_uri(1))
    # the placeholder triple becomes <vs> + 16 image pads + <ve>
    assert one.usage.prompt_tokens == text_only.usage.prompt_tokens + 3 + 15
    by_url = _chat(vserver, f"{media_host}/1.png")  # the same bytes by URL: a cache hit
    assert by_url.usage.prompt_tokens == one.usage.prompt_tokens
    starts = _starts(vserver)
    assert starts[-2]["media"]["cache_misses"] == 1 and starts[-1]["media"]["cache_hits"] == 1
    assert starts[-1]["media"]["source_bytes"] == len(png(1))
    dones = [e for e in vserver.events() if e["event"] == "request_done"]
    assert dones[-1]["timings_seconds"]["vision"] >= 0.0 and dones[-2]["timings_seconds"]["vision"] > 0.0


def test_anthropic_and_responses_images(vserver: Server) -> None:
    client = anthropic.Anthropic(base_url=vserver.url, api_key=API_KEY, max_retries=0)
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png(2)).decode()},
    }
    msg = client.messages.create(
        model="hf",
        max_tokens=2,
        messages=[{"role": "user", "content": [block, {"type": "text", "text": "Hi"}]}],
    )
    count = client.messages.count_tokens(
        model="hf", messages=[{"role": "user", "content": [block, {"type": "text", "text": "Hi"}]}]
    )
    assert msg.usage.input_tokens == count.input_tokens
    resp = _oa(vserver).responses.create(
        model="hf",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": data_uri(2)},
                    {"type": "input_text", "text": "Hi"},
                ],
            }
        ],
        max_output_tokens=16,
    )
    assert resp.usage.input_tokens > 16


def test_budget_and_bad_urls_are_400(vserver: Server) -> None:
    with pytest.raises(openai.BadRequestError) as err:  # 40 images x 16 tokens > min(512, 32768)
        _chat(vserver, *[data_uri(100 + i) for i in range(40)])
    assert err.value.status_code == 400 and err.value.code == "media_budget_exceeded"
    with pytest.raises(openai.BadRequestError) as err:
        _chat(vserver, "file:///etc/passwd")
    assert err.value.code == "invalid_media"
    with pytest.raises(openai.BadRequestError) as err:
        _chat(vserver, "data:image/png;base64," + base64.b64encode(b"not an image").decode())
    assert err.value.code == "invalid_media"


def test_private_urls_refused_by_default(lean_server: Server, media_host: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _chat(lean_server, f"{media_host}/3.png")
    assert err.value.code == "media_url_forbidden"


def _video_reference(data: bytes, tokenizer: Tokenizer) -> tuple[int, dict]:
    """transformers' reading, sampling and `<t seconds>` expansion of one clip: the tokens it adds to
    a text-only prompt (the template's <vs><video_pad><ve> with the pad expanded), and its log item."""
    proc = Qwen3VLVideoProcessor(
        size=VIDEO_PREPROCESSOR["size"],
        fps=VIDEO_PREPROCESSOR["fps"],
        min_frames=VIDEO_PREPROCESSOR["min_frames"],
        max_frames=VIDEO_PREPROCESSOR["max_frames"],
    )
    frames, meta = read_video_pyav(io.BytesIO(data), sample_indices_fn=partial(proc.sample_frames))
    size = VIDEO_PREPROCESSOR["size"]
    h, w = ref_smart_resize(
        frames.shape[0], frames.shape[1], frames.shape[2], 2, 8, size["shortest_edge"], size["longest_edge"]
    )
    stamps = Qwen3VLProcessor._calculate_timestamps(None, meta.frames_indices, meta.fps, 2)
    per_frame = (h // 4) * (w // 4) // 4
    labels = sum(len(tokenizer.encode(f"<{t:.1f} seconds>", add_special_tokens=False).ids) for t in stamps)
    added = 2 + labels + len(stamps) * (2 + per_frame)
    item = {
        "modality": "video",
        "grid_thw": [len(stamps), h // 4, w // 4],
        "vision_tokens": len(stamps) * per_frame,
        "frame_timestamps_seconds": stamps,
    }
    return added, item


def test_video_by_chat_and_responses(vserver: Server, artifact: Path) -> None:
    data = mp4(frames=8, fps=1)  # 8 s at 1 fps, sampled at 2 fps: all 8 frames, 4 temporal patches
    uri = "data:video/mp4;base64," + base64.b64encode(data).decode()
    tokenizer = Tokenizer.from_file(str(open_artifact(artifact).tokenizer_path))
    added, item = _video_reference(data, tokenizer)
    assert len(item["frame_timestamps_seconds"]) == 4  # the clip really has several frames
    oa = _oa(vserver)
    text_only = oa.chat.completions.create(
        model="hf", messages=[{"role": "user", "content": "Describe."}], max_tokens=1
    )
    chat = oa.chat.completions.create(
        model="hf",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "video_url", "video_url": {"url": uri}},
                    {"type": "text", "text": "Describe."},
                ],
            }
        ],
        max_tokens=1,
    )
    content = [{"type": "input_video", "video_url": uri}, {"type": "input_text", "text": "Describe."}]
    inputs = [{"role": "user", "content": content}]
    counted = oa.responses.input_tokens.count(model="hf", input=inputs).input_tokens  # type: ignore[arg-type]
    resp = oa.responses.create(model="hf", input=inputs, max_output_tokens=16)  # type: ignore[arg-type]
    assert chat.usage.prompt_tokens == text_only.usage.prompt_tokens + added
    assert counted == chat.usage.prompt_tokens
    assert resp.usage.input_tokens == counted and 0 < resp.usage.output_tokens <= 16  # a 200 answer
    video_starts = [e for e in _starts(vserver) if e["media"] and e["media"]["items"] == 1][-2:]
    assert [e["protocol"] for e in video_starts] == ["chat_completions", "responses"]
    for e in video_starts:
        jsonschema.validate(e, SCHEMA)
        assert e["media"]["prepared_items"] == [item]
        assert e["media"]["source_bytes"] == len(data)
        assert e["media"]["payload_bytes"] == item["vision_tokens"] * 4 * PATCH_BYTES
    assert video_starts[0]["media"]["cache_misses"] == 1 and video_starts[1]["media"]["cache_hits"] == 1


def _wait_for(srv: Server, done: Callable[[list[dict]], bool], timeout_s: float = 30.0) -> list[dict]:
    """Poll the request log until `done(events)` is true; return the events."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = srv.events()
        if done(events):
            return events
        tail = [(e["event"], e.get("media_live_bytes"), e.get("finish_reason")) for e in events[-12:]]
        assert time.monotonic() < deadline, f"the request log never reached the expected state: {tail}"
        time.sleep(0.1)


def test_disconnect_and_queue_timeout_release_live_media(lean_server: Server) -> None:
    """A streamed 96x96-image request is disconnected after its first chunk; a 64x64-image request
    queued behind it times out. The throughput events show the queued payload live while it waits,
    then live bytes back at the retained level (0: this server retains nothing)."""
    big, queued = 24 * 24 * PATCH_BYTES, 16 * 16 * PATCH_BYTES  # patches of 96x96, 64x64 images
    oa = _oa(lean_server)
    start = len(lean_server.events())
    stream = oa.chat.completions.create(
        model="hf",
        messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_uri(7, 96)}}]}
        ],
        max_tokens=16000,  # far longer than the 2 s pending timeout at any CPU speed; cancelled below
        temperature=0,  # greedy: the run is the same every time
        stream=True,
    )
    next(iter(stream))  # the request is decoding: its prefill (and the engine's payload use) is over
    with pytest.raises(openai.APIStatusError) as err:  # concurrency 1: waits behind the stream
        _chat(lean_server, data_uri(8, 64), max_tokens=1)
    assert err.value.status_code == 503 and err.value.code == "request_queue_timeout"
    stream.close()  # disconnect

    def settled(events: list[dict]) -> bool:
        new = events[start:]
        cancelled = [i for i, e in enumerate(new) if e["event"] == "request_done"]
        return bool(cancelled) and any(
            e["event"] == "throughput" and e["media_live_bytes"] == e["media_cached_bytes"]
            for e in new[cancelled[0] :]
        )

    new = _wait_for(lean_server, settled)[start:]
    starts = [e for e in new if e["event"] == "request_start"]
    assert [e["media"]["payload_bytes"] for e in starts] == [big, queued]
    assert [e["media"]["prepared_items"][0]["grid_thw"] for e in starts] == [[1, 24, 24], [1, 16, 16]]
    done = next(e for e in new if e["event"] == "request_done")
    assert done["request_id"] == starts[0]["request_id"] and done["finish_reason"] == "cancelled"
    error = next(e for e in new if e["event"] == "request_error")
    assert error["request_id"] == starts[1]["request_id"]
    assert error["http"]["code"] == "request_queue_timeout"
    stats = [e for e in new if e["event"] == "throughput"]
    for e in stats:
        jsonschema.validate(e, SCHEMA)
        assert e["media_cached_bytes"] == 0
    # the queued request's payload alone was live while it waited (the stream's went after prefill)
    assert queued in [e["media_live_bytes"] for e in stats]
    # live bytes also count a decode's transient working set while it runs (MediaCache.hold): a
    # report may land inside either image's decode, at most one such hold above a level
    per_pixel = 4 + 16 + PREPARE_BYTES_PER_PIXEL  # widest decode + conversion + preparation
    # level -> the most a decode may add above it: the 96x96 decode starts from nothing live, the
    # 64x64 one from nothing or from the stream's payload; no decode runs above the other levels
    above = {0: 96 * 96 * per_pixel, big: 64 * 64 * per_pixel, queued: 0, big + queued: 0}
    lives = [e["media_live_bytes"] for e in stats]
    assert all(any(0 <= v - level <= h for level, h in above.items()) for v in lives), (lives, above)
    assert stats[-1]["media_live_bytes"] == 0
