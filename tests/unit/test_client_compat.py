"""--client-compat at the protocol parsers: strict 400s name the flag; the mode records each adjustment."""

from __future__ import annotations

import pytest

from ninfer.api.chat import request as chat_request
from ninfer.api.compat import Compat, nearest_effort
from ninfer.api.context import ApiContext
from ninfer.api.errors import ApiError
from ninfer.api.messages.request import parse
from ninfer.api.responses.schema import parse_create

CLAUDE = {
    "model": "m",
    "max_tokens": 32000,
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "x"}}]}
    ],
    "metadata": {"user_id": "u"},
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "tools": [
        {"name": "Read", "input_schema": {"type": "object"}},
        {"type": "web_search_20250305", "name": "ws"},
    ],
}
CODEX = {
    "model": "m",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "s"}],
            "encrypted_content": "gAAA",
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    ],
    "prompt_cache_key": "k",
    "client_metadata": {"a": "b"},
    "include": ["reasoning.encrypted_content"],
    "reasoning": {"summary": "auto"},
    "store": False,
    "tools": [
        {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True},
        {"type": "namespace", "name": "ns", "tools": []},
        {"type": "web_search"},
    ],
}

# What openai-agents' OpenAIChatCompletionsModel sends for a `function_tool` (strict schema), with
# the OpenAI-side fields other SDKs add.
AGENTS_CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "tools": [
        {
            "type": "function",
            "function": {"name": "f", "description": "", "parameters": {"type": "object"}, "strict": True},
        }
    ],
    "parallel_tool_calls": False,
    "store": True,
    "metadata": {"a": "b"},
    "prompt_cache_key": "k",
    "safety_identifier": None,
}


def test_strict_mode_keeps_the_400_and_names_the_flag() -> None:
    with pytest.raises(ApiError) as exc:
        parse(dict(CLAUDE), ApiContext())
    assert exc.value.status == 400 and exc.value.param == "context_management"
    assert "--client-compat" in exc.value.message
    with pytest.raises(ApiError) as exc:
        parse_create(dict(CODEX), vision=False)
    assert exc.value.status == 400 and exc.value.param == "prompt_cache_key"
    assert "--client-compat" in exc.value.message
    for drop, param in (((), "store"), (("store", "metadata"), "prompt_cache_key")):
        body = {k: v for k, v in AGENTS_CHAT.items() if k not in drop}
        with pytest.raises(ApiError) as exc:
            chat_request.parse(body, ApiContext())
        assert exc.value.status == 400 and exc.value.param == param
        assert "--client-compat" in exc.value.message
    # strict tools and parallel_tool_calls=false are enforced (a grammar), not compat fields
    body = {k: v for k, v in AGENTS_CHAT.items() if k not in ("store", "metadata", "prompt_cache_key")}
    job = chat_request.parse(body, ApiContext()).job
    assert job.constraint is not None and job.compat == [] and job.constraint_fallback is None


def test_compat_mode_records_every_adjustment() -> None:
    job = parse(dict(CLAUDE), ApiContext(client_compat=True)).job
    assert {a["param"] for a in job.compat} >= {
        "context_management", "cache_control", "metadata.user_id", "thinking.type", "thinking.display", "tools[1]"
    }  # fmt: skip
    assert [t.name for t in job.conversation.tools] == ["Read"]
    request = parse_create(dict(CODEX), vision=False, compat=Compat(True))
    params = {a["param"]: a["action"] for a in request.compat.adjustments}
    assert params["tools[1]"] == params["tools[2]"] == "dropped_tool"
    assert params["reasoning.summary"] == "mapped"
    assert "tools[0].strict" not in params and request.tools[0].strict  # strict tools are enforced
    for key in (
        "prompt_cache_key",
        "client_metadata",
        "include",
        "input[1].summary",
        "input[1].encrypted_content",
    ):
        assert params[key] == "ignored"
    assert [t.name for t in request.tools] == ["f"]


def test_chat_compat_records_every_adjustment() -> None:
    job = chat_request.parse(dict(AGENTS_CHAT), ApiContext(client_compat=True)).job
    params = {a["param"]: a["action"] for a in job.compat}
    assert params == {
        "store": "ignored",
        "metadata": "ignored",
        "prompt_cache_key": "ignored",  # safety_identifier is null: absent, not recorded
    }
    assert [t.name for t in job.conversation.tools] == ["f"]
    # the strict tool is a constraint; an engine that cannot constrain may drop it (recorded there)
    assert job.constraint is not None and job.constraint_fallback is not None
    with pytest.raises(ApiError) as exc:
        chat_request.parse({**AGENTS_CHAT, "surprise": 1}, ApiContext(client_compat=True))
    assert exc.value.param == "surprise"


def test_other_unknown_fields_still_fail_in_compat_mode() -> None:
    body = {**CLAUDE, "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}
    with pytest.raises(ApiError):
        parse(body, ApiContext(client_compat=True))
    body = {k: v for k, v in CLAUDE.items() if k != "context_management"}
    with pytest.raises(ApiError) as exc:
        parse({**body, "surprise": 1}, ApiContext(client_compat=True))
    assert exc.value.param == "surprise"


def test_nearest_effort() -> None:
    exposed = ("low", "medium", "xhigh")
    assert nearest_effort("high", exposed) == "xhigh"
    assert nearest_effort("max", exposed) == "xhigh"
    assert nearest_effort("minimal", exposed) == "low"
    assert nearest_effort("high", ()) is None
