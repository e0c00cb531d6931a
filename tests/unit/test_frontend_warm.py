"""The frontend's warm-up before ready: the template compiled, the tokenizer and the output parser
run once, over the official templates with thinking on and off."""

from __future__ import annotations

import pytest
from conftest_text import ours

from ninfer.api.prompting import FrontendPrompts
from ninfer.frontend.options import ServerDefaults
from ninfer.frontend.render import compile_template
from ninfer.templates import read_template


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_6", "qwen3_8"])
@pytest.mark.parametrize("thinking", [True, False])
def test_warm_up_compiles_the_template_and_parses_a_call(name: str, thinking: bool) -> None:
    template = read_template(name)
    prompts = FrontendPrompts(template, ours(), ServerDefaults(thinking=thinking))
    compile_template.cache_clear()
    result = prompts.warm()
    assert compile_template.cache_info().currsize == 1  # what the first request would have compiled
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("lookup", {"q": "warm"})]
    assert result.content == "Looking it up."
    assert bool(result.reasoning) == thinking
