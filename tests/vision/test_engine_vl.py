"""Images and video through the converted artifact and the engine path equal transformers
(`Qwen3_5(Moe)ForConditionalGeneration`): prefill logits, greedy generation, prefix reuse with media."""

from __future__ import annotations

import pytest
import torch

from ninfer.engine.multimodal import MediaEncoder
from ninfer.media.mrope_index import token_types
from ninfer.model.cache import KVPool, StatePool, make_batch
from tests.vision.vl_engine import (
    IDS,
    build_vl,
    generate,
    image,
    make_engine,
    mm_prompt,
    video,
    with_media,
)


class CountingTower(torch.nn.Module):
    """Wraps the tower and records the patches of every call."""

    def __init__(self, tower: torch.nn.Module) -> None:
        super().__init__()
        self.tower = tower
        self.calls: list[torch.Tensor] = []

    def forward(self, pixels: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        self.calls.append(pixels.clone())
        return self.tower(pixels, grid)

    def called_with(self, patches: torch.Tensor) -> int:
        return sum(1 for c in self.calls if c.shape == patches.shape and torch.equal(c, patches))


@pytest.fixture(scope="module", params=["dense", "moe"])
def vl(request, tmp_path_factory):
    return build_vl(request.param, tmp_path_factory.mktemp(request.param))


def _prompt(seed: int = 0):
    items = [image(64, 96, seed), video((2, 4, 4), seed), image(40, 40, seed + 1)]
    raw = [*with_media([5, 6, 7], [IDS.image_pad, IDS.video_pad, IDS.image_pad]), 8, 9]
    return mm_prompt(raw, items)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_prefill_logits_match_transformers(vl) -> None:
    p = _prompt()
    assert p.delta < 0 and len(p.spans) == 4  # two images + two video frames
    with torch.no_grad():
        ref = vl.hf(**p.hf_inputs()).logits[0]  # [T, V]
    cfg = vl.model.config
    tower = CountingTower(vl.tower)
    enc = MediaEncoder(tower, torch.device("cpu"))
    kv = KVPool.for_config(cfg, 8, torch.float32, "cpu")
    states = StatePool.for_config(cfg, 1, torch.float32, "cpu")
    states.zero_slot(0)
    mm = p.multimodal()
    hidden = []
    step = 7  # chunks split the media spans
    with torch.no_grad():
        for start in range(0, len(p.ids), step):
            chunk = p.ids[start : start + step]
            batch = make_batch([chunk], [start], [0], [list(range(8))])
            batch.embeds, batch.positions, _ = enc.chunk(vl.model, mm, batch.input_ids, start)
            hidden.append(vl.model(batch, kv, states)[0])
    got = vl.model.logits(torch.cat(hidden))
    assert _rel(got, ref) <= 1e-4
    assert len(tower.calls) == len(p.items)  # each item encoded once although chunks split it
    assert not enc._rows  # rows dropped once their last span was consumed


def test_greedy_generation_matches_transformers(vl) -> None:
    p = _prompt(1)
    with torch.no_grad():
        ref = vl.hf.generate(**p.hf_inputs(), max_new_tokens=10, do_sample=False, pad_token_id=0)
    engine = make_engine(vl, chunk=9)
    seen: list[torch.Tensor] = []  # every row of logits the engine sampled from
    real = engine.runner._logits
    engine.runner._logits = lambda h: seen.append(real(h)) or seen[-1]
    released = []
    try:
        out, stats = generate(engine, p, 10, release=lambda: released.append(1))
    finally:
        engine.shutdown()
    assert out == ref[0, len(p.ids) :].tolist()
    assert released == [1] and stats.vision_s > 0
    # the decode steps' logits (positions cache_len + i + rope_delta) equal transformers' forward
    n = len(p.ids)
    full = {**p.hf_inputs(), "input_ids": ref, "mm_token_type_ids": token_types(ref[0].tolist(), IDS)[None]}
    with torch.no_grad():
        want = vl.hf(**full).logits[0, n - 1 : n + 9]
    rows = torch.cat([t.reshape(-1, t.shape[-1]) for t in seen])  # one row per sampled position
    # the engine launches one round past the last sampled token (launch-ahead); its row is void
    assert rows.shape[0] == want.shape[0] + 1
    assert _rel(rows[: want.shape[0]], want) <= 1e-4


def test_prefix_reuse_with_media(vl) -> None:
    tower = CountingTower(vl.tower)
    a, b, c = image(64, 64, 11), image(48, 64, 12), image(64, 64, 13)
    assert a.grid_thw == c.grid_thw and a.digest != c.digest
    turn1_raw = with_media([5, 6], [IDS.image_pad])
    reused = make_engine(type(vl)(vl.hf, vl.model, tower))
    fresh = make_engine(vl, reuse=False)
    try:
        p1 = mm_prompt(turn1_raw, [a])
        out1, _ = generate(reused, p1, 6)
        assert out1 == generate(fresh, p1, 6)[0]
        # turn 2: the whole first turn, its answer, then text and a new image
        raw2 = turn1_raw + out1 + with_media([20, 21], [IDS.image_pad])
        p2 = mm_prompt(raw2, [a, b])
        tower.calls.clear()
        out2, st2 = generate(reused, p2, 6)
        span_a = p2.spans[0]
        assert st2.reuse_path == "append_frontier"
        # the whole first turn: its last sampled token went through the round launched after it
        assert st2.cached_tokens == len(p1.ids) + len(out1) >= span_a.start + span_a.length
        assert tower.called_with(a.patches) == 0 and tower.called_with(b.patches) == 1
        assert out2 == generate(fresh, p2, 6)[0]
        # turn 3: the earlier image changed -> the prefix ends before its span
        p3 = mm_prompt(raw2, [c, b])
        tower.calls.clear()
        out3, st3 = generate(reused, p3, 6)
        assert st3.cached_tokens <= p3.spans[0].start
        assert st3.reuse_path in ("full_reset", "restore_turn_checkpoint", "restore_response_checkpoint")
        assert tower.called_with(c.patches) == 1
        assert out3 == generate(fresh, p3, 6)[0]
    finally:
        reused.shutdown()
        fresh.shutdown()


def test_cancelled_request_releases_its_media(vl) -> None:
    from ninfer.engine.types import GenerationRequest, SamplingParams

    p = _prompt(2)
    engine = make_engine(vl, chunk=4)
    released: list[int] = []
    try:
        ticket = engine.reserve()
        req = GenerationRequest(
            "c",
            tuple(p.ids),
            SamplingParams(max_tokens=50, temperature=0.0),
            multimodal=p.multimodal(lambda: released.append(1)),
        )
        handle = engine.submit(ticket, req)
        handle.cancel()
        finishes = [s.finish_reason for s in handle if s.finish_reason is not None]
        ticket.release()
    finally:
        engine.shutdown()
    assert finishes in (["cancelled"], ["length"]) and released == [1]
    assert not engine.media._rows
