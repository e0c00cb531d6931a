"""Suite-wide test settings: property tests are reproducible under CI, exploratory elsewhere."""

from __future__ import annotations

import os

from hypothesis import settings

# CI replays the same examples on every run (a failure there is reproducible, never a fluke of
# the seed); a developer run draws fresh examples and keeps finding new cases.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
