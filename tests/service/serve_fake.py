"""Test harness: `python tests/service/serve_fake.py [overrides]` serves with the scripted engine."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# this checkout's ninfer, not whichever one the environment has installed
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

from fake_engine import FakeEngine

from ninfer.config import load_settings
from ninfer.service.app_main import serve

if __name__ == "__main__":
    serve(load_settings(sys.argv[1:]), sys.argv, engine_factory=FakeEngine)
