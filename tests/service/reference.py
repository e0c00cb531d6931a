"""Expected outputs computed without the service: transformers' chat-template rendering, the
`tokenizers` library over the artifact's tokenizer.json, and the offline `LLM`'s full-forward
greedy decode (no engine, no paged scheduler, no prefix reuse)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from transformers.utils.chat_template_utils import render_jinja_template

from ninfer.artifact import open_artifact
from ninfer.engine.types import SamplingParams
from ninfer.frontend.parser import ParseResult, parse_text
from ninfer.offline import LLM


@dataclass(frozen=True)
class Greedy:
    prompt_ids: tuple[int, ...]
    ids: tuple[int, ...]  # generated ids, a stop token included when one ended the output
    stopped: bool  # ended by an end-of-turn id (else by max_tokens)
    text: str  # the visible text: the decoded ids without the stop token

    def parse(self, thinking: bool) -> ParseResult:
        return parse_text(self.text, thinking=thinking)


class Reference:
    def __init__(self, artifact: Path) -> None:
        self.path = artifact
        art = open_artifact(artifact)
        self.template = art.chat_template
        self.tokenizer = Tokenizer.from_file(str(art.tokenizer_path))
        self.eos = set(art.config.eos_token_ids)

    @cached_property
    def llm(self) -> LLM:
        return LLM(self.path)

    def render(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        out, _ = render_jinja_template(
            conversations=[messages], chat_template=self.template, add_generation_prompt=True, **kwargs
        )
        return out[0]

    def prompt_ids(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
        return self.tokenizer.encode(self.render(messages, **kwargs), add_special_tokens=False).ids

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def greedy(self, messages: list[dict[str, Any]], max_tokens: int, **kwargs: Any) -> Greedy:
        prompt = self.prompt_ids(messages, **kwargs)
        out = self.llm.generate(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))[0]
        stopped = out.finish_reason == "stop"
        shown = out.token_ids[:-1] if stopped else out.token_ids
        return Greedy(tuple(prompt), tuple(out.token_ids), stopped, self.decode(shown))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
