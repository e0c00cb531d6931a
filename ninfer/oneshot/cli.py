"""``ninfer ARTIFACT --prompt TEXT | --messages FILE [--max-new N] ...``: flags -> Settings and the
conversation, checked before anything loads; usage errors are one line and exit 2."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from ninfer.config.errors import ConfigError
from ninfer.config.options import BY_KEY, CONTRACT_OPTIONS, EXTRA_OPTIONS, Option, hydra_quote

PROG = "ninfer"
EXIT_USAGE = 2  # bad flags, input, settings, or settings the artifact cannot honour
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# the server's flags this command takes too (same settings keys, same meanings)
SHARED_FLAGS = ("--max-context", "--spec", "--draft-tokens", "--lm-head-draft", "--vision", "--kv-dtype",
                "--temperature", "--top-p", "--top-k", "--seed", "--greedy", "--no-thinking",
                "--preserve-thinking", "--device", "--dtype", "--prefill-chunk", "--no-cuda-graph")  # fmt: skip
# one conversation at a time: no cold tier (its host arena is for many resident conversations)
BASE_OVERRIDES = ("cold_tier.enabled=false",)


class UsageError(Exception):
    """Bad input of this command (the messages file): one line, exit 2."""


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())}\n")


def shared_options() -> list[Option]:
    by_flag = {o.flag: o for o in (*CONTRACT_OPTIONS, *EXTRA_OPTIONS)}
    return [by_flag[f] for f in SHARED_FLAGS]


def _dest(option: Option) -> str:
    return option.flag[2:].replace("-", "_")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog=PROG,
        description=(
            "Answer one conversation with a .ninfer artifact, through the same engine and frontend as "
            "ninfer-serve: the answer streams on stdout; loading progress, reasoning, timing, throughput "
            "and speculative statistics go to stderr."
        ),
    )
    parser.add_argument(
        "artifact", nargs="?", metavar="ARTIFACT", help="the .ninfer artifact [default: the demo]"
    )
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", metavar="TEXT", help="one user message")
    given.add_argument(
        "--messages",
        metavar="FILE",
        help="a JSON file: a list of Chat Completions messages, or an object with `messages` (and "
        "optionally `tools`, `tool_choice`, `response_format`); `-` reads stdin",
    )
    parser.add_argument(
        "--max-new",
        type=_positive,
        metavar="N",
        help="output token limit [default: engine.default_max_tokens]",
    )
    parser.add_argument("--reasoning-effort", choices=EFFORTS, help="the template's reasoning effort")
    for option in shared_options():
        help_text = f"{option.meaning} [default: {option.default}] ({option.key})".replace("%", "%%")
        if option.is_switch:
            parser.add_argument(option.flag, dest=_dest(option), action="store_true", help=help_text)
        else:
            parser.add_argument(option.flag, dest=_dest(option), metavar=option.metavar, help=help_text)
    parser.add_argument("--preset", metavar="NAME", help="a preset under conf/preset/ (+preset=NAME)")
    parser.add_argument(
        "--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
        help="any settings override, e.g. engine.prefill_chunk=256 (repeatable; wins over flags)",
    )  # fmt: skip
    return parser


def overrides(ns: argparse.Namespace) -> list[str]:
    """The Hydra overrides the flags stand for (the server's keys)."""
    out = list(BASE_OVERRIDES)
    if ns.preset is not None:
        out.append(f"+preset={hydra_quote(ns.preset)}")
    if ns.artifact is not None:
        out.append(f"model.artifact={hydra_quote(ns.artifact)}")
    for option in shared_options():
        value = getattr(ns, _dest(option))
        if option.is_switch and value:
            out.append(option.override())
        elif not option.is_switch and value is not None:
            out.append(option.override(value))
    return out + list(ns.overrides)


def config_message(exc: ConfigError, ns: argparse.Namespace) -> str:
    """The error, naming the flag when one of this command's flags gave the offending key."""
    option = BY_KEY.get(exc.key or "")
    if option is None or exc.source is not None or option.flag not in SHARED_FLAGS:
        return " ".join(str(exc).split())
    given = getattr(ns, _dest(option), None)
    if option.is_switch and given:
        return f"{option.flag} ({exc.key}={exc.value}): {exc.reason}"
    if not option.is_switch and given is not None:
        return f"{option.flag}={exc.value} ({exc.key}): {exc.reason}"
    return " ".join(str(exc).split())


def request_body(ns: argparse.Namespace) -> dict[str, Any]:
    """The Chat Completions body of the conversation (parsed later by the server's own parser)."""
    if ns.prompt is not None:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": ns.prompt}]}
    else:
        try:
            text = sys.stdin.read() if ns.messages == "-" else Path(ns.messages).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--messages {ns.messages}: cannot read it ({exc})") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--messages {ns.messages}: not JSON ({exc})") from None
        if isinstance(doc, list):
            body = {"messages": doc}
        elif isinstance(doc, dict) and isinstance(doc.get("messages"), list):
            allowed = {"messages", "tools", "tool_choice", "parallel_tool_calls", "response_format"}
            extra = sorted(set(doc) - allowed)
            if extra:
                raise UsageError(
                    f"--messages {ns.messages}: unexpected field {extra[0]!r} (allowed: {sorted(allowed)})"
                )
            body = dict(doc)
        else:
            raise UsageError(
                f"--messages {ns.messages}: want a list of messages or an object with `messages`"
            )
    if ns.max_new is not None:
        body["max_tokens"] = ns.max_new
    if ns.reasoning_effort is not None:
        body["reasoning_effort"] = ns.reasoning_effort
    body["stream"] = True
    return body


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, validate, then answer (see `ninfer.oneshot.run`)."""
    ns = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    from ninfer.config.loader import load_settings

    try:
        body = request_body(ns)
        settings = load_settings(overrides(ns))
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as exc:
        print(f"{PROG}: error: {config_message(exc, ns)}", file=sys.stderr)
        return EXIT_USAGE
    from ninfer.oneshot.run import run

    return run(settings, body, PROG, sys.stdout, sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
