"""Request-option resolution shared by all protocols: thinking, reasoning effort, preserve_thinking.

Inputs are what the protocol adapters parsed (already type-checked at the protocol level);
the result is a `PromptOptions` or a `FrontendError` the HTTP layer maps to a 400 response.

Error codes (`FrontendError.code`):

* ``reasoning_effort_not_supported`` — an effort the loaded template does not expose (for the
  registered templates: ``minimal``, ``high``, ``max``; any effort other than ``none`` on a
  template without efforts; ``none`` on a template whose thinking cannot be switched).
* ``conflicting_template_option`` — contradictory inputs: an effort with thinking disabled,
  ``none`` with thinking enabled, two spellings of one option with different values.
* ``unknown_parameter`` — a non-null `chat_template_kwargs` key other than
  ``preserve_thinking``, ``enable_thinking`` and ``reasoning_effort`` (param
  ``chat_template_kwargs.<key>``). Null values are ignored.
* ``invalid_template_option`` — a known `chat_template_kwargs` key with a value of the wrong type.
* ``unsupported_template_option`` — a switch the loaded template lacks: an explicit
  ``preserve_thinking: true`` on a template without it, or a thinking mode the template
  cannot produce. (The server-wide defaults fall back silently to what the template does.)

Precedence: an explicit request value wins over the server defaults (`ServerDefaults`); an
explicit effort other than ``none`` turns thinking on even under a ``--no-thinking`` default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer.frontend.capabilities import TemplateCapabilities

KNOWN_TEMPLATE_KWARGS: tuple[str, ...] = ("preserve_thinking", "enable_thinking", "reasoning_effort")


class FrontendError(ValueError):
    """A request option the frontend cannot honour (HTTP 400)."""

    def __init__(self, code: str, param: str | None, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.param = param
        self.message = message


@dataclass(frozen=True)
class ServerDefaults:
    """Process-wide defaults: thinking on unless --no-thinking; preserve off unless --preserve-thinking."""

    thinking: bool = True
    preserve_thinking: bool = False


@dataclass(frozen=True)
class RequestOptions:
    """The thinking-related fields of one request, as the protocol adapter parsed them."""

    # OpenAI `reasoning_effort`, Responses `reasoning.effort`, Anthropic `output_config.effort`
    effort: str | None = None
    effort_param: str = "reasoning_effort"  # the field name reported in errors
    enable_thinking: bool | None = None  # OpenAI extension
    thinking_type: str | None = None  # Anthropic `thinking.type`: "disabled" or an enabling value
    preserve_thinking: bool | None = None  # the top-level alias
    chat_template_kwargs: dict[str, Any] | None = None


@dataclass(frozen=True)
class PromptOptions:
    """Resolved prompt options for one request."""

    thinking: bool
    effort: str | None  # None when thinking is off or the template has no effort switch
    preserve_thinking: bool


def _merge(first: Any, second: Any, param: str) -> Any:
    if first is not None and second is not None and first != second:
        raise FrontendError(
            "conflicting_template_option", param, f"{param} is given twice with different values"
        )
    return first if first is not None else second


def _template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in (kwargs or {}).items():
        if value is None:
            continue
        param = f"chat_template_kwargs.{key}"
        if key not in KNOWN_TEMPLATE_KWARGS:
            raise FrontendError("unknown_parameter", param, f"unknown chat_template_kwargs key {key!r}")
        want = str if key == "reasoning_effort" else bool
        if not isinstance(value, want):
            raise FrontendError("invalid_template_option", param, f"{param} must be a {want.__name__}")
        found[key] = value
    return found


def _explicit_thinking(req: RequestOptions, effort: str | None, enable: bool | None) -> bool | None:
    """The thinking mode the request asks for explicitly, or None; raises on contradictions."""
    by_type = None if req.thinking_type is None else req.thinking_type != "disabled"
    by_effort = None if effort is None else effort != "none"
    modes = {
        name: value
        for name, value in (
            (req.effort_param, by_effort),
            ("enable_thinking", enable),
            ("thinking.type", by_type),
        )
        if value is not None
    }
    if len(set(modes.values())) > 1:
        names = " and ".join(modes)
        raise FrontendError(
            "conflicting_template_option", next(iter(modes)), f"{names} contradict each other"
        )
    return next(iter(modes.values()), None)


def resolve_options(
    req: RequestOptions, caps: TemplateCapabilities, defaults: ServerDefaults = ServerDefaults()
) -> PromptOptions:
    """Resolve one request's options against the loaded template, or raise `FrontendError`."""
    kwargs = _template_kwargs(req.chat_template_kwargs)
    effort = _merge(req.effort, kwargs.get("reasoning_effort"), req.effort_param)
    enable = _merge(req.enable_thinking, kwargs.get("enable_thinking"), "enable_thinking")
    preserve = _merge(req.preserve_thinking, kwargs.get("preserve_thinking"), "preserve_thinking")

    if effort is not None:
        supported = effort in caps.efforts or (effort == "none" and caps.thinking_switch)
        if not supported:
            exposed = ", ".join(caps.efforts) if caps.efforts else "no reasoning efforts"
            raise FrontendError(
                "reasoning_effort_not_supported",
                req.effort_param,
                f"reasoning effort {effort!r} is not supported by the loaded chat template ({exposed})",
            )

    explicit = _explicit_thinking(req, effort, enable)
    if caps.thinking_switch:
        thinking = defaults.thinking if explicit is None else explicit
    else:
        thinking = caps.thinking_default
        if explicit is not None and explicit != thinking:
            raise FrontendError(
                "unsupported_template_option",
                "enable_thinking",
                f"the loaded chat template cannot switch thinking {'on' if explicit else 'off'}",
            )

    resolved_effort: str | None = None
    if thinking and caps.efforts:
        resolved_effort = effort if effort in caps.efforts else caps.default_effort

    if caps.preserve_thinking:
        resolved_preserve = defaults.preserve_thinking if preserve is None else preserve
    else:
        if preserve:
            raise FrontendError(
                "unsupported_template_option",
                "preserve_thinking",
                "the loaded chat template cannot preserve reasoning of closed turns",
            )
        resolved_preserve = False
    return PromptOptions(thinking=thinking, effort=resolved_effort, preserve_thinking=resolved_preserve)
