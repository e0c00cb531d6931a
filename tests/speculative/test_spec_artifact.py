"""The converted-artifact path: a transformers-written checkpoint with MTP weights, converted, given a
proposal head, loaded as `--spec mtp [--lm-head-draft]` would load it; outputs equal spec off."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ninfer.artifact import open_artifact
from ninfer.artifact.convert import convert
from ninfer.artifact.lm_head_draft import add_lm_head_draft
from ninfer.bootstrap import load_spec_weights, spec_fields
from ninfer.engine.types import EngineConfigError
from ninfer.model.weights import load_model
from tests.speculative.helpers import engine, prompt, request, run_batch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from hf_fixtures import make_hf_checkpoint


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("spec-art")
    hf = make_hf_checkpoint(root / "hf", "dense", with_mtp=True, seed=3)
    out = convert(hf, root / "tiny.ninfer")
    freq = root / "freq.txt"
    freq.write_text("".join(f"{t} {t % 17}\n" for t in range(512)))
    add_lm_head_draft(out, 200, frequencies=freq)
    return open_artifact(out)


def _spec(method, k=None, head=False):
    return SimpleNamespace(method=method, draft_tokens=k, lm_head_draft=head)


def _load(artifact, spec):
    model = load_model(artifact.config, artifact.load_tensors("text"), torch.float32, "cpu")
    return model, load_spec_weights(spec, artifact, model, torch.float32, "cpu").draft_head


def test_without_spec_no_mtp_weights_are_loaded(artifact) -> None:
    model, head = _load(artifact, _spec(None))
    assert model.mtp is None and head is None
    assert spec_fields(_spec(None)) == {}
    with pytest.raises(EngineConfigError, match="carries no DFlash drafter"):
        _load(artifact, _spec("dflash", 15))


@pytest.mark.parametrize(("k", "head"), [(3, True), (5, False)])
def test_converted_artifact_greedy_equals_spec_off_with_reuse(artifact, k: int, head: bool) -> None:
    plain, _ = _load(artifact, _spec(None))
    spec_model, draft = _load(artifact, _spec("mtp", k, head))
    fields = spec_fields(_spec("mtp", k, head))
    assert fields == {"spec_method": "mtp", "draft_tokens": k, "lm_head_draft": head}
    assert (draft is not None) == head and spec_model.mtp is not None
    ref = engine(plain, no_prefix_reuse=True)
    eng = engine(spec_model, draft, **fields)
    try:
        first = [request(prompt(30 + 9 * i, i), max_tokens=20) for i in range(8)]
        want = run_batch(ref, first)
        got = run_batch(eng, first)
        assert [t for t, _, _ in got] == [t for t, _, _ in want]
        # the next turn of every conversation: a cache hit on the spec engine, a miss on the reference
        second = [
            request((*r.prompt_ids, *t, *prompt(6, 50 + i)), max_tokens=20)
            for i, (r, (t, _, _)) in enumerate(zip(first, got, strict=True))
        ]
        want2 = run_batch(ref, second)
        got2 = run_batch(eng, second)
        assert [t for t, _, _ in got2] == [t for t, _, _ in want2]
        assert all(st.reuse_path == "append_frontier" for _, st, _ in got2)
        assert all(st.speculative["rounds"] > 0 for _, st, _ in got2)
    finally:
        ref.shutdown(5)
        eng.shutdown(5)
