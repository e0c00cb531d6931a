"""The Responses wire object: the request echo, status, output Items, usage and error."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ninfer.api.events import Usage

TERMINAL = ("completed", "incomplete", "failed", "cancelled")


def usage_body(usage: Usage) -> dict[str, Any]:
    """Checkpoint-native usage: the full prepared prompt, the reused prefix, accepted output ids."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


@dataclass
class Envelope:
    """Everything of a Response that the request fixes; `body` adds the evolving parts."""

    id: str
    model: str
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})
    reasoning_effort: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    store: bool = True
    top_logprobs: int = 0
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(
        self,
        status: str,
        output: list[dict[str, Any]] | None = None,
        usage: Usage | None = None,
        error: dict[str, Any] | None = None,
        incomplete_reason: str | None = None,
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "metadata": dict(self.metadata),
            "model": self.model,
            "output": list(output or []),
            "parallel_tool_calls": self.parallel_tool_calls,
            "previous_response_id": self.previous_response_id,
            "reasoning": {"effort": self.reasoning_effort, "summary": None},
            "service_tier": "default",
            "store": self.store,
            "temperature": self.temperature,
            "text": {"format": dict(self.text_format)},
            "tool_choice": dict(self.tool_choice) if isinstance(self.tool_choice, dict) else self.tool_choice,
            "tools": [dict(t) for t in self.tools],
            "top_logprobs": self.top_logprobs,
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": usage_body(usage) if usage is not None else None,
        }


def failure(message: str) -> dict[str, Any]:
    """`Response.error` for a generation failure after the stream started.

    The SDK types `error.code` as a closed set of OpenAI codes; a server-side failure is
    `server_error`, and the message carries the specific cause.
    """
    return {"code": "server_error", "message": message}
