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


def _check_legacy_logprobs(lp: dict, top: int) -> None:
    n = len(lp["tokens"])
    assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert all(v <= 0.0 for v in lp["token_logprobs"])
    assert all(1 <= len(t) <= top and all(v <= 0.0 for v in t.values()) for t in lp["top_logprobs"])
    ends = [o + len(t) for o, t in zip(lp["text_offset"], lp["tokens"], strict=True)]
    assert lp["text_offset"][1:] == ends[:-1] and (not n or lp["text_offset"][0] == 0)


def test_completion_logprobs_whole_and_streamed(compat_server: Server) -> None:
    body = {"model": MODEL, "prompt": "The sky is", "max_tokens": 6, "logprobs": 2}
    body |= {"temperature": 1.5, "seed": 7}
    r = _post(compat_server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    choice, usage = r.json()["choices"][0], r.json()["usage"]
    lp = choice["logprobs"]
    _check_legacy_logprobs(lp, 2)
    # one entry per generated token; the stop token that ended the turn is not shown
    assert len(lp["tokens"]) == usage["completion_tokens"] - (choice["finish_reason"] == "stop") >= 1, r.text
    r = _post(compat_server, "/v1/completions", {**body, "stream": True}, stream=True)
    lines = [ln[6:] for ln in r.iter_lines() if ln.startswith(b"data: ")]  # SSE is UTF-8
    parts = [c["logprobs"] for ln in lines[:-1] for c in json.loads(ln)["choices"] if c["logprobs"]]
    streamed = {k: [v for p in parts for v in p[k]] for k in lp}
    _check_legacy_logprobs(streamed, 2)
    assert streamed["tokens"] == lp["tokens"]  # same seed, same tokens


def test_completion_refusals(compat_server: Server) -> None:
    # echo with logprobs scores the prompt (test_prompt_logprobs_http.py); its alternatives are bounded too
    body = {"model": MODEL, "prompt": "x", "logprobs": 21, "echo": True}
    r = _post(compat_server, "/v1/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    r = _post(compat_server, "/v1/completions", {"model": MODEL, "prompt": "x", "prompt_logprobs": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"
    r = _post(compat_server, "/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    r = _post(compat_server, "/v1/completions", {"model": MODEL, "prompt": ["a", "b"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = _post(compat_server, "/v1/completions", {"model": "other", "prompt": "x"})
    assert r.status_code == 404
