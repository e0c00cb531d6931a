"""Legacy /v1/completions, /tokenize and /detokenize over real HTTP (the terse model's server)."""

from __future__ import annotations

import json

import requests

from tests.service.conftest import MODEL, Server


def _post(server: Server, path: str, body: dict, **kw: object) -> requests.Response:
    return requests.post(f"{server.url}{path}", json=body, headers=server.headers(), timeout=120, **kw)


def test_tokenize_round_trip(compat_server: Server) -> None:
    r = _post(compat_server, "/tokenize", {"prompt": "Hello world"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 0 and body["max_model_len"] == 16384
    r = _post(compat_server, "/detokenize", {"tokens": body["tokens"]})
    assert r.status_code == 200 and r.json() == {"prompt": "Hello world"}
    assert _post(compat_server, "/detokenize", {"tokens": [-1]}).status_code == 400
    assert _post(compat_server, "/tokenize", {"prompt": "x", "extra": 1}).status_code == 400


def test_completion_text_ids_echo_and_stop(compat_server: Server) -> None:
    ids = _post(compat_server, "/tokenize", {"prompt": "The sky is"}).json()["tokens"]
    r = _post(compat_server, "/v1/completions", {"model": MODEL, "prompt": "The sky is", "max_tokens": 8})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["usage"]["prompt_tokens"] == len(ids)
    choice = body["choices"][0]
    assert choice["finish_reason"] in ("stop", "length") and choice["logprobs"] is None
    r = _post(
        compat_server, "/v1/completions", {"model": MODEL, "prompt": [ids], "max_tokens": 4, "echo": True}
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"].startswith("The sky is")
    assert r.json()["usage"]["prompt_tokens"] == len(ids)


def test_completion_stream(compat_server: Server) -> None:
    body = {"model": MODEL, "prompt": "Once", "max_tokens": 6, "stream": True}
    body["stream_options"] = {"include_usage": True}
    r = _post(compat_server, "/v1/completions", body, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    lines = [ln[6:] for ln in r.iter_lines(decode_unicode=True) if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    frames = [json.loads(x) for x in lines[:-1]]
    assert frames[-1]["usage"]["completion_tokens"] >= 1
    assert frames[-2]["choices"][0]["finish_reason"] in ("stop", "length")


def test_completion_refusals(compat_server: Server) -> None:
    r = _post(compat_server, "/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    assert "not supported" in r.json()["error"]["message"]
    r = _post(compat_server, "/v1/completions", {"model": MODEL, "prompt": ["a", "b"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = _post(compat_server, "/v1/completions", {"model": "other", "prompt": "x"})
    assert r.status_code == 404
