"""ops/bench/quant_error.py on tiny models on the CPU: the bf16 profile is the reference itself
(zero KL, full agreement), and a coarser format errs more than a finer one on the same weights."""

from __future__ import annotations

import pytest

from ninfer.model.config import TextConfig
from ops.bench.quant_error import measure
from ops.bench.shapes import SMOKE_SHAPES


@pytest.mark.parametrize("shape", sorted(SMOKE_SHAPES))
def test_quant_error_orders_the_formats(shape: str) -> None:
    cfg = TextConfig.from_hf(SMOKE_SHAPES[shape])
    res = measure(cfg, shape, ["bf16", "q8_g32", "q4_g64"], device="cpu", prompts=2, tokens=80)
    assert res["bf16_noise"]["kl_max"] >= 0.0
    same, q8, q4 = (res["profiles"][p] for p in ("bf16", "q8_g32", "q4_g64"))
    assert same == {"top1_agree": 1.0, "kl_mean": 0.0, "kl_max": 0.0}
    assert 0.0 < q8["kl_mean"] < q4["kl_mean"]
    assert q8["top1_agree"] >= q4["top1_agree"]
