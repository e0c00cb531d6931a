"""Prompt logprobs over HTTP (the package's `compat_server`, terse model): legacy completions'
echo + logprobs with a token-id prompt and max_tokens 0, streamed and not, equal the artifact's
model by a plain forward; Chat's `prompt_logprobs` extension scores the rendered prompt; a
max_tokens 0 request that scores nothing is a 400."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests
import torch

from tests.service.conftest import MODEL, Server

PROMPT = [48, 25, 3437, 369, 220, 17, 478, 220, 17, 30, 198, 32, 25]  # "Q: What is 2 + 2?\nA:"


def _post(server: Server, path: str, body: dict[str, Any], stream: bool = False) -> requests.Response:
    return requests.post(
        f"{server.url}{path}", json=body, headers=server.headers(), timeout=120, stream=stream
    )


def _sse(r: requests.Response) -> list[dict[str, Any]]:
    lines = [ln for ln in r.iter_lines(decode_unicode=True) if ln.startswith("data: ")]
    return [json.loads(ln[6:]) for ln in lines if ln != "data: [DONE]"]


@pytest.fixture(scope="module")
def reference(demo_cache: Path) -> torch.Tensor:
    """[n, V] log-softmax of the terse model's logits over PROMPT (padded ids excluded)."""
    from ninfer.offline import LLM
    from tests.service.terse_artifact import ensure_terse_artifact

    llm = LLM(ensure_terse_artifact(demo_cache))
    assert llm.tokenizer is not None
    logits = llm.logits(PROMPT)[:, : llm.tokenizer.vocab_size]
    return torch.log_softmax(logits, dim=-1)


def test_echo_logprobs_of_a_token_prompt(compat_server: Server, reference: torch.Tensor) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "echo": True, "logprobs": 2, "max_tokens": 0}
    r = _post(compat_server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    out = r.json()
    choice = out["choices"][0]
    assert choice["finish_reason"] == "length" and choice["text"] == "Q: What is 2 + 2?\nA:"
    assert out["usage"] == {"prompt_tokens": len(PROMPT), "completion_tokens": 0, "total_tokens": len(PROMPT)}
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(PROMPT))]
    for i in range(1, len(PROMPT)):
        assert lp["token_logprobs"][i] == pytest.approx(float(reference[i - 1, PROMPT[i]]), abs=2e-4)
        top = torch.topk(reference[i - 1], 2).values.tolist()
        assert sorted(lp["top_logprobs"][i].values(), reverse=True) == pytest.approx(top, abs=2e-4)
    streamed = _sse(_post(compat_server, "/v1/completions", {**body, "stream": True}, stream=True))
    parts = [c["choices"][0]["logprobs"] for c in streamed if c["choices"] and c["choices"][0]["logprobs"]]
    assert len(parts) == 1 and parts[0] == lp
    assert "".join(c["choices"][0]["text"] for c in streamed if c["choices"]) == choice["text"]


def test_echo_with_a_generated_token(compat_server: Server, reference: torch.Tensor) -> None:
    # lm-eval's loglikelihood request: max_tokens 1, the prompt's entries then the generated token's
    body = {
        "model": MODEL,
        "prompt": [PROMPT],
        "echo": True,
        "logprobs": 1,
        "max_tokens": 1,
        "temperature": 0,
    }
    r = _post(compat_server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(PROMPT) + 1
    assert lp["token_logprobs"][1] == pytest.approx(float(reference[0, PROMPT[1]]), abs=2e-4)


def test_prompt_logprobs_extension(compat_server: Server) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0}
    r = _post(compat_server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["logprobs"] is None
    scored = choice["prompt_logprobs"]
    assert len(scored) == len(PROMPT) and scored[0] is None
    assert all(e["top_logprobs"] == [] and isinstance(e["logprob"], float) for e in scored[1:])
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    chat |= {"prompt_logprobs": 1, "enable_thinking": False}
    r = _post(compat_server, "/v1/chat/completions", chat)
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out["prompt_logprobs"]) == out["usage"]["prompt_tokens"] and out["prompt_logprobs"][0] is None
    assert all(len(e["top_logprobs"]) == 1 for e in out["prompt_logprobs"][1:])
    streamed = _sse(_post(compat_server, "/v1/chat/completions", {**chat, "stream": True}, stream=True))
    assert streamed[0]["prompt_logprobs"] == out["prompt_logprobs"]  # the same prompt, the same values


def test_max_tokens_zero_needs_scoring(compat_server: Server) -> None:
    r = _post(compat_server, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
