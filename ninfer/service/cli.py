"""``ninfer-serve ARTIFACT --flag value ...``: contract flags -> Hydra overrides -> Settings -> serve."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from ninfer.config.errors import ConfigError
from ninfer.config.options import BY_KEY, CONTRACT_OPTIONS, EXTRA_OPTIONS, Option, hydra_quote

PROG = "ninfer-serve"
EXIT_USAGE = 2  # invalid flags or settings


class _OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())}\n")


def _help(option: Option) -> str:
    target = option.override() if option.is_switch else option.key
    return f"{option.meaning} [default: {option.default}] ({target})".replace("%", "%%")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser, generated from the option table shared with the settings keys."""
    parser = _OneLineParser(
        prog=PROG,
        description="Serve one .ninfer artifact over OpenAI- and Anthropic-compatible HTTP endpoints.",
        epilog=(
            "Precedence: defaults < --preset < NINFER_<GROUP>_<KEY> environment < flags and --set. "
            "Each flag sets the settings key shown in parentheses."
        ),
    )
    parser.add_argument(
        "artifact",
        nargs="?",
        metavar="ARTIFACT",
        help="the .ninfer artifact [default: the demo artifact; model.artifact]",
    )
    contract = parser.add_argument_group("server options (serving contract)")
    extra = parser.add_argument_group("further options")
    for group, options in ((contract, CONTRACT_OPTIONS), (extra, EXTRA_OPTIONS)):
        for option in options:
            if option.is_switch:
                group.add_argument(option.flag, dest=option.dest, action="store_true", help=_help(option))
            else:
                group.add_argument(option.flag, dest=option.dest, metavar=option.metavar, help=_help(option))
    extra.add_argument("--preset", metavar="NAME", help="a preset under conf/preset/ (+preset=NAME)")
    extra.add_argument(
        "--set",
        dest="overrides",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="any Hydra override, e.g. telemetry.exporter=console (repeatable; wins over flags)",
    )
    extra.add_argument(
        "--check-config",
        action="store_true",
        help="validate, print the resolved settings as JSON (API key redacted) and exit without serving",
    )
    return parser


def _overrides(ns: argparse.Namespace) -> list[str]:
    out: list[str] = []
    if ns.preset is not None:
        out.append(f"+preset={hydra_quote(ns.preset)}")
    if ns.artifact is not None:
        out.append(f"model.artifact={hydra_quote(ns.artifact)}")
    for option in (*CONTRACT_OPTIONS, *EXTRA_OPTIONS):
        value = vars(ns)[option.dest]
        if option.is_switch and value:
            out.append(option.override())
        elif not option.is_switch and value is not None:
            out.append(option.override(value))
    out.extend(ns.overrides)
    return out


def translate(argv: Sequence[str]) -> list[str]:
    """The Hydra overrides that ``ninfer-serve argv`` stands for (argv without the program name)."""
    return _overrides(build_parser().parse_args(list(argv)))


def _message(exc: ConfigError, ns: argparse.Namespace) -> str:
    """The error, naming the flag when the offending key was given by one."""
    option = BY_KEY.get(exc.key or "")
    if option is None or exc.source is not None:
        return str(exc)
    given = vars(ns).get(option.dest)
    if option.is_switch and given:
        return f"{option.flag} ({exc.key}={exc.value}): {exc.reason}"
    if not option.is_switch and given is not None:
        return f"{option.flag}={exc.value} ({exc.key}): {exc.reason}"
    return str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, validate the settings, then serve (or print them with --check-config)."""
    parser = build_parser()
    args = sys.argv[1:] if argv is None else list(argv)
    ns = parser.parse_args(args)
    from ninfer.config.loader import load_settings

    try:
        settings = load_settings(_overrides(ns))
    except ConfigError as exc:
        print(f"{PROG}: error: {_message(exc, ns)}", file=sys.stderr)
        return EXIT_USAGE
    if ns.check_config:
        print(json.dumps(settings.redacted_dump(), indent=2))
        return 0
    from ninfer.service.app_main import serve

    serve(settings, [PROG, *args])
    return 0


if __name__ == "__main__":
    sys.exit(main())
