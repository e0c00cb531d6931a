"""The vision group's media acquisition keys: defaults, overrides and their ranges."""

from __future__ import annotations

import pytest

from ninfer.config import ConfigError
from ninfer.config.loader import load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("NINFER_"):
            monkeypatch.delenv(name)


def test_defaults_refuse_private_media_urls() -> None:
    v = load_settings([]).vision
    assert v.allow_private_media_urls is False
    assert (v.media_max_fetch_mib, v.media_fetch_timeout_s) == (64, 30.0)


def test_overrides_and_env() -> None:
    v = load_settings(["vision.allow_private_media_urls=true", "vision.media_max_fetch_mib=8"]).vision
    assert v.allow_private_media_urls is True and v.media_max_fetch_mib == 8


def test_env_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NINFER_VISION_ALLOW_PRIVATE_MEDIA_URLS", "true")
    assert load_settings([]).vision.allow_private_media_urls is True


@pytest.mark.parametrize("bad", ["vision.media_max_fetch_mib=0", "vision.media_fetch_timeout_s=0"])
def test_ranges(bad: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings([bad])
    assert str(err.value).startswith(bad + ":")
