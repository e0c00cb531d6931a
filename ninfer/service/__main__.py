"""`python -m ninfer.service [hydra overrides]`: compose the settings, then serve (``--help``: the keys)."""

from __future__ import annotations

import sys

EXIT_USAGE = 2
HELP_FLAGS = ("-h", "--help")


def usage() -> str:
    """The help text: Hydra ``KEY=VALUE`` overrides, one row per settings key of the option table."""
    from ninfer.config.options import CONTRACT_OPTIONS, EXTRA_OPTIONS

    rows = [(o.key if not o.is_switch else o.override(), o.meaning, o.default) for o in CONTRACT_OPTIONS]
    rows += [(o.key if not o.is_switch else o.override(), o.meaning, o.default) for o in EXTRA_OPTIONS]
    width = max(len(key) for key, _, _ in rows)
    lines = [
        "usage: python -m ninfer.service [KEY=VALUE ...]",
        "",
        "Serve one .ninfer artifact over OpenAI- and Anthropic-compatible HTTP endpoints. Each",
        "argument is a Hydra override (e.g. model.artifact=PATH engine.max_context=4096, or",
        "+preset=NAME from conf/preset/); NINFER_<GROUP>_<KEY> environment variables sit between",
        "the defaults and preset and these.",
        "The same settings as command-line flags: ninfer-serve --help.",
        "",
        "settings keys:",
        *(f"  {key:<{width}}  {meaning} [default: {default}]" for key, meaning, default in rows),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if any(a in HELP_FLAGS for a in args):
        sys.stdout.write(usage())
        raise SystemExit(0)

    from ninfer.config import ConfigError, load_settings
    from ninfer.service.app_main import serve

    try:
        settings = load_settings(args)
    except ConfigError as exc:
        print(f"python -m ninfer.service: error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    serve(settings, ["python -m ninfer.service", *args])


if __name__ == "__main__":
    main()
