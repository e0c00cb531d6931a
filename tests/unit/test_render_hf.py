"""Rendering equals transformers' own chat-template code path byte for byte."""

from __future__ import annotations

import pytest
from convgen import generate, to_openai, tools_openai
from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

from ninfer.frontend.capabilities import resolve_capabilities
from ninfer.frontend.conversation import Conversation, Message, TextPart
from ninfer.frontend.lower import render_chat
from ninfer.frontend.options import PromptOptions
from ninfer.frontend.render import TemplateError
from ninfer.templates import NAMES, read_template

CASES_PER_TEMPLATE = 320


def reference(template: str, conv: Conversation, gen: bool = True, **kwargs: object) -> str:
    """transformers 5.24 `apply_chat_template(tokenize=False)` minus the tokenizer object."""
    messages = _normalize_chat_messages([to_openai(m) for m in conv.messages])
    out, _ = render_jinja_template(
        conversations=[messages],
        tools=tools_openai(conv),
        chat_template=template,
        add_generation_prompt=gen,
        **kwargs,
    )
    return out[0]


def ref_kwargs(thinking: bool, preserve: bool, effort: str | None) -> dict[str, object]:
    kwargs: dict[str, object] = {"enable_thinking": thinking, "preserve_thinking": preserve}
    if effort is not None:
        kwargs["reasoning_effort"] = effort
    return kwargs


@pytest.mark.parametrize("name", NAMES)
def test_generated_conversations_match_transformers(name: str) -> None:
    template = read_template(name)
    caps = resolve_capabilities(template)
    assert caps.name == name
    seen = {"tools": 0, "media": 0, "reasoning": 0, "no_think": 0, "preserve": 0, "dev": 0}
    for seed in range(CASES_PER_TEMPLATE):
        case = generate(seed, name)
        opts = PromptOptions(case.thinking, case.effort, case.preserve and caps.preserve_thinking)
        ours = render_chat(case.conv, template, caps, opts).text
        expected = reference(
            template, case.conv, **ref_kwargs(case.thinking, opts.preserve_thinking, case.effort)
        )
        assert ours == expected, f"seed {seed}"
        msgs = case.conv.messages
        seen["tools"] += any(m.tool_calls for m in msgs)
        seen["media"] += any(m.has_media for m in msgs)
        seen["reasoning"] += any(m.reasoning for m in msgs)
        seen["no_think"] += not case.thinking
        seen["preserve"] += opts.preserve_thinking
        seen["dev"] += msgs[0].role == "developer"
    assert all(v >= 10 for k, v in seen.items() if k != "preserve" or caps.preserve_thinking), seen


def test_each_effort_matches_transformers() -> None:
    template = read_template("qwen3_8")
    caps = resolve_capabilities(template)
    for seed in range(30):
        conv = generate(seed, "qwen3_8").conv
        for effort in ("low", "medium", "xhigh"):
            for preserve in (False, True):
                ours = render_chat(conv, template, caps, PromptOptions(True, effort, preserve)).text
                assert ours == reference(template, conv, **ref_kwargs(True, preserve, effort))
        ours = render_chat(conv, template, caps, PromptOptions(False, None, False)).text
        assert ours == reference(template, conv, **ref_kwargs(False, False, None))


def test_template_errors_carry_the_template_message() -> None:
    template = read_template("qwen3_6")
    caps = resolve_capabilities(template)
    conv = Conversation([Message("tool", [TextPart("r")], tool_call_id="c")])
    with pytest.raises(TemplateError, match=r"^No user query found in messages\.$"):
        render_chat(conv, template, caps, PromptOptions(True, None, False))
    with pytest.raises(Exception, match=r"No user query found"):
        reference(template, conv)


def test_unrecognised_template_is_rendered_and_probed() -> None:
    template = read_template("qwen3_6") + "\n"  # one byte off: not an official template
    caps = resolve_capabilities(template)
    assert caps.name is None and caps.thinking_switch and caps.preserve_thinking and caps.chatml
    assert caps.thinking_default and caps.efforts == ()
    case = generate(7, "qwen3_6")
    ours = render_chat(case.conv, template, caps, PromptOptions(True, None, True)).text
    assert ours == reference(template, case.conv, enable_thinking=True, preserve_thinking=True)


def test_tojson_and_environment_features() -> None:
    template = (
        "{{ messages[0].content | tojson }}|{{ {'a': [1, 'é']} | tojson(indent=2) }}|"
        "{{ {'b': 1, 'a': 2} | tojson(separators=(',', ':'), sort_keys=true) }}|"
        "{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}|"
        "{{ strftime_now('%Y') | length }}|{% set ns = namespace(x=1) %}{{ ns.x }}|{{ dict(a=1) }}"
    )
    conv = Conversation([Message("user", [TextPart('日本 <b> "q"')])])
    caps = resolve_capabilities(template)
    assert not caps.chatml
    ours = render_chat(conv, template, caps, PromptOptions(True, None, False), add_generation_prompt=False)
    assert ours.text == reference(template, conv, gen=False)
    with pytest.raises(TemplateError, match="custom failure"):
        render_chat(
            conv,
            "{{ raise_exception('custom failure') }}",
            resolve_capabilities("{{ raise_exception('custom failure') }}"),
            PromptOptions(True, None, False),
        )
