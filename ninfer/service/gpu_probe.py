"""The compute capability of the GPU a server will run on, read in a child process: the gunicorn
master must not initialise CUDA (its forked worker could not use it)."""

from __future__ import annotations

import subprocess
import sys

_PROBE = (
    "import sys, torch\n"
    "i = int(sys.argv[1])\n"
    "ok = torch.cuda.is_available() and i < torch.cuda.device_count()\n"
    "print('%d %d' % torch.cuda.get_device_capability(i) if ok else 'none')\n"
)


def device_capability(device: int | str, timeout_s: float = 120.0) -> tuple[int, int] | None:
    """(major, minor) of CUDA device `device`, or None for the CPU (`cpu`, or no such GPU)."""
    if device == "cpu":
        return None
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE, str(device)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        ).stdout.split()
    except (subprocess.SubprocessError, OSError):
        return None  # no usable torch / CUDA here: the worker reports what fails
    return None if out == ["none"] or len(out) != 2 else (int(out[0]), int(out[1]))
