"""Kernel backend selection: every named backend either runs or says exactly what is missing."""

from __future__ import annotations

import importlib.util

import pytest

from ninfer.config.errors import ConfigError
from ninfer.config.loader import load_settings
from ninfer.kernels.dispatch import BackendUnavailable, backends, get_ops


@pytest.mark.parametrize(("name", "package"), [("xformers", "xformers"), ("tensorrt", "torch_tensorrt")])
def test_optional_backends_name_what_is_missing(name: str, package: str) -> None:
    assert name in backends()
    with pytest.raises(BackendUnavailable) as err:
        get_ops("cuda", name)
    message = str(err.value)
    if importlib.util.find_spec(package) is None:
        assert f"needs the {package} package" in message and f"ninfer[{name}]" in message
    else:
        assert "implements no op" in message
    with pytest.raises(ValueError, match="does not run on device type 'cpu'"):
        get_ops("cpu", name)


def test_reference_runs_everywhere_and_auto_picks_it_on_cpu() -> None:
    assert get_ops("cpu").name == "reference"
    assert get_ops("cpu", "reference").name == "reference"
    with pytest.raises(ValueError, match="valid backends"):
        get_ops("cpu", "nonsense")


def test_kernel_backend_setting() -> None:
    assert load_settings([]).engine.kernel_backend == "auto"
    assert load_settings(["engine.kernel_backend=xformers"]).engine.kernel_backend == "xformers"
    with pytest.raises(ConfigError, match=r"engine\.kernel_backend"):
        load_settings(["engine.kernel_backend=cudnn"])
