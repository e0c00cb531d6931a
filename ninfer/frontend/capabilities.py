"""Prompt capabilities resolved once from the exact chat-template text embedded in an artifact.

The three official Qwen templates are recognised by sha256. Any other template is probed
conservatively: a switch is reported only when the template visibly reads the variable, no
reasoning efforts are exposed, and the thinking default comes from rendering a probe prompt.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ninfer.frontend.render import TemplateError, render_template

QWEN_EFFORTS: tuple[str, ...] = ("low", "medium", "xhigh")


@dataclass(frozen=True)
class TemplateCapabilities:
    """What the loaded chat template can do, independent of any request."""

    sha256: str
    name: str | None  # "qwen3_5" / "qwen3_6" / "qwen3_8", or None when not an official template
    thinking_switch: bool  # the template reads `enable_thinking`
    thinking_default: bool  # the generation prompt opens a think block when nothing is passed
    preserve_thinking: bool  # the template reads `preserve_thinking`
    efforts: tuple[str, ...]  # reasoning efforts the template exposes (empty: no effort switch)
    default_effort: str | None  # the template's effort when the request names none
    chatml: bool  # ChatML turns: the Qwen system/developer lowering applies


_OFFICIAL: dict[str, TemplateCapabilities] = {
    "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715": TemplateCapabilities(
        sha256="a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",
        name="qwen3_5",
        thinking_switch=True,
        thinking_default=True,
        preserve_thinking=False,
        efforts=(),
        default_effort=None,
        chatml=True,
    ),
    "e84f32a23fdda27689f868aa4a1a5621f41133e51a48d7f3efcbea2839574259": TemplateCapabilities(
        sha256="e84f32a23fdda27689f868aa4a1a5621f41133e51a48d7f3efcbea2839574259",
        name="qwen3_6",
        thinking_switch=True,
        thinking_default=True,
        preserve_thinking=True,
        efforts=(),
        default_effort=None,
        chatml=True,
    ),
    "c3cf9e34abf4f9e36c2d72165aa9c132d3e2a725b6c2586aaa3a8af9d7a81041": TemplateCapabilities(
        sha256="c3cf9e34abf4f9e36c2d72165aa9c132d3e2a725b6c2586aaa3a8af9d7a81041",
        name="qwen3_8",
        thinking_switch=True,
        thinking_default=True,
        preserve_thinking=True,
        efforts=QWEN_EFFORTS,
        default_effort="xhigh",
        chatml=True,
    ),
}


def template_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _probe_thinking_default(text: str) -> bool:
    try:
        out = render_template(text, [{"role": "user", "content": "probe"}], add_generation_prompt=True)
    except TemplateError:
        return False
    return out.rstrip(" \n").endswith("<think>")


def resolve_capabilities(text: str) -> TemplateCapabilities:
    """Capabilities of the template `text` (exact bytes as embedded in the artifact)."""
    digest = template_sha256(text)
    known = _OFFICIAL.get(digest)
    if known is not None:
        return known
    return TemplateCapabilities(
        sha256=digest,
        name=None,
        thinking_switch="enable_thinking" in text,
        thinking_default=_probe_thinking_default(text),
        preserve_thinking="preserve_thinking" in text,
        efforts=(),
        default_effort=None,
        chatml="<|im_start|>" in text and "<|im_end|>" in text,
    )
