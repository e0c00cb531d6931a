"""The official Qwen chat templates, shipped as package data (see NOTICE.md)."""

from __future__ import annotations

from importlib import resources

NAMES = ("qwen3_5", "qwen3_6", "qwen3_8")


def read_template(name: str) -> str:
    """Return the exact text of an official template by name (`qwen3_5`, `qwen3_6`, `qwen3_8`)."""
    if name not in NAMES:
        raise KeyError(f"unknown template {name!r}; known: {NAMES}")
    return resources.files(__package__).joinpath(f"{name}.jinja").read_text(encoding="utf-8")
