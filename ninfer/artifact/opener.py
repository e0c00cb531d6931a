"""`open_artifact`: an artifact directory (`reader`) or a seed system's single-file `.ninfer`
container, v2 / v3 (`seed_artifact`), both opened as one `Artifact`."""

from __future__ import annotations

from pathlib import Path

from ninfer.artifact.reader import Artifact, open_directory


def open_artifact(path: str | Path, verify: bool = False) -> Artifact:
    """Open and check an artifact; `verify=True` also recomputes every digest of a directory (a
    seed file carries none: its structure is checked as it opens)."""
    root = Path(path)
    if root.is_file():
        from ninfer.artifact.seed_artifact import open_seed

        return open_seed(root)
    return open_directory(root, verify)
