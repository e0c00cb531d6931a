"""Streaming HTTP clients for the serving benchmark: one request per call, timed from the client.

Each call opens its own connection (as separate users do), sends a streaming Chat Completions or
Responses request and reads the SSE stream: the time to the first content event is the TTFT, the
gaps between content events are inter-token latencies, and the token count is the server's usage.
"""

from __future__ import annotations

import http.client
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

WORDS = (
    "river stone quiet lamp orbit cedar velvet signal harbor ember meadow copper lantern shadow "
    "violet prairie falcon glacier thunder willow compass marble saddle beacon tundra mosaic "
    "canyon whisper nectar pebble summit fjord ribbon cobalt"
).split()


@dataclass
class Result:
    """One request as its client saw it."""

    status: int
    ttft_s: float | None = None
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    text: str = ""
    response_id: str | None = None


def prompt_text(words: int, seed: int) -> str:
    """`words` random words (about 1.3 tokens each with the Qwen vocabulary), distinct per seed."""
    rng = random.Random(seed)
    return f"Request {seed}: " + " ".join(rng.choice(WORDS) for _ in range(words))


def _open(base: str, timeout: float) -> http.client.HTTPConnection:
    host, _, port = base.removeprefix("http://").partition(":")
    return http.client.HTTPConnection(host, int(port or 80), timeout=timeout)


def _json_call(base: str, method: str, path: str, body: Any, timeout: float) -> tuple[int, Any]:
    conn = _open(base, timeout)
    try:
        if body is None:
            conn.request(method, path)
        else:
            conn.request(method, path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, None
    finally:
        conn.close()


def get_json(base: str, path: str, timeout: float = 10.0) -> tuple[int, Any]:
    return _json_call(base, "GET", path, None, timeout)


def post_json(base: str, path: str, body: dict[str, Any], timeout: float = 30.0) -> tuple[int, Any]:
    return _json_call(base, "POST", path, body, timeout)


def _events(resp: http.client.HTTPResponse):
    """(event dict) per SSE `data:` line until [DONE] or the end of the stream."""
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield json.loads(data)


def stream(
    base: str, protocol: str, body: dict[str, Any], timeout: float = 600.0, request_id: str | None = None
) -> Result:
    """Send one streaming request (`protocol`: "chat" or "responses") and time it; `request_id` goes
    out as `x-request-id` (the request log's `client_request_id`)."""
    path = "/v1/chat/completions" if protocol == "chat" else "/v1/responses"
    payload = dict(body, stream=True)
    if protocol == "chat":
        payload["stream_options"] = {"include_usage": True}
    t0 = time.perf_counter()
    conn = _open(base, timeout)
    res = Result(status=0)
    try:
        headers = {"Content-Type": "application/json"}
        if request_id is not None:
            headers["x-request-id"] = request_id
        conn.request("POST", path, json.dumps(payload), headers)
        resp = conn.getresponse()
        res.status = resp.status
        if resp.status != 200:
            res.error = resp.read().decode("utf-8", "replace")[:300]
            return res
        last = None
        parts: list[str] = []
        for ev in _events(resp):
            piece, usage = _piece(protocol, ev)
            if piece:
                now = time.perf_counter()
                if last is None:
                    res.ttft_s = now - t0
                else:
                    res.itl_s.append(now - last)
                last = now
                parts.append(piece)
            if usage is not None:
                _usage(protocol, usage, res)
            if protocol == "responses" and isinstance(
                ev.get("response"), dict
            ):  # created .. completed / incomplete
                res.response_id = ev["response"].get("id")
        res.text = "".join(parts)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
        res.status = res.status or 599
    finally:
        conn.close()
        res.e2e_s = time.perf_counter() - t0
    return res


def _piece(protocol: str, ev: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """The visible text (reasoning included) an event carries, and its usage block if any."""
    if protocol == "chat":
        text = ""
        for ch in ev.get("choices") or ():
            delta = ch.get("delta") or {}
            text += (delta.get("reasoning_content") or "") + (delta.get("content") or "")
        return text, ev.get("usage")
    kind = ev.get("type", "")
    if kind in ("response.output_text.delta", "response.reasoning_text.delta"):
        return ev.get("delta") or "", None
    if kind in ("response.completed", "response.incomplete"):
        return "", ev["response"].get("usage")
    return "", None


def _usage(protocol: str, usage: dict[str, Any], res: Result) -> None:
    if protocol == "chat":
        res.completion_tokens = usage.get("completion_tokens", 0)
        res.prompt_tokens = usage.get("prompt_tokens", 0)
        res.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    else:
        res.completion_tokens = usage.get("output_tokens", 0)
        res.prompt_tokens = usage.get("input_tokens", 0)
        res.cached_tokens = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    """p50 / p90 / p99 (nearest rank) of `values` times `scale` (seconds -> ms by default)."""
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    s = sorted(values)

    def rank(q: float) -> float:
        return round(s[min(len(s) - 1, max(0, int(q * len(s) + 0.999999) - 1))] * scale, 3)

    return {"p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99)}


def summarize(results: list[Result], wall_s: float) -> dict[str, Any]:
    """Output tok/s over the wall time, TTFT / ITL / end-to-end percentiles, errors by status."""
    ok = [r for r in results if r.status == 200 and r.error is None]
    errors: dict[str, int] = {}
    for r in results:
        if r not in ok:
            errors[str(r.status)] = errors.get(str(r.status), 0) + 1
    tokens = sum(r.completion_tokens for r in ok)
    return {
        "requests": len(results),
        "output_tokens": tokens,
        "wall_s": round(wall_s, 3),
        "output_tok_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "ttft_ms": percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
        "itl_ms": percentiles([x for r in ok for x in r.itl_s]),
        "e2e_ms": percentiles([r.e2e_s for r in ok]),
        "errors": sum(errors.values()),
        "errors_by_status": errors,
        "first_error": next((r.error for r in results if r.error), None),
    }
