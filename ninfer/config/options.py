"""The ninfer-serve flag <-> settings key table, Hydra override quoting and argv redaction.

The table is generated from the settings models (`groups.py`): every field declared with
`flag(...)` is one flag, named ``--<field>`` with dashes unless `FLAG_NAMES` renames it, taking
its meaning, metavar and shown default from the field. A boolean field is a switch that sets the
opposite of its default (``--no-cold-tier`` sets ``cold_tier.enabled=false``). Fields in
`EXTRA_KEYS` are flags beyond the serving contract's option table; the rest are the contract's.
``ninfer-serve --help`` and the flag translation come from this table, so flags, keys and
defaults cannot drift.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from ninfer.config.errors import REDACTED
from ninfer.config.groups import GROUPS


@dataclass(frozen=True)
class Option:
    """One command-line flag and the settings key it sets."""

    flag: str  # e.g. "--max-context"
    key: str  # e.g. "engine.max_context"
    meaning: str
    default: str  # the default as the contract words it
    metavar: str | None = None  # None: a switch without a value
    switch_value: bool = True  # the value a switch writes to its key

    @property
    def is_switch(self) -> bool:
        return self.metavar is None

    @property
    def dest(self) -> str:
        """The argparse attribute the flag is parsed into (e.g. "max_context")."""
        return self.flag[2:].replace("-", "_")

    def override(self, value: str | None = None) -> str:
        """The Hydra override this flag stands for (``value`` is the flag's argument)."""
        if self.is_switch:
            return f"{self.key}={'true' if self.switch_value else 'false'}"
        assert value is not None
        return f"{self.key}={hydra_quote(value)}"


# settings key -> flag, where the flag is not "--" + the field name with dashes
FLAG_NAMES: dict[str, str] = {
    "kv.capacity": "--kv-capacity",
    "kv.dtype": "--kv-dtype",
    "spec.method": "--spec",
    "vision.enabled": "--vision",
    "cold_tier.enabled": "--no-cold-tier",
    "cold_tier.device": "--cold-tier-device",
    "cold_tier.capacity_mib": "--cold-tier-capacity-mib",
    "cold_tier.staging_mib": "--cold-tier-staging-mib",
    "cold_tier.host_mib": "--cold-tier-host-mib",
    "logging.level": "--log-level",
}
# flags beyond the serving contract's option table
EXTRA_KEYS = frozenset(
    {
        "engine.dtype", "logging.level", "server.client_compat", "server.metrics_open", "cold_tier.host_mib",
        "sampling.default_thinking_budget",
    }
)  # fmt: skip


def _leaf_types(annotation: Any) -> list[Any]:
    """The plain types and Literal values a (possibly Optional / Annotated) annotation admits."""
    if get_origin(annotation) is Annotated:
        return _leaf_types(get_args(annotation)[0])
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    if get_origin(annotation) in (Union, UnionType):
        return [t for arg in get_args(annotation) for t in _leaf_types(arg)]
    return [annotation]


def _metavar(info: FieldInfo) -> str:
    kinds = [t for t in _leaf_types(info.annotation) if t is not type(None)]
    if all(isinstance(t, str) for t in kinds):
        return "|".join(kinds)
    if kinds == [int]:
        return "N"
    if kinds == [float]:
        return "F"
    raise TypeError(f"give flag(..., metavar=...) for a field of type {info.annotation}")


def _shown(default: Any) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return "on" if default else "off"
    return str(default)


def _option(key: str, info: FieldInfo) -> Option:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    flag = FLAG_NAMES.get(key, "--" + key.split(".", 1)[1].replace("_", "-"))
    shown = str(extra.get("shown_default") or _shown(info.default))
    assert info.description is not None
    if info.annotation is bool:  # a switch: sets the opposite of the default
        return Option(flag, key, info.description, shown, None, not info.default)
    return Option(flag, key, info.description, shown, str(extra.get("metavar") or _metavar(info)))


def _options() -> list[Option]:
    return [
        _option(f"{name}.{field}", info)
        for name, model in GROUPS.items()
        for field, info in model.model_fields.items()
        if info.description is not None
    ]


_ALL = _options()
CONTRACT_OPTIONS: tuple[Option, ...] = tuple(o for o in _ALL if o.key not in EXTRA_KEYS)
EXTRA_OPTIONS: tuple[Option, ...] = tuple(o for o in _ALL if o.key in EXTRA_KEYS)
OPTIONS: tuple[Option, ...] = CONTRACT_OPTIONS + EXTRA_OPTIONS
BY_FLAG: dict[str, Option] = {o.flag: o for o in OPTIONS}
BY_KEY: dict[str, Option] = {o.key: o for o in OPTIONS}


def hydra_quote(value: str) -> str:
    """``value`` as a single-quoted Hydra override string that composes back to exactly ``value``.

    Quotes and trailing backslashes are escaped and ``${`` is kept literal (no interpolation), so an
    API key or a path with any characters round-trips.
    """
    text = re.sub(r"(\\*)(\$\{)", lambda m: m.group(1) * 2 + "\\${", value)
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return f"'{text}'"


_SECRET_OVERRIDE = re.compile(r"^(\+{0,2}server\.api_key=)(.*)$", re.DOTALL)


def argv_redacted(argv: Sequence[str]) -> list[str]:
    """``argv`` with every API-key value replaced by ``<redacted>`` (flag and Hydra spellings)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg == "--api-key":
            out.append(arg)
            hide_next = True
        elif arg.startswith("--api-key="):
            out.append("--api-key=" + REDACTED)
        elif arg.startswith("--set=") and _SECRET_OVERRIDE.match(arg[len("--set=") :]):
            out.append("--set=" + _SECRET_OVERRIDE.sub(r"\1", arg[len("--set=") :]) + REDACTED)
        elif _SECRET_OVERRIDE.match(arg):
            out.append(_SECRET_OVERRIDE.sub(r"\1", arg) + REDACTED)
        else:
            out.append(arg)
    return out
