"""The `lm_head_draft` component: lm_head rows of the N most frequent token ids, a cheap proposal head.

Stored as `weights/lm_head_draft.safetensors` with `token_ids` [N] int64 (ascending, unique) and
`weight` [N, H] (those rows of `lm_head.weight`, same dtype). Frequencies come from a token
frequency file or from a text corpus tokenized with the artifact's tokenizer; the model's stop ids
and the tokenizer's special tokens are always included. Used only for drafting: verification
always runs the full head, so outputs do not depend on the choice of ids.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ninfer.artifact import quant_store
from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.files import digest_tree
from ninfer.artifact.manifest import read_manifest

if TYPE_CHECKING:
    import torch

    from ninfer.formats import QuantWeight

COMPONENT = "lm_head_draft"


def read_frequencies(path: str | Path) -> Counter[int]:
    """A token frequency file: JSON (`{"id": count}` or `[[id, count], ...]`) or `ID COUNT` lines."""
    p = Path(path)
    if not p.is_file():
        raise ArtifactError(f"frequency file {p} does not exist")
    text = p.read_text(encoding="utf-8")
    out: Counter[int] = Counter()
    try:
        if text.lstrip().startswith(("{", "[")):
            data = json.loads(text)
            pairs = data.items() if isinstance(data, dict) else data
            for tid, count in pairs:
                out[int(tid)] += int(count)
        else:
            for line in text.splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    tid, count = line.split()
                    out[int(tid)] += int(count)
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{p}: not a token frequency file ({exc})") from None
    return out


def corpus_frequencies(path: str | Path, tokenizer_json: str | Path) -> Counter[int]:
    """Token counts of a UTF-8 text corpus, tokenized paragraph by paragraph."""
    from ninfer.text.tokenizer import Tokenizer

    p = Path(path)
    if not p.is_file():
        raise ArtifactError(f"corpus {p} does not exist")
    tok = Tokenizer.from_file(tokenizer_json)
    out: Counter[int] = Counter()
    blocks = [b for b in p.read_text(encoding="utf-8").split("\n\n") if b]
    for ids in tok.encode_batch(blocks):
        out.update(ids)
    return out


def select_ids(freq: Mapping[int, int], size: int, vocab_size: int, always: Iterable[int] = ()) -> list[int]:
    """`size` ids: `always` first, then by descending count (ties: lower id), then the lowest unused
    ids if the counts name too few. Returned ascending."""
    if not 0 < size <= vocab_size:
        raise ArtifactError(f"--lm-head-draft-size must be in 1..{vocab_size}, got {size}")
    bad = sorted(t for t in freq if not 0 <= t < vocab_size)
    if bad:
        raise ArtifactError(f"token id {bad[0]} is outside the model vocabulary [0, {vocab_size})")
    chosen = dict.fromkeys(t for t in always if 0 <= t < vocab_size)
    if len(chosen) > size:
        raise ArtifactError(f"--lm-head-draft-size {size} is smaller than the {len(chosen)} stop/special ids")
    for t, _ in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(chosen) >= size:
            break
        chosen.setdefault(t)
    fill = 0
    while len(chosen) < size:
        chosen.setdefault(fill)
        fill += 1
    return sorted(chosen)


def draft_tensors(
    lm_head: torch.Tensor | QuantWeight, token_ids: list[int]
) -> dict[str, torch.Tensor | QuantWeight]:
    """lm_head: [V, H] -> {"token_ids": [N] int64, "weight": [N, H]} (rows copied, format kept: a
    groupwise head's rows stay in their codes and scales; an fp8 head's rows, whose 128-row blocks
    the selection breaks, are dequantized to bf16)."""
    import torch

    from ninfer.formats import QuantWeight

    ids = torch.tensor(token_ids, dtype=torch.int64)
    if isinstance(lm_head, QuantWeight):
        if lm_head.fmt.kind == "groupwise":
            return {"token_ids": ids, "weight": lm_head.select_rows(ids)}
        return {"token_ids": ids, "weight": lm_head.dequantize_rows(ids, torch.bfloat16)}
    return {"token_ids": ids, "weight": lm_head.index_select(0, ids).contiguous()}


def sorted_draft(tensors: Mapping[str, torch.Tensor | QuantWeight]) -> dict[str, torch.Tensor | QuantWeight]:
    """A proposal head whose ids come in another order (a seed file's, by frequency) -> this
    component's form: ids int64 ascending, the rows in that order (format kept, as `draft_tensors`)."""
    import torch

    ids = tensors["token_ids"]
    assert isinstance(ids, torch.Tensor)
    order = ids.to(torch.int64).argsort()
    out = draft_tensors(tensors["weight"], order.tolist())
    out["token_ids"] = ids.to(torch.int64)[order]
    return out


def add_lm_head_draft(
    artifact_path: str | Path,
    size: int,
    *,
    corpus: str | Path | None = None,
    frequencies: str | Path | None = None,
) -> Path:
    """Add (or replace) the `lm_head_draft` component of an artifact and re-digest its manifest."""
    from ninfer.artifact.opener import open_artifact
    from ninfer.artifact.writer import SHARD_BYTES, ComponentWriter

    if (corpus is None) == (frequencies is None):
        raise ArtifactError("give exactly one of a corpus or a token frequency file")
    art = open_artifact(artifact_path)
    cfg = art.config
    freq = read_frequencies(frequencies) if frequencies is not None else Counter()
    if corpus is not None:
        freq = corpus_frequencies(corpus, art.tokenizer_path)
    always = [*cfg.eos_token_ids, *_special_ids(art.tokenizer_path)]
    ids = select_ids(freq, size, cfg.vocab_size, always)
    lm_head = art.load_tensors("text")["lm_head.weight"]
    root = art.path
    old = art.manifest.components.get(COMPONENT)
    if old is not None:
        for rel in old.files:
            (root / rel).unlink()
    from ninfer.formats import QuantWeight

    writer = ComponentWriter(root, COMPONENT, SHARD_BYTES)
    for name, t in draft_tensors(lm_head, ids).items():
        writer.add_quantized(name, t) if isinstance(t, QuantWeight) else writer.add(name, t)
    component = writer.finish()
    manifest = read_manifest(root)
    components = {**manifest.components, COMPONENT: component}
    extra = quant_store.with_component(manifest.extra, COMPONENT, writer.quantized, art.weight_profile)
    dataclasses.replace(manifest, components=components, digests=digest_tree(root), extra=extra).write(root)
    return root


def _special_ids(tokenizer_json: Path) -> list[int]:
    from ninfer.text.tokenizer import Tokenizer

    return sorted(Tokenizer.from_file(tokenizer_json).special_token_ids)
