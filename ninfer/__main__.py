"""`python -m ninfer ARTIFACT --prompt TEXT ...`: the one-shot command (`ninfer.oneshot.cli`)."""

from __future__ import annotations

import sys

from ninfer.oneshot.cli import main

if __name__ == "__main__":
    sys.exit(main())
