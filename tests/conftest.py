"""Suite-wide test settings: one compute thread per process, and property tests reproducible
under CI, exploratory elsewhere; `fresh_dynamo` for the tests that compile."""

from __future__ import annotations

import os
from collections.abc import Iterator

# Two test workers and the servers they start share the cores: with torch's default (a thread per
# core, each spinning while it waits) they oversubscribe them, and a test that takes 42 s alone took
# 189 s beside a second one. One thread each (set before torch is imported; inherited by every
# server and subprocess a test starts) keeps both at their single-process speed.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch  # after the thread setting
from hypothesis import settings

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# CI replays the same examples on every run (a failure there is reproducible, never a fluke of
# the seed); a developer run draws fresh examples and keeps finding new cases.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """A test that compiles starts from no compiled code and no Dynamo counts, and leaves none, nor
    the Dynamo settings the compiled layer steps change, behind."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    config = torch._dynamo.config
    saved = config.recompile_limit, config.capture_dynamic_output_shape_ops
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()
    config.recompile_limit, config.capture_dynamic_output_shape_ops = saved
