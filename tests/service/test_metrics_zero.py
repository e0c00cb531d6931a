"""Every `/metrics` series exists from the first scrape, at zero, as vLLM exports them: the
latency histograms, the token counters and the finish-reason and reuse-path counters, under the
loading placeholder's empty model name first and under the model's name once it is known."""

from __future__ import annotations

from typing import get_args

from prometheus_client.parser import text_string_to_metric_families

from ninfer.engine.types import RequestStats, ReusePath
from ninfer.service.metrics import COUNTERS, FINISH_REASONS, HISTOGRAMS, ServiceMetrics


def samples(metrics: ServiceMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value of one scrape."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def expected(model: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The fixed series of `model` at zero (a histogram's +Inf bucket, count and sum stand for it)."""
    label = (("model_name", model),)
    out = {}
    for name, alias, _, _ in HISTOGRAMS:
        for n in (name, alias):
            out[(f"{n}_count", label)] = 0.0
            out[(f"{n}_sum", label)] = 0.0
            out[(f"{n}_bucket", (("le", "+Inf"), *label))] = 0.0
    for name, alias, _ in COUNTERS:
        for n in (name, alias):
            out[(f"{n}_total", label)] = 0.0
    for n in ("ninfer_request_success_total", "vllm:request_success_total"):
        for reason in FINISH_REASONS:
            out[(n, (("finished_reason", reason), *label))] = 0.0
    for path in get_args(ReusePath):
        out[("ninfer_prefix_reuse_path_total", (("model_name", model), ("path", path)))] = 0.0
    return out


def test_every_series_exists_at_zero_from_the_first_scrape() -> None:
    name: list[str | None] = [None]  # loading: the model's name is not known yet
    metrics = ServiceMetrics(lambda: name[0], lambda: None)
    first = samples(metrics)
    assert expected("").items() <= first.items()
    for key in ("vllm:time_to_first_token_seconds_count", "vllm:prompt_tokens_total",
                "vllm:generation_tokens_total"):  # fmt: skip
        assert (key, (("model_name", ""),)) in first, key

    name[0] = "ninfer-demo"
    ready = samples(metrics)
    assert expected("ninfer-demo").items() <= ready.items()
    fixed = {n for n, _ in expected("")}
    assert not [k for k in ready if k[0] in fixed and ("model_name", "") in k[1]]  # the placeholder went

    stats = RequestStats(prompt_tokens=7, cached_tokens=3, reuse_path="append_frontier")
    metrics.observe_done("stop", 5, {"ttft": 0.2, "decode": 0.4, "total": 0.7, "queue": 0.01}, stats)
    after = samples(metrics)
    label = (("model_name", "ninfer-demo"),)
    assert after[("vllm:prompt_tokens_total", label)] == 7.0
    assert after[("vllm:generation_tokens_total", label)] == 5.0
    assert after[("vllm:time_to_first_token_seconds_count", label)] == 1.0
    assert after[("vllm:request_success_total", (("finished_reason", "stop"), *label))] == 1.0
    assert after[("vllm:request_success_total", (("finished_reason", "length"), *label))] == 0.0
    assert after[("ninfer_prefix_reuse_path_total", (*label, ("path", "append_frontier")))] == 1.0
