"""Entry point for `python -m ninfer.artifact`."""

from ninfer.artifact.cli import main

raise SystemExit(main())
