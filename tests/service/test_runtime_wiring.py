"""The service's composition root hands each settings group's values to the part that enforces them."""

from __future__ import annotations

import pytest
from falcon import testing

from ninfer.api.context import ServedModel
from ninfer.api.pipeline import Pipeline
from ninfer.config.loader import load_settings
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.types import EngineError, GenerationRequest, SamplingParams
from ninfer.service.app import create_app
from ninfer.service.runtime import ServiceRuntime
from ninfer.service.telemetry import Tracing
from tests.engine.tiny import tiny_model


def test_response_store_is_sized_from_settings(tmp_path) -> None:
    settings = load_settings(["server.response_store_max_records=3", "server.response_store_max_mib=5"])
    runtime = ServiceRuntime(
        settings, "test", [], tracing=Tracing.from_config("none", None, "ninfer", "test")
    )
    store = runtime.ctx.response_store
    assert store is not None
    assert (store.max_records, store.max_bytes) == (3, 5 * 1024 * 1024)


def test_health_reports_an_engine_thread_failure_and_requests_fail_at_once() -> None:
    settings = load_settings([])
    runtime = ServiceRuntime(
        settings,
        "test",
        [],
        tracing=Tracing.from_config("none", None, "ninfer", "test"),
    )
    config = EngineConfig(max_concurrency=1, max_pending=1, max_context=256, prefill_chunk=64)
    engine = Engine(tiny_model(512), config)

    def broken_capture() -> None:  # a runner failure outside a step kills the engine thread
        raise RuntimeError("capture failed")

    engine.runner.capture_graphs = broken_capture
    runtime.engine, runtime.ready = engine, True

    class OptionsOnly:  # the options check runs before the ticket; prepare is never reached
        def check_options(self, controls: object) -> None:
            return None

    pipeline = Pipeline(
        engine,
        OptionsOnly(),  # type: ignore[arg-type]
        runtime.recorder,
        runtime.next_request_id,
    )
    runtime.ctx.serve(ServedModel("m", 256), pipeline)
    client = testing.TestClient(
        create_app(runtime.ctx, runtime.health, api_key=None, cors=False, max_request_bytes=1 << 20)
    )
    ok = client.simulate_get("/health")
    assert (ok.status_code, ok.json) == (200, {"status": "ok", "late_compiles": 0, "late_kernels": {}})
    handle = engine.submit(engine.reserve(), GenerationRequest("r", (1, 2, 3), SamplingParams(max_tokens=2)))
    engine.start()
    with pytest.raises(EngineError, match="capture failed"):
        handle.result(30)
    handle.close()
    health = client.simulate_get("/health")
    assert health.status_code == 503
    assert health.json == {"status": "error", "message": "RuntimeError: capture failed"}
    chat = client.simulate_post(
        "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert chat.status_code == 500 and "capture failed" in chat.json["error"]["message"]
    assert engine.tickets.live == 0
    engine.shutdown(1)
