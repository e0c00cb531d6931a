"""The `lm_head_draft` component: id selection, rows of lm_head, manifest and digests, CLI."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from hf_fixtures import make_hf_checkpoint, read_hf_tensors

from ninfer.artifact import ArtifactError, open_artifact
from ninfer.artifact.cli import main as artifact_main
from ninfer.artifact.convert import convert
from ninfer.artifact.lm_head_draft import (
    add_lm_head_draft,
    corpus_frequencies,
    read_frequencies,
    select_ids,
)
from ninfer.engine.speculative.draft_head import DraftHead


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hf_checkpoint(tmp_path_factory.mktemp("hf") / "tiny", "dense", with_mtp=True)


def test_select_ids_orders_by_count_and_keeps_stop_ids() -> None:
    freq = Counter({5: 10, 9: 10, 3: 50, 7: 1})
    assert select_ids(freq, 3, 16) == [3, 5, 9]  # ties broken by the lower id
    assert select_ids(freq, 3, 16, always=[15]) == [3, 5, 15]
    assert select_ids(freq, 6, 16) == [0, 1, 3, 5, 7, 9]  # too few counted ids: lowest unused ids fill
    with pytest.raises(ArtifactError, match="outside the model vocabulary"):
        select_ids(Counter({20: 1}), 2, 16)
    with pytest.raises(ArtifactError, match="smaller than"):
        select_ids(freq, 1, 16, always=[1, 2])


def test_frequency_file_formats(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps({"4": 2, "7": 9}))
    (tmp_path / "b.txt").write_text("# id count\n4 2\n7 9\n4 1\n")
    assert read_frequencies(tmp_path / "a.json") == Counter({4: 2, 7: 9})
    assert read_frequencies(tmp_path / "b.txt") == Counter({4: 3, 7: 9})
    (tmp_path / "bad.txt").write_text("4 two\n")
    with pytest.raises(ArtifactError, match="not a token frequency file"):
        read_frequencies(tmp_path / "bad.txt")


def test_corpus_counts_match_the_reference_tokenizer(tmp_path: Path) -> None:
    from tests.unit.conftest_text import reference

    corpus = tmp_path / "c.txt"
    paragraphs = ["Speculative decoding drafts tokens.", "Verification keeps the target exact, 123 times!"]
    corpus.write_text("\n\n".join(paragraphs), encoding="utf-8")
    from ninfer.text.builder import cached_tokenizer_json

    want: Counter[int] = Counter()
    ref = reference()
    for p in paragraphs:
        want.update(ref.encode(p))
    assert corpus_frequencies(corpus, cached_tokenizer_json()) == want


def test_add_component_rows_manifest_and_digests(tmp_path: Path, hf_dir: Path) -> None:
    out = convert(hf_dir, tmp_path / "a.ninfer")
    freq = tmp_path / "freq.txt"
    freq.write_text("".join(f"{t} {100 - t}\n" for t in range(40, 60)))
    assert artifact_main(["lm-head-draft", str(out), "--frequencies", str(freq), "--size", "16"]) == 0
    art = open_artifact(out, verify=True)
    comp = art.manifest.components["lm_head_draft"]
    assert comp.files == ("weights/lm_head_draft.safetensors",)
    t = art.load_tensors("lm_head_draft")
    ids = t["token_ids"].tolist()
    eos = list(art.config.eos_token_ids)
    stops_in_vocab = [e for e in eos if e < art.config.vocab_size]
    expected = sorted({*stops_in_vocab, *range(40, 40 + 16 - len(stops_in_vocab))})
    assert ids == expected and t["token_ids"].dtype == torch.int64
    lm_head = read_hf_tensors(hf_dir)["lm_head.weight"]
    assert torch.equal(t["weight"], lm_head[t["token_ids"]])
    # replacing the component keeps the artifact consistent
    add_lm_head_draft(out, 8, frequencies=freq)
    art = open_artifact(out, verify=True)
    assert art.load_tensors("lm_head_draft")["token_ids"].numel() == 8


def test_draft_head_maps_reduced_logits_to_full_ids() -> None:
    g = torch.Generator().manual_seed(0)
    lm_head = torch.randn(12, 4, generator=g)
    ids = torch.tensor([1, 4, 7, 11])
    head = DraftHead(ids, lm_head[ids], vocab_size=12)
    h = torch.randn(3, 4, generator=g)
    full = h @ lm_head.T
    got = head.logits(h)
    torch.testing.assert_close(got[:, ids], full[:, ids])
    mask = torch.ones(12, dtype=torch.bool)
    mask[ids] = False
    assert torch.isinf(got[:, mask]).all()
