"""Test harness: `python tests/service/serve_failing.py [overrides]` serves with an engine whose
warm-up fails (after the artifact and tokenizer loaded, as a device or capture failure would)."""

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's ninfer

from ninfer.config import load_settings
from ninfer.service.app_main import serve


def failing_engine(settings: Any, artifact: Any) -> Any:
    raise RuntimeError("engine warm-up failed (test)")


if __name__ == "__main__":
    serve(load_settings(sys.argv[1:]), sys.argv, engine_factory=failing_engine)
