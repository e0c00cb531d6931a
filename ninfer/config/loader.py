"""The Hydra -> Settings bridge: compose conf/, layer NINFER_* env, validate into frozen Settings.

Precedence, low to high: the settings models' defaults (registered with Hydra's ConfigStore as
``ninfer_defaults``: every default lives once, in `groups.py`), a ``+preset=NAME`` from
conf/preset/, then ``NINFER_<GROUP>_<KEY>`` environment variables, then explicit
``group.key=value`` overrides.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource

from ninfer.config.errors import ConfigError, from_validation_error
from ninfer.config.groups import GROUPS, defaults
from ninfer.config.settings import Settings

CONFIG_NAME = "config"
DEFAULTS_NODE = "ninfer_defaults"  # conf/config.yaml's first default: the models' values
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the checkout holding ninfer/ and conf/
_LOCK = threading.Lock()  # Hydra's global state is per process


def conf_dir() -> Path:
    """The absolute path of the ``conf/`` tree.

    Looked up in order: ``$NINFER_CONF_DIR``; the checkout holding the package (source or
    editable install); ``./conf`` in the working directory (a deployment that copies conf/
    beside a regular install, as the Dockerfile does).
    """
    candidates = []
    if os.environ.get("NINFER_CONF_DIR"):
        candidates.append(Path(os.environ["NINFER_CONF_DIR"]))
    candidates += [_PACKAGE_ROOT / "conf", Path.cwd() / "conf"]
    for path in candidates:
        if (path / f"{CONFIG_NAME}.yaml").is_file():
            return path.resolve()
    raise ConfigError(
        f"conf/: {CONFIG_NAME}.yaml not found in {', '.join(str(c) for c in candidates)} "
        "(set NINFER_CONF_DIR or run from a checkout)"
    )


def defaults_tree() -> dict[str, dict[str, Any]]:
    """Every settings group's default values, read from the models."""
    return {name: defaults(model) for name, model in GROUPS.items()}


def register_defaults() -> None:
    """Store the models' defaults as Hydra's ``ninfer_defaults`` node (conf/config.yaml's first
    default). Done when this module is imported, so a ``@hydra.main`` entry point over conf/
    composes the same tree once it has imported ``ninfer.config``."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=DEFAULTS_NODE, node=defaults_tree())


def group_options(group: str) -> list[str]:
    """The config names available in one Hydra group folder (e.g. the presets)."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def explicit_keys(overrides: Sequence[str]) -> set[str]:
    """The ``group.key`` names that ``overrides`` set explicitly; unknown keys and groups raise ConfigError."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as exc:
        raise ConfigError(f"invalid override: {_one_line(exc)}") from None
    keys: set[str] = set()
    for ov in parsed:
        name = ov.key_or_group
        value = ov.value() if not ov.is_delete() else None
        if name.startswith("hydra.") or name.startswith("hydra/"):
            continue
        if "." not in name:  # a config group choice: only preset is one
            if name != "preset":
                raise ConfigError.for_key(
                    name, value, f"unknown key (valid groups: {', '.join(GROUPS)}, preset)"
                )
            if name == "preset" and not (ov.is_add() or ov.is_force_add() or ov.is_delete()):
                raise ConfigError.for_key(name, value, f"select a preset with +preset={value}")
            choices = group_options(name)
            if not ov.is_delete() and value not in choices:
                raise ConfigError.for_key(name, value, f"unknown {name} (valid: {', '.join(choices)})")
            continue
        group, _, field = name.partition(".")
        model = GROUPS.get(group)
        if model is None:
            raise ConfigError.for_key(name, value, f"unknown key (valid groups: {', '.join(GROUPS)})")
        if field not in model.model_fields:
            valid = ", ".join(model.model_fields)
            raise ConfigError.for_key(name, value, f"unknown key (valid keys of {group}: {valid})")
        if not ov.is_delete():
            keys.add(name)
    return keys


def _reject_unknown_env(group: str, model: type[BaseSettings], prefix: str) -> None:
    """A misspelt NINFER_<GROUP>_<KEY> variable fails instead of being silently ignored."""
    for env_name in os.environ:
        upper = env_name.upper()
        if upper.startswith(prefix) and upper[len(prefix) :].lower() not in model.model_fields:
            valid = ", ".join(model.model_fields)
            # the value is not shown: the variable may be a misspelt secret
            raise ConfigError(f"{env_name}: unknown environment setting (valid keys of {group}: {valid})")


def settings_from_tree(
    tree: dict[str, Any], explicit: AbstractSet[str] = frozenset(), *, env: bool = True
) -> Settings:
    """Settings from a composed config tree; NINFER_* env replaces every value not in ``explicit``.

    ``env=False``: the tree over the models' defaults, the environment not read (the offline `LLM`,
    whose engine must not change with the NINFER_* variables of the process that runs a script).
    """
    tree = dict(tree)
    tree.pop("hydra", None)
    unknown = sorted(set(tree) - set(GROUPS))
    if unknown:
        raise ConfigError.for_key(
            unknown[0], tree[unknown[0]], f"unknown key (valid groups: {', '.join(GROUPS)})"
        )
    groups: dict[str, Any] = {}
    for name, model in GROUPS.items():
        values = dict(tree.get(name) or {})
        if not isinstance(tree.get(name) or {}, dict):
            raise ConfigError.for_key(name, tree[name], "must be a mapping of keys")
        sources: dict[str, str] = {}
        if not env:  # every field given: the model has nothing left to read from the environment
            values = {**defaults(model), **values}
        else:
            prefix = model.model_config.get("env_prefix", "")
            _reject_unknown_env(name, model, prefix)
            for field, env_value in EnvSettingsSource(model)().items():
                key = f"{name}.{field}"
                if key not in explicit:
                    values[field] = env_value
                    sources[key] = f"{prefix}{field.upper()}"
        try:
            groups[name] = model(**values)
        except ValidationError as exc:
            raise from_validation_error(name, model, exc, sources) from None
    try:
        return Settings(**groups)
    except ValidationError as exc:
        raise from_validation_error(None, Settings, exc) from None


def settings_from_config(cfg: Any, overrides: Sequence[str] = ()) -> Settings:
    """Settings from an already composed DictConfig (e.g. under ``@hydra.main``) and its task overrides."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    explicit = explicit_keys(overrides)
    try:
        tree = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid configuration: {_one_line(exc)}") from None
    assert isinstance(tree, dict)
    return settings_from_tree({str(k): v for k, v in tree.items()}, explicit)


def _compose(overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    with _LOCK:
        if GlobalHydra.instance().is_initialized():
            raise ConfigError(
                "load_settings: Hydra is already initialized; use settings_from_config(cfg, overrides)"
            )
        try:
            with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3", job_name="ninfer"):
                return compose(config_name=CONFIG_NAME, overrides=overrides)
        except (HydraException, OmegaConfBaseException) as exc:
            raise ConfigError(f"invalid override: {_one_line(exc)}") from None


@functools.lru_cache(maxsize=32)
def _base_tree(choices: tuple[str, ...]) -> dict[str, Any]:
    """The unresolved tree Hydra composes for the group choices alone (e.g. ``+preset=demo``)."""
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(_compose(list(choices)), resolve=False)
    assert isinstance(tree, dict)
    return {str(k): v for k, v in tree.items()}


def _composed(overrides: list[str]) -> Any:
    """The composed DictConfig; plain ``group.key=value`` changes reuse a cached composition.

    The cached path applies each change exactly as Hydra's own loader does (``OmegaConf.update``
    with ``merge=True`` on the struct config), after the group choices; anything else (additions,
    deletions, sweeps, ``hydra.*``) goes through a full Hydra composition.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = tuple(o.input_line or "" for o in parsed if "." not in o.key_or_group and o.package is None)
    changes = [o for o in parsed if "." in o.key_or_group]
    plain = all(
        o.type == OverrideType.CHANGE and not o.is_sweep_override() and not o.key_or_group.startswith("hydra")
        for o in changes
    )
    if not plain or len(choices) + len(changes) != len(parsed):
        return _compose(overrides)
    cfg = OmegaConf.create(_base_tree(choices))
    OmegaConf.set_struct(cfg, True)
    for o in changes:
        try:
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"invalid override {o.input_line}: {_one_line(exc)}") from None
    return cfg


def load_settings(overrides: Sequence[str] = ()) -> Settings:
    """Compose ``conf/`` with Hydra ``overrides`` (``engine.max_context=4096``, ``+preset=qwen27b``).

    Hydra is used through its compose API only: it never changes directory or writes files.
    Raises ConfigError with a one-line message on any invalid key or value.
    """
    overrides = list(overrides)
    explicit_keys(overrides)  # clear messages for unknown keys before Hydra's own
    return settings_from_config(_composed(overrides), overrides)


register_defaults()
