"""One request through any of the three protocols, whole or streamed, read back into one
`Answer` (answer text, reasoning, tool calls with decoded arguments, how it ended).

Streams are rebuilt from their deltas only (text deltas, argument fragments), so a test that
checks an `Answer` checks what a streaming client would assemble.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import requests
from conftest import MODEL, Server

PROTOCOLS = ("chat", "responses", "messages")
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


@dataclass
class Answer:
    text: str = ""
    reasoning: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    finish: str = ""  # the protocol's own word: stop / tool_calls / length, completed, end_turn ...


def _thinking(protocol: str, on: bool) -> dict[str, Any]:
    if protocol == "chat":
        return {"enable_thinking": on}
    if protocol == "responses":
        return {} if on else {"reasoning": {"effort": "none"}}
    return {"thinking": {"type": "enabled", "budget_tokens": 1024} if on else {"type": "disabled"}}


def body(
    protocol: str, prompt: str, max_tokens: int, thinking: bool, stream: bool, **extra: Any
) -> dict[str, Any]:
    """A minimal request body of `protocol` (`extra` merged last)."""
    out: dict[str, Any] = {"model": MODEL, "stream": stream, **_thinking(protocol, thinking)}
    if protocol == "responses":
        out.update(input=prompt, max_output_tokens=max_tokens, store=False)
    else:
        out.update(messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens)
    return {**out, **extra}


def post(server: Server, protocol: str, payload: dict[str, Any]) -> requests.Response:
    return requests.post(
        f"{server.url}{PATHS[protocol]}", json=payload, headers=server.headers(), timeout=300
    )


def _events(r: requests.Response) -> list[dict[str, Any]]:
    lines = r.content.decode("utf-8").splitlines()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


def _chat(r: requests.Response, stream: bool) -> Answer:
    if not stream:
        choice = r.json()["choices"][0]
        msg = choice["message"]
        calls = [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in msg.get("tool_calls") or []
        ]
        return Answer(
            msg.get("content") or "", msg.get("reasoning_content") or "", calls, choice["finish_reason"]
        )
    out, names, args = Answer(), {}, {}
    for event in _events(r):
        for choice in event.get("choices", []):
            delta = choice["delta"]
            out.text += delta.get("content") or ""
            out.reasoning += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                fn = call.get("function") or {}
                if fn.get("name"):
                    names[call["index"]] = fn["name"]
                args[call["index"]] = args.get(call["index"], "") + (fn.get("arguments") or "")
            out.finish = choice.get("finish_reason") or out.finish
    out.calls = [(names[i], json.loads(args[i])) for i in sorted(names)]
    return out


def _responses_output(output: list[dict[str, Any]], status: str) -> Answer:
    out = Answer(finish=status)
    for item in output:
        if item["type"] == "message":
            out.text += "".join(p["text"] for p in item["content"] if p["type"] == "output_text")
        elif item["type"] == "reasoning":
            out.reasoning += "".join(p["text"] for p in item.get("content") or [])
        elif item["type"] == "function_call":
            out.calls.append((item["name"], json.loads(item["arguments"])))
    return out


def _responses(r: requests.Response, stream: bool) -> Answer:
    if not stream:
        data = r.json()
        return _responses_output(data["output"], data["status"])
    out, names, args = Answer(), {}, {}
    for event in _events(r):
        kind = event["type"]
        if kind == "response.output_text.delta":
            out.text += event["delta"]
        elif kind == "response.reasoning_text.delta":
            out.reasoning += event["delta"]
        elif kind == "response.output_item.added" and event["item"]["type"] == "function_call":
            names[event["output_index"]] = event["item"]["name"]
        elif kind == "response.function_call_arguments.delta":
            args[event["output_index"]] = args.get(event["output_index"], "") + event["delta"]
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            final = event["response"]
            out.finish = final["status"]
            assert _responses_output(final["output"], final["status"]).text == out.text
    out.calls = [(names[i], json.loads(args.get(i) or "{}")) for i in sorted(names)]
    return out


def _messages(r: requests.Response, stream: bool) -> Answer:
    if not stream:
        data = r.json()
        out = Answer(finish=data["stop_reason"])
        for block in data["content"]:
            if block["type"] == "text":
                out.text += block["text"]
            elif block["type"] == "thinking":
                out.reasoning += block["thinking"]
            elif block["type"] == "tool_use":
                out.calls.append((block["name"], block["input"]))
        return out
    out, names, args = Answer(), {}, {}
    for event in _events(r):
        kind = event["type"]
        if kind == "content_block_start" and event["content_block"]["type"] == "tool_use":
            names[event["index"]] = event["content_block"]["name"]
        elif kind == "content_block_delta":
            delta = event["delta"]
            if delta["type"] == "text_delta":
                out.text += delta["text"]
            elif delta["type"] == "thinking_delta":
                out.reasoning += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                args[event["index"]] = args.get(event["index"], "") + delta["partial_json"]
        elif kind == "message_delta":
            out.finish = event["delta"].get("stop_reason") or out.finish
    out.calls = [(names[i], json.loads(args.get(i) or "{}")) for i in sorted(names)]
    return out


def ask(server: Server, protocol: str, payload: dict[str, Any]) -> Answer:
    """POST `payload` (built by `body`) and read the answer back; a non-200 fails with its body."""
    r = post(server, protocol, payload)
    assert r.status_code == 200, r.text
    reader = {"chat": _chat, "responses": _responses, "messages": _messages}[protocol]
    return reader(r, bool(payload.get("stream")))
