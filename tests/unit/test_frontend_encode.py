"""Prompt encoding: token ids, checkpoint boundaries that later turns really share, media order."""

from __future__ import annotations

import pytest
from conftest_text import ours
from convgen import generate

from ninfer.frontend.capabilities import resolve_capabilities
from ninfer.frontend.conversation import Conversation, ImagePart, Message, TextPart, VideoPart, text_message
from ninfer.frontend.encode import count_tokens, encode_prompt
from ninfer.frontend.options import PromptOptions
from ninfer.templates import read_template

THINK = "<think>"


def next_turn(conv: Conversation, thinking: bool) -> Conversation:
    """The conversation a client sends after the model answered and the user asked again."""
    answer = Message("assistant", [TextPart("The answer.")], "Some reasoning." if thinking else "")
    return Conversation([*conv.messages, answer, text_message("user", "And then?")], conv.tools)


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_6", "qwen3_8"])
def test_turn_checkpoint_is_shared_by_the_next_turn(name: str) -> None:
    tok = ours()
    template = read_template(name)
    caps = resolve_capabilities(template)
    think_id = tok.encode(THINK)[0]
    for seed in range(40):
        case = generate(seed, name)
        opts = PromptOptions(case.thinking, case.effort, False)
        p = encode_prompt(case.conv, opts, template, tok, caps)
        assert p.token_ids == tok.encode(p.text)
        assert p.response_checkpoint is None
        tc = p.turn_checkpoint
        assert tc is not None and 0 < tc < len(p.token_ids)
        assert tok.decode(p.token_ids[:tc]).endswith("<|im_start|>assistant\n")
        assert p.token_ids[tc] == think_id
        later = encode_prompt(next_turn(case.conv, case.thinking), opts, template, tok, caps)
        assert later.token_ids[:tc] == p.token_ids[:tc], f"seed {seed}"
        if not any(THINK in m.text for m in case.conv.messages):  # (3.8 keeps inline think text)
            assert later.token_ids[tc] != p.token_ids[tc]  # the closed turn is recomputed from here
        assert count_tokens(case.conv, opts, template, tok, caps) == len(p.token_ids)


@pytest.mark.parametrize("name", ["qwen3_6", "qwen3_8"])
def test_response_checkpoint_is_the_prompt_frontier(name: str) -> None:
    tok = ours()
    template = read_template(name)
    caps = resolve_capabilities(template)
    for seed in range(40):
        case = generate(seed, name)
        opts = PromptOptions(case.thinking, case.effort, True)
        p = encode_prompt(case.conv, opts, template, tok, caps)
        assert p.turn_checkpoint is None and p.response_checkpoint == len(p.token_ids)
        prologue = "<think>\n" if case.thinking else "<think>\n\n</think>\n\n"
        assert p.text.endswith("<|im_start|>assistant\n" + prologue)
        later = encode_prompt(next_turn(case.conv, case.thinking), opts, template, tok, caps)
        assert later.token_ids[: len(p.token_ids)] == p.token_ids, f"seed {seed}"


def test_media_in_prompt_order_with_one_pad_each() -> None:
    tok = ours()
    template = read_template("qwen3_6")
    img1, vid, img2 = (
        ImagePart("https://a/1.png"),
        VideoPart("https://a/v.mp4"),
        ImagePart("data:image/png;base64,AA"),
    )
    conv = Conversation(
        [
            Message("user", [img1, TextPart("What is this?"), vid]),
            text_message("assistant", "A cat."),
            Message("user", [TextPart("And this?"), img2]),
        ]
    )
    p = encode_prompt(conv, PromptOptions(True, None, False), template, tok)
    assert p.media == [img1, vid, img2]
    pads = [
        i for i in p.token_ids if i in (tok.token_to_id("<|image_pad|>"), tok.token_to_id("<|video_pad|>"))
    ]
    assert pads == [
        tok.token_to_id("<|image_pad|>"),
        tok.token_to_id("<|video_pad|>"),
        tok.token_to_id("<|image_pad|>"),
    ]
