"""Which weight formats the GPU kernels run where, and the startup refusal of an artifact whose
formats the GPU cannot run (before the port is bound: `app_main.check_artifact`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_fixtures import make_hf_checkpoint

from ninfer.artifact.convert import convert
from ninfer.config.errors import ConfigError
from ninfer.config.loader import load_settings
from ninfer.kernels.support import unsupported
from ninfer.service import app_main, gpu_probe


def test_formats_by_compute_capability() -> None:
    assert unsupported({"fp8_e4m3_b128", "q4_g64"}, None) is None  # the CPU runs every format
    assert unsupported({"q4_g64", "q5_g64", "q6_g64", "q8_g32"}, (7, 0)) is None
    assert unsupported({"fp8_e4m3_b128"}, (8, 9)) is None and unsupported({"fp8_e4m3_b128"}, (9, 0)) is None
    why = unsupported({"fp8_e4m3_b128", "q4_g64"}, (8, 6))
    assert why is not None and "fp8_e4m3_b128" in why and "8.9" in why and "8.6" in why


@pytest.fixture(scope="module")
def fp8_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fp8")
    return convert(
        make_hf_checkpoint(root / "hf", "dense", with_mtp=False, seed=2), root / "m.ninfer", weights="fp8"
    )


def test_an_fp8_artifact_is_refused_on_an_older_gpu(
    fp8_artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings([f"model.artifact={fp8_artifact}"])
    monkeypatch.setattr(gpu_probe, "device_capability", lambda device, timeout_s=120.0: (8, 0))
    with pytest.raises(ConfigError, match=r"fp8_e4m3_b128 needs a GPU of compute capability 8\.9"):
        app_main.check_artifact(settings)
    monkeypatch.setattr(gpu_probe, "device_capability", lambda device, timeout_s=120.0: (9, 0))
    app_main.check_artifact(settings)  # an H100 / H200 runs it
    monkeypatch.setattr(gpu_probe, "device_capability", lambda device, timeout_s=120.0: None)
    app_main.check_artifact(settings)  # no GPU: the reference path runs every format


def test_the_probe_reads_no_gpu_as_none() -> None:
    assert gpu_probe.device_capability("cpu") is None
    assert gpu_probe.device_capability(0) is None  # the CPU test machine: torch sees no CUDA device
