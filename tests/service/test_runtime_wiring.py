"""The service's composition root hands each settings group's values to the part that enforces them."""

from __future__ import annotations

from ninfer.config.loader import load_settings
from ninfer.service.options import from_settings
from ninfer.service.runtime import ServiceRuntime
from ninfer.service.telemetry import Tracing


def test_response_store_is_sized_from_settings(tmp_path) -> None:
    settings = load_settings(["server.response_store_max_records=3", "server.response_store_max_mib=5"])
    options = from_settings(settings)
    runtime = ServiceRuntime(
        settings, options, "test", [], tracing=Tracing.from_config("none", None, "ninfer", "test")
    )
    store = runtime.ctx.response_store
    assert store is not None
    assert (store.max_records, store.max_bytes) == (3, 5 * 1024 * 1024)
