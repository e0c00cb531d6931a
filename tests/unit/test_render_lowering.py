"""Qwen lowering of developer and later system messages, against hand-written prompts."""

from __future__ import annotations

import random

import pytest
from convgen import generate
from test_render_hf import ref_kwargs, reference

from ninfer.frontend.capabilities import resolve_capabilities
from ninfer.frontend.conversation import Conversation, ImagePart, Message, TextPart, ToolCall, text_message
from ninfer.frontend.lower import render_chat
from ninfer.frontend.options import PromptOptions
from ninfer.frontend.render import TemplateError
from ninfer.templates import read_template

LOW = (
    "Reasoning effort is set to low. Keep your thinking brief and focused, moving directly to the "
    "conclusion without unnecessary elaboration."
)
XHIGH = (
    "Reasoning effort is set to xhigh. Please think carefully through the task, validate key "
    "assumptions, consider plausible alternatives, and prioritize correctness, consistency, and "
    "clarity in the final answer."
)


def render(name: str, messages: list[Message], thinking: bool = True, effort: str | None = None,
           preserve: bool = False) -> str:  # fmt: skip
    template = read_template(name)
    opts = PromptOptions(thinking, effort, preserve)
    return render_chat(Conversation(messages), template, resolve_capabilities(template), opts).text


def test_leading_developer_is_the_template_system_message() -> None:
    got = render("qwen3_6", [text_message("developer", "Be brief."), text_message("user", "Hi")])
    assert got == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


@pytest.mark.parametrize("preserve", [False, True])
def test_mid_system_before_last_query_keeps_history_rules(preserve: bool) -> None:
    msgs = [
        text_message("user", "Q1"),
        Message("assistant", [TextPart("A1")], reasoning="R1"),
        text_message("system", "Mid"),
        text_message("user", "Q2"),
    ]
    a1 = "<think>\nR1\n</think>\n\nA1" if preserve else "A1"
    assert render("qwen3_6", msgs, preserve=preserve) == (
        "<|im_start|>user\nQ1<|im_end|>\n"
        f"<|im_start|>assistant\n{a1}<|im_end|>\n"
        "<|im_start|>system\nMid<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


def test_system_after_tool_result_in_open_turn() -> None:
    msgs = [
        text_message("user", "Q"),
        Message("assistant", [], "r", [ToolCall("c1", "get_weather", {"city": "Paris", "days": 2})]),
        Message("tool", [TextPart("sunny")], tool_call_id="c1"),
        text_message("developer", "Use metric."),
    ]
    assert render("qwen3_6", msgs, thinking=False) == (
        "<|im_start|>user\nQ<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nr\n</think>\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>system\nUse metric.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_system_between_tool_results_splits_the_merged_turn() -> None:
    msgs = [
        text_message("user", "Q"),
        Message("assistant", [], None, [ToolCall("a", "f", {}), ToolCall("b", "g", {})]),
        Message("tool", [TextPart("r1")], tool_call_id="a"),
        text_message("system", "S"),
        Message("tool", [TextPart("r2")], tool_call_id="b"),
    ]
    assert render("qwen3_6", msgs) == (
        "<|im_start|>user\nQ<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        "<tool_call>\n<function=f>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=g>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nr1\n</tool_response><|im_end|>\n"
        "<|im_start|>system\nS<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nr2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


def test_effort_instruction_composes_with_leading_developer_only() -> None:
    msgs = [text_message("developer", "Lead"), text_message("user", "Q"), text_message("developer", "Later")]
    tail = (
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>system\nLater<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert render("qwen3_8", msgs, effort="low") == f"<|im_start|>system\n{LOW}\n\nLead<|im_end|>\n" + tail
    assert render("qwen3_8", msgs, effort="medium") == "<|im_start|>system\nLead<|im_end|>\n" + tail


def test_effort_block_without_leading_system_and_mid_system() -> None:
    msgs = [
        text_message("user", "Q1"),
        Message("assistant", [TextPart("A1")]),
        text_message("system", "S"),
        text_message("user", "Q2"),
    ]
    assert render("qwen3_8", msgs, effort="xhigh") == (
        f"<|im_start|>system\n{XHIGH}<|im_end|>\n"
        "<|im_start|>user\nQ1<|im_end|>\n"
        "<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>system\nS<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


def test_consecutive_leading_instructions_stay_separate() -> None:
    msgs = [text_message("system", " A "), text_message("developer", "B\n"), text_message("user", "Q")]
    assert render("qwen3_5", msgs) == (
        "<|im_start|>system\nA<|im_end|>\n"
        "<|im_start|>system\nB<|im_end|>\n"
        "<|im_start|>user\nQ<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


def test_media_in_later_system_message_is_rejected() -> None:
    msgs = [text_message("user", "Q"), Message("system", [ImagePart("https://x/y.png")])]
    with pytest.raises(TemplateError, match=r"System message cannot contain images\."):
        render("qwen3_6", msgs)


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_6", "qwen3_8"])
def test_inserted_system_message_leaves_the_rest_byte_identical(name: str) -> None:
    """Removing the inserted block gives back exactly what transformers renders without it."""
    template = read_template(name)
    caps = resolve_capabilities(template)
    block = "<|im_start|>system\nMIDSYS<|im_end|>\n"
    rng = random.Random(1234)
    for seed in range(60):
        case = generate(seed, name)
        msgs = case.conv.messages
        preserve = case.preserve and caps.preserve_thinking
        expected = reference(template, case.conv, **ref_kwargs(case.thinking, preserve, case.effort))
        at = rng.randint(1, len(msgs))
        lowered = Conversation([*msgs[:at], text_message("system", "MIDSYS"), *msgs[at:]], case.conv.tools)
        got = render_chat(lowered, template, caps, PromptOptions(case.thinking, case.effort, preserve)).text
        split = 0 < at < len(msgs) and msgs[at - 1].role == "tool" and msgs[at].role == "tool"
        if split:
            assert got.replace("<|im_end|>\n" + block + "<|im_start|>user", "", 1) == expected
        else:
            i = got.index(block)
            assert got[:i] + got[i + len(block) :] == expected
            assert i == 0 or got[:i].endswith("<|im_end|>\n")
            if at == len(msgs):  # an appended instruction is a pure suffix of the history
                history = reference(
                    template, case.conv, gen=False, **ref_kwargs(case.thinking, preserve, case.effort)
                )
                assert got.startswith(history + block)
