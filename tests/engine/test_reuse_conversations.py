"""Randomized multi-turn conversations rendered with the official qwen3_6 template.

Each model output is replayed as its exact token ids in the next turn's history (the rendered
text is split at a sentinel and the generated ids are spliced in). Outputs with prefix reuse on
must equal those with reuse off, token for token, and every later turn must reuse a prefix.
Two conversations run interleaved so the engine has to pick the right resident lane.
"""

from __future__ import annotations

import random
import re

from ninfer.engine.types import GenerationRequest, SamplingParams
from ninfer.frontend.capabilities import resolve_capabilities
from ninfer.frontend.conversation import Conversation, Message, TextPart, Tool, ToolCall, text_message
from ninfer.frontend.lower import render_chat
from ninfer.frontend.options import PromptOptions
from ninfer.templates import read_template
from tests.engine.tiny import make_engine

TEMPLATE = read_template("qwen3_6")
WEATHER = Tool(
    name="get_weather",
    description="Current weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
USER_TEXTS = ["Hi!", "What is 2+2?", "Tell me a joke.", "Why is the sky blue?", "Thanks, and then?", "Go on."]
CITIES = ["Paris", "Oslo", "Lima"]
STOP_IDS = frozenset({248046, 248044})


class Chat:
    """One conversation: messages with sentinel placeholders for generated token runs."""

    def __init__(self, rng: random.Random, idx: int) -> None:
        self.rng = rng
        self.idx = idx
        self.thinking = rng.random() < 0.5
        self.preserve = rng.random() < 0.5
        self.tools = rng.random() < 0.5
        self.greedy = rng.random() < 0.7
        self.turns = rng.randint(3, 6)
        self.gens: dict[str, list[int]] = {}
        msgs = [text_message("system", "You are terse.")] if rng.random() < 0.5 else []
        msgs.append(text_message("user", rng.choice(USER_TEXTS)))
        self.conv = Conversation(msgs, [WEATHER] if self.tools else [])
        self.options = PromptOptions(thinking=self.thinking, effort=None, preserve_thinking=self.preserve)

    def prompt(self, tokenizer) -> tuple[list[int], int | None, int | None]:
        """Token ids and the checkpoints the frontend places (see ninfer.frontend.encode)."""
        rendered = render_chat(self.conv, TEMPLATE, resolve_capabilities(TEMPLATE), self.options)
        ids = _encode_spliced(tokenizer, rendered.text, self.gens)
        if self.preserve:
            return ids, None, len(ids)
        head = _encode_spliced(tokenizer, rendered.text[: rendered.open_turn_opener_end], self.gens)
        assert ids[: len(head)] == head
        return ids, len(head), None

    def add_reply(self, generated: list[int]) -> None:
        if generated and generated[-1] in STOP_IDS:
            generated = generated[:-1]  # the template writes its own <|im_end|>
        key = f"\u27e6gen{self.idx}.{len(self.gens)}\u27e7"
        self.gens[key] = generated
        calls = []
        if self.tools and self.rng.random() < 0.5:
            calls = [
                ToolCall(
                    id=f"c{len(self.gens)}", name="get_weather", arguments={"city": self.rng.choice(CITIES)}
                )
            ]
        if self.thinking:
            msg = Message("assistant", [TextPart("" if calls else "Done.")], reasoning=key, tool_calls=calls)
        else:
            msg = Message("assistant", [TextPart(key)], tool_calls=calls)
        self.conv.messages.append(msg)
        if calls:
            self.conv.messages.append(Message("tool", [TextPart('{"temp": 21}')], tool_call_id=calls[0].id))
        else:
            self.conv.messages.append(text_message("user", self.rng.choice(USER_TEXTS)))


def _encode_spliced(tokenizer, text: str, gens: dict[str, list[int]]) -> list[int]:
    out: list[int] = []
    pos = 0
    if gens:
        for m in re.finditer("|".join(map(re.escape, gens)), text):
            out += tokenizer.encode(text[pos : m.start()]) + gens[m.group()]
            pos = m.end()
    return out + tokenizer.encode(text[pos:])


def test_reuse_is_exact_over_random_conversations(qwen_vocab_model, tokenizer) -> None:
    kw = {"max_concurrency": 2, "max_context": 1024, "kv_capacity": 2048, "prefill_chunk": 512}
    on = make_engine(qwen_vocab_model, **kw)
    off = make_engine(qwen_vocab_model, no_prefix_reuse=True, **kw)
    rng = random.Random(1234)
    paths: dict[str, int] = {}
    later_turns = 0
    try:
        chats = [Chat(rng, i) for i in range(50)]
        for a, b in zip(chats[0::2], chats[1::2], strict=True):
            for turn in range(max(a.turns, b.turns)):
                for chat in (a, b):
                    if turn >= chat.turns:
                        continue
                    ids, tc, rc = chat.prompt(tokenizer)
                    params = SamplingParams(
                        max_tokens=3, temperature=0.0 if chat.greedy else 1.0, top_k=20, seed=turn
                    )
                    req = GenerationRequest(f"c{chat.idx}t{turn}", tuple(ids), params, chat.thinking, tc, rc)
                    outs = []
                    for eng in (on, off):
                        with eng.submit(eng.reserve(), req) as h:
                            outs.append((h.result(60)[0], h.stats))
                    (got, st), (want, _) = outs
                    assert got == want, (chat.idx, turn, st.reuse_path)
                    paths[st.reuse_path] = paths.get(st.reuse_path, 0) + 1
                    if turn > 0:
                        later_turns += 1
                        assert st.cached_tokens > 0, (chat.idx, turn, chat.thinking, chat.preserve)
                    chat.add_reply(got)
    finally:
        on.shutdown(5)
        off.shutdown(5)
    assert later_turns >= 100
    for path in ("append_frontier", "restore_turn_checkpoint"):
        assert paths.get(path, 0) > 0, paths
