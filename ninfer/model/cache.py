"""Caller-owned model state: paged KV pools, GDN state slots, and the per-call `ForwardBatch`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ninfer.model.config import PAGE_SIZE, TextConfig


def _need(name: str, value: int | None) -> int:
    if value is None:
        raise TypeError(f"missing required argument {name!r}")
    return int(value)


KV_DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "int8": torch.int8,
}


@dataclass(frozen=True)
class KVLayer:
    """One attention layer's pages: k, v [num_pages, page, nkv, hd]; int8 pools also carry the
    per-token per-head dequantisation scales k_scale, v_scale [num_pages, page, nkv] (fp32)."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None


class KVPool:
    """Paged K/V for the full-attention layers: k[a], v[a] are [num_pages, page_size, nkv, hd].

    dtype torch.int8 stores symmetric int8 K/V with fp32 scales k_scale[a], v_scale[a]
    [num_pages, page_size, nkv] (quantised on write, dequantised by attention); float dtypes
    have k_scale = v_scale = [].
    """

    def __init__(
        self,
        num_layers_attn: int,
        num_pages: int,
        page_size: int = PAGE_SIZE,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        nkv, hd = _need("num_kv_heads", num_kv_heads), _need("head_dim", head_dim)
        self.num_pages, self.page_size = int(num_pages), int(page_size)
        self.num_kv_heads, self.head_dim = nkv, hd
        self.dtype, self.device = dtype, torch.device(device)
        shape = (self.num_pages, self.page_size, nkv, hd)
        # zero-filled: masked-out keys of a gathered page must hold finite values
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers_attn)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers_attn)]
        scales = shape[:3] if dtype == torch.int8 else None
        self.k_scale = [torch.zeros(scales, device=device) for _ in range(num_layers_attn)] if scales else []
        self.v_scale = [torch.zeros(scales, device=device) for _ in range(num_layers_attn)] if scales else []

    @classmethod
    def for_config(
        cls,
        config: TextConfig,
        num_pages: int,
        dtype: torch.dtype,
        device: torch.device | str,
        num_layers: int | None = None,
        kv_dtype: str | None = None,
    ) -> KVPool:
        """A pool for the trunk's attention layers (or `num_layers`, e.g. 1 for the MTP head).

        kv_dtype: None = the model dtype `dtype`, else one of KV_DTYPES ("bf16", "fp16", "fp32", "int8").
        """
        n = len(config.attention_layers) if num_layers is None else num_layers
        store = dtype if kv_dtype is None else kv_storage_dtype(kv_dtype)
        return cls(n, num_pages, PAGE_SIZE, config.num_key_value_heads, config.head_dim, store, device)

    @staticmethod
    def bytes_per_token(config: TextConfig, kv_dtype: torch.dtype, num_layers: int | None = None) -> int:
        """Bytes of K and V (and int8 scales) one token takes over the attention layers."""
        n = len(config.attention_layers) if num_layers is None else num_layers
        per_head = config.head_dim * kv_dtype.itemsize + (4 if kv_dtype == torch.int8 else 0)
        return 2 * n * config.num_key_value_heads * per_head

    @property
    def num_layers(self) -> int:
        return len(self.k)

    @property
    def quantized(self) -> bool:
        return self.dtype == torch.int8

    def layer(self, a: int) -> KVLayer:
        """The a-th attention layer's pages (and scales for int8)."""
        if self.quantized:
            return KVLayer(self.k[a], self.v[a], self.k_scale[a], self.v_scale[a])
        return KVLayer(self.k[a], self.v[a])


def kv_storage_dtype(kv_dtype: str) -> torch.dtype:
    """ "bf16" | "fp16" | "fp32" | "int8" -> the pool's torch dtype."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"unknown kv_dtype {kv_dtype!r}; valid: {sorted(KV_DTYPES)}")
    return KV_DTYPES[kv_dtype]


class StatePool:
    """GDN state slots: conv[l] [num_slots, conv_dim, K-1] (model dtype), ssm[l] [num_slots, nv, dk, dv] fp32."""

    def __init__(
        self,
        num_layers_gdn: int,
        num_slots: int,
        conv_dim: int | None = None,
        kernel: int = 4,
        nv: int | None = None,
        dk: int | None = None,
        dv: int | None = None,
        conv_dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        c = _need("conv_dim", conv_dim)
        nv_, dk_, dv_ = _need("nv", nv), _need("dk", dk), _need("dv", dv)
        self.num_slots, self.kernel = int(num_slots), int(kernel)
        self.device = torch.device(device)
        self.conv = [
            torch.zeros(num_slots, c, kernel - 1, dtype=conv_dtype, device=device)
            for _ in range(num_layers_gdn)
        ]
        self.ssm = [
            torch.zeros(num_slots, nv_, dk_, dv_, dtype=torch.float32, device=device)
            for _ in range(num_layers_gdn)
        ]

    @classmethod
    def for_config(
        cls, config: TextConfig, num_slots: int, dtype: torch.dtype, device: torch.device | str
    ) -> StatePool:
        return cls(
            len(config.linear_layers),
            num_slots,
            config.conv_dim,
            config.linear_conv_kernel_dim,
            config.linear_num_value_heads,
            config.linear_key_head_dim,
            config.linear_value_head_dim,
            dtype,
            device,
        )

    @property
    def num_layers(self) -> int:
        return len(self.conv)

    def copy_slot(self, src: int, dst: int) -> None:
        """Duplicate one sequence's GDN state (e.g. a checkpoint or a fork)."""
        for conv, ssm in zip(self.conv, self.ssm, strict=True):
            conv[dst].copy_(conv[src])
            ssm[dst].copy_(ssm[src])

    def zero_slot(self, i: int) -> None:
        """Reset a slot to the state of an empty sequence (required before its first prefill)."""
        for conv, ssm in zip(self.conv, self.ssm, strict=True):
            conv[i].zero_()
            ssm[i].zero_()


@dataclass
class ForwardBatch:
    """B sequences with q new tokens each, and where their state lives."""

    input_ids: torch.Tensor  # [B, q] int64
    positions: torch.Tensor  # [3, B, q] int64 (T/H/W MRoPE streams; equal for text)
    slots: torch.Tensor  # [B] int64, GDN state slot of each sequence (read, then overwritten)
    page_table: torch.Tensor  # [B, max_pages] int32, KV pages of each sequence in order
    cache_lens: torch.Tensor  # [B] int64, tokens already in the KV cache before this call
    # host-side bound on cache_lens + q (the scheduler knows it without a device sync); lets
    # attention skip unused pages. None = attend over the whole page table width (static shapes).
    max_kv_len: int | None = None
    # [B, q] int64 or None. Given: the GDN state (conv window and recurrent state) after token t
    # is written to slot write_slots[b, t] (< 0: not stored) and `slots` is only read (speculative
    # verification: continue later from the slot of the last accepted token). None: the state
    # after the last token overwrites `slots`. A row whose `slots` entry is < 0 is padding.
    write_slots: torch.Tensor | None = None
    # [B, q, H] or None. Given (a multimodal prefill chunk): the input embeddings, vision rows
    # already scattered over their placeholder tokens; `input_ids` are then not embedded.
    embeds: torch.Tensor | None = None

    def validate(self) -> None:
        b, q = self.input_ids.shape
        if tuple(self.positions.shape) != (3, b, q):
            raise ValueError(f"positions must be [3, {b}, {q}], got {tuple(self.positions.shape)}")
        if tuple(self.slots.shape) != (b,) or tuple(self.cache_lens.shape) != (b,):
            raise ValueError("slots and cache_lens must be [B]")
        if self.page_table.dim() != 2 or self.page_table.shape[0] != b:
            raise ValueError(f"page_table must be [B, max_pages], got {tuple(self.page_table.shape)}")
        if self.write_slots is not None and tuple(self.write_slots.shape) != (b, q):
            raise ValueError(f"write_slots must be [B, q] = {(b, q)}, got {tuple(self.write_slots.shape)}")
        if self.embeds is not None and tuple(self.embeds.shape[:2]) != (b, q):
            raise ValueError(f"embeds must be [B, q, H] with B, q = {(b, q)}, got {tuple(self.embeds.shape)}")

    def gdn_write_slots(self) -> torch.Tensor:
        """[B, q] slot receiving the GDN state after each token: `write_slots`, or -1 except the last
        column = `slots` (device ops only, no sync)."""
        if self.write_slots is not None:
            return self.write_slots
        b, q = self.input_ids.shape
        writes = torch.full((b, q), -1, dtype=self.slots.dtype, device=self.slots.device)
        writes[:, -1] = self.slots
        return writes


def make_batch(
    tokens: Sequence[Sequence[int]] | torch.Tensor,
    cache_lens: Sequence[int],
    slots: Sequence[int],
    page_tables: Sequence[Sequence[int]],
    max_pages: int | None = None,
    device: torch.device | str = "cpu",
    positions: torch.Tensor | None = None,
    write_slots: Sequence[Sequence[int]] | None = None,
) -> ForwardBatch:
    """Build a text `ForwardBatch` (all position streams = cache_len + i) from Python lists.

    Every row of `tokens` must have the same length q; `write_slots` (B rows of q slots) asks for
    per-token GDN state writes (see `ForwardBatch.write_slots`). Page tables are right-padded with -1 to
    `max_pages` (default: the longest). Raises if a sequence's pages cannot hold cache_len + q.
    """
    ids = torch.as_tensor(tokens, dtype=torch.int64, device=device)
    if ids.dim() != 2:
        raise ValueError("tokens must be B rows of q token ids each")
    b, q = ids.shape
    if not (len(cache_lens) == len(slots) == len(page_tables) == b):
        raise ValueError("tokens, cache_lens, slots and page_tables need one entry per sequence")
    width = max_pages if max_pages is not None else max(len(p) for p in page_tables)
    table = torch.full((b, max(width, 1)), -1, dtype=torch.int32)
    for i, (pages, n) in enumerate(zip(page_tables, cache_lens, strict=True)):
        if len(pages) > width:
            raise ValueError(f"sequence {i} has {len(pages)} pages, more than max_pages={width}")
        if len(pages) * PAGE_SIZE < n + q:
            raise ValueError(f"sequence {i} needs {-(-(n + q) // PAGE_SIZE)} pages, has {len(pages)}")
        table[i, : len(pages)] = torch.as_tensor(list(pages), dtype=torch.int32)
    lens = torch.as_tensor(list(cache_lens), dtype=torch.int64, device=device)
    if positions is None:
        pos = lens[:, None] + torch.arange(q, device=device)
        positions = pos.unsqueeze(0).expand(3, b, q).contiguous()
    batch = ForwardBatch(
        input_ids=ids,
        positions=positions.to(device=device, dtype=torch.int64),
        slots=torch.as_tensor(list(slots), dtype=torch.int64, device=device),
        page_table=table.to(device),
        cache_lens=lens,
        max_kv_len=max(cache_lens) + q,
        write_slots=None
        if write_slots is None
        else torch.as_tensor(write_slots, dtype=torch.int64, device=device).reshape(b, q),
    )
    batch.validate()
    return batch
