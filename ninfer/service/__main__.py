"""`python -m ninfer.service [hydra overrides]`: compose the settings, then serve."""

from __future__ import annotations

import sys

EXIT_USAGE = 2


def main(argv: list[str] | None = None) -> None:
    from ninfer.config import ConfigError, load_settings
    from ninfer.service.app_main import serve

    args = sys.argv[1:] if argv is None else argv
    try:
        settings = load_settings(args)
    except ConfigError as exc:
        print(f"python -m ninfer.service: error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    serve(settings, ["python -m ninfer.service", *args])


if __name__ == "__main__":
    main()
