"""--vision through HTTP with the official SDKs: images by data URI and URL, cache hits in the request
log, budget and address-policy refusals as 400 codes (tiny VL artifact with the real tokenizer)."""

from __future__ import annotations

import base64
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anthropic
import openai
import pytest
from PIL import Image

from ninfer.artifact.convert import convert
from tests.service.conftest import API_KEY, Server, start_server, stop_server
from tests.vision.media_samples import encode, smooth_rgb

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from hf_fixtures import make_hf_checkpoint

# patch 4 x merge 2: a 32x32 image is an (1, 8, 8) grid = 16 merged tokens
PREPROCESSOR = {
    "patch_size": 4,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "size": {"shortest_edge": 64, "longest_edge": 1024},
}


def png(seed: int, size: int = 32) -> bytes:
    return encode(Image.fromarray(smooth_rgb(size, size, seed)))


def data_uri(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png(seed)).decode()


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("vl")
    hf = make_hf_checkpoint(tmp / "hf", "dense", vl=True, vocab_size=248320, with_mtp=False)
    (hf / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
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


def _serve(tmp: Path, artifact: Path, *extra: str) -> Server:
    return start_server(
        tmp,
        [
            f"model.artifact={artifact}",
            "vision.enabled=true",
            "engine.max_context=512",
            "engine.max_concurrency=1",
            "logging.log_stats_interval_ms=0",
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def vserver(tmp_path_factory: pytest.TempPathFactory, artifact: Path) -> Iterator[Server]:
    srv = _serve(tmp_path_factory.mktemp("vsrv"), artifact, "vision.allow_private_media_urls=true")
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


def test_private_urls_refused_by_default(tmp_path: Path, artifact: Path, media_host: str) -> None:
    srv = _serve(tmp_path, artifact)
    try:
        with pytest.raises(openai.BadRequestError) as err:
            _chat(srv, f"{media_host}/3.png")
        assert err.value.code == "media_url_forbidden"
    finally:
        assert stop_server(srv) == 0
