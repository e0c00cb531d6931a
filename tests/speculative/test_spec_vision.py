"""Speculation with image/video prompts: verification, drafting and the MTP's prompt rows use the
trunk's 3-axis rotary positions and the decode rope_delta; greedy outputs equal spec off."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ninfer.artifact.shapes import mtp_shapes
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.model.weights import load_mtp
from tests.vision.vl_engine import IDS, build_vl, generate, image, mm_prompt, with_media


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    vl = build_vl("dense", tmp_path_factory.mktemp("vl"))
    cfg = dataclasses.replace(vl.model.config, mtp_num_hidden_layers=1)
    g = torch.Generator().manual_seed(3)
    shapes = mtp_shapes(cfg)
    load_mtp(cfg, {n: 0.3 * torch.randn(s, generator=g) for n, s in shapes.items()}, vl.model)
    return vl


def _engine(vl, **kw) -> Engine:
    cfg = EngineConfig(max_concurrency=1, max_pending=4, prefill_chunk=16, max_context=512, **kw)
    return Engine(vl.model, cfg, vision=vl.tower).start()


@pytest.mark.parametrize(
    "spec", [{"draft_tokens": 3}, {"draft_tokens": 4, "spec_oracle_wrong_fraction": 0.0}]
)
def test_media_prompt_greedy_equals_spec_off(vl, spec) -> None:
    items = [image(96, 96, i) for i in range(3)]
    raw = [*with_media([5, 6, 7], [IDS.image_pad] * 3), 8, 9]
    p = mm_prompt(raw, items)
    assert p.delta <= -16  # decode positions are shifted enough that dropping the shift changes tokens
    off, on = _engine(vl), _engine(vl, spec_method="mtp", **spec)
    try:
        want, _ = generate(off, p, 14)
        got, st = generate(on, p, 14)
        assert got == want
        assert st.speculative["rounds"] > 0
        if "spec_oracle_wrong_fraction" in spec:
            assert st.speculative["accepted_tokens"] >= 8
        # the next turn reuses the lane (append_frontier) and still matches
        p2 = mm_prompt([*raw, *got, 11, 12], items)
        want2, _ = generate(off, p2, 8)
        got2, st2 = generate(on, p2, 8)
        assert got2 == want2 and st2.reuse_path == "append_frontier"
    finally:
        off.shutdown()
        on.shutdown()
