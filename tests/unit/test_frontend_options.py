"""Request-option resolution: defaults, every error code, and template capabilities."""

from __future__ import annotations

import pytest

from ninfer.frontend.capabilities import resolve_capabilities
from ninfer.frontend.options import (
    FrontendError,
    PromptOptions,
    RequestOptions,
    ServerDefaults,
    resolve_options,
)
from ninfer.templates import read_template

Q35 = resolve_capabilities(read_template("qwen3_5"))
Q36 = resolve_capabilities(read_template("qwen3_6"))
Q38 = resolve_capabilities(read_template("qwen3_8"))


def error(req: RequestOptions, caps=Q38, defaults: ServerDefaults = ServerDefaults()) -> FrontendError:
    with pytest.raises(FrontendError) as info:
        resolve_options(req, caps, defaults)
    return info.value


def test_capabilities_of_official_templates() -> None:
    assert (Q35.name, Q36.name, Q38.name) == ("qwen3_5", "qwen3_6", "qwen3_8")
    assert Q38.efforts == ("low", "medium", "xhigh") and Q38.default_effort == "xhigh"
    assert Q35.efforts == () and Q36.efforts == () and Q35.default_effort is None
    assert not Q35.preserve_thinking and Q36.preserve_thinking and Q38.preserve_thinking
    assert Q35.thinking_switch and Q36.thinking_switch and Q38.thinking_switch


def test_defaults() -> None:
    assert resolve_options(RequestOptions(), Q38) == PromptOptions(True, "xhigh", False)
    assert resolve_options(RequestOptions(), Q36) == PromptOptions(True, None, False)
    no_think = ServerDefaults(thinking=False, preserve_thinking=True)
    assert resolve_options(RequestOptions(), Q38, no_think) == PromptOptions(False, None, True)
    # preserve default falls back silently where the template has no switch
    assert resolve_options(RequestOptions(), Q35, no_think) == PromptOptions(False, None, False)
    # an explicit effort turns thinking on under a --no-thinking default
    assert resolve_options(RequestOptions(effort="low"), Q38, no_think) == PromptOptions(True, "low", True)


def test_efforts_and_switches() -> None:
    for effort in ("low", "medium", "xhigh"):
        assert resolve_options(RequestOptions(effort=effort), Q38).effort == effort
    assert resolve_options(RequestOptions(effort="none"), Q38) == PromptOptions(False, None, False)
    assert resolve_options(RequestOptions(effort="none"), Q35) == PromptOptions(False, None, False)
    assert resolve_options(RequestOptions(enable_thinking=False), Q38).thinking is False
    assert resolve_options(RequestOptions(thinking_type="disabled"), Q38).thinking is False
    assert resolve_options(RequestOptions(thinking_type="adaptive"), Q38).thinking is True
    ok = RequestOptions(effort="low", enable_thinking=True, thinking_type="enabled")
    assert resolve_options(ok, Q38) == PromptOptions(True, "low", False)
    kw = RequestOptions(preserve_thinking=True, chat_template_kwargs={"preserve_thinking": True, "x": None})
    assert resolve_options(kw, Q36).preserve_thinking is True
    kw = RequestOptions(chat_template_kwargs={"enable_thinking": False, "preserve_thinking": False})
    assert resolve_options(kw, Q36) == PromptOptions(False, None, False)


@pytest.mark.parametrize("effort", ["minimal", "high", "max", "bogus"])
def test_effort_not_in_template(effort: str) -> None:
    e = error(RequestOptions(effort=effort, effort_param="output_config.effort"))
    assert (e.code, e.param) == ("reasoning_effort_not_supported", "output_config.effort")


@pytest.mark.parametrize("effort", ["low", "medium", "xhigh", "high"])
def test_any_effort_on_template_without_efforts(effort: str) -> None:
    assert error(RequestOptions(effort=effort), Q36).code == "reasoning_effort_not_supported"


def test_unsupported_effort_reported_before_conflicts() -> None:
    assert (
        error(RequestOptions(effort="high", enable_thinking=False)).code == "reasoning_effort_not_supported"
    )


@pytest.mark.parametrize(
    "req",
    [
        RequestOptions(effort="none", enable_thinking=True),
        RequestOptions(effort="low", enable_thinking=False),
        RequestOptions(effort="xhigh", thinking_type="disabled", effort_param="output_config.effort"),
        RequestOptions(enable_thinking=True, chat_template_kwargs={"enable_thinking": False}),
        RequestOptions(effort="low", chat_template_kwargs={"reasoning_effort": "medium"}),
        RequestOptions(preserve_thinking=True, chat_template_kwargs={"preserve_thinking": False}),
    ],
)
def test_conflicting_template_options(req: RequestOptions) -> None:
    assert error(req).code == "conflicting_template_option"


def test_preserve_spellings_conflict_names_the_field() -> None:
    e = error(RequestOptions(preserve_thinking=False, chat_template_kwargs={"preserve_thinking": True}))
    assert e.param == "preserve_thinking"


def test_unknown_and_invalid_template_kwargs() -> None:
    e = error(RequestOptions(chat_template_kwargs={"add_vision_id": True}))
    assert (e.code, e.param) == ("unknown_parameter", "chat_template_kwargs.add_vision_id")
    e = error(RequestOptions(chat_template_kwargs={"preserve_thinking": "yes"}))
    assert (e.code, e.param) == ("invalid_template_option", "chat_template_kwargs.preserve_thinking")


def test_switch_missing_from_template() -> None:
    e = error(RequestOptions(preserve_thinking=True), Q35)
    assert (e.code, e.param) == ("unsupported_template_option", "preserve_thinking")
    fixed = resolve_capabilities("{{ '<|im_start|>assistant\\n' }}")  # cannot switch thinking
    assert not fixed.thinking_switch and not fixed.thinking_default
    assert resolve_options(RequestOptions(enable_thinking=False), fixed).thinking is False
    assert error(RequestOptions(enable_thinking=True), fixed).code == "unsupported_template_option"
    assert error(RequestOptions(effort="none"), fixed).code == "reasoning_effort_not_supported"
