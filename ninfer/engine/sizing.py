"""KV pool sizing and the startup memory ledger (weights, KV, states, workspace, headroom)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ninfer.engine.config import EngineConfig
from ninfer.engine.pages import PAGE, pages_for
from ninfer.engine.types import EngineConfigError
from ninfer.model.cache import KVPool
from ninfer.model.config import TextConfig

GIB = 1 << 30
AUTO_HEADROOM = GIB  # kept free by `kv_capacity=auto`


def page_bytes(cfg: TextConfig, kv_dtype: torch.dtype) -> int:
    """Bytes of one 64-token page across every full-attention layer (K and V, plus int8 scales)."""
    return PAGE * KVPool.bytes_per_token(cfg, kv_dtype)


def slot_bytes(cfg: TextConfig, dtype: torch.dtype) -> int:
    """Bytes of one GDN state slot across every linear-attention layer (conv in dtype, ssm fp32)."""
    elem = torch.empty((), dtype=dtype).element_size()
    conv = cfg.conv_dim * (cfg.linear_conv_kernel_dim - 1) * elem
    ssm = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    return len(cfg.linear_layers) * (conv + ssm)


def mtp_kv_layers(config: EngineConfig) -> int:
    """KV layers the MTP drafter allocates beside the trunk's pool (the oracle drafter has none)."""
    return 1 if config.spec_method == "mtp" and config.spec_oracle_wrong_fraction is None else 0


def workspace_bytes(cfg: TextConfig, prefill_chunk: int, max_concurrency: int) -> int:
    """Planning estimate of transient activations: one prefill chunk's widest intermediates
    (FFN / GDN projections, fp32 upper bound) plus the float32 logits of a full decode batch."""
    width = max(
        cfg.hidden_size,
        cfg.intermediate_size or 0,
        (cfg.moe_intermediate_size or 0) * (cfg.num_experts_per_tok or 0),
        cfg.conv_dim + cfg.value_dim,
    )
    return prefill_chunk * width * 4 * 6 + max(max_concurrency, 1) * cfg.vocab_size * 4 * 2


@dataclass(frozen=True)
class SizingLedger:
    policy: str  # "explicit" | "auto" | "max_context"
    kv_capacity: int  # tokens (a whole number of pages)
    num_pages: int
    page_bytes: int
    kv_bytes: int
    state_slots: int
    state_bytes: int
    spec_snapshot_slots: int  # of state_slots: the lanes' per-draft-position verify slots (--spec: k each)
    mtp_page_bytes: int  # the MTP drafter's one-layer KV per page (0 without an MTP drafter)
    mtp_kv_bytes: int  # its pool: as many pages as the trunk's, indexed by the same page ids
    weights_bytes: int
    workspace_bytes: int
    headroom_bytes: int
    free_after_weights: int | None  # device bytes free after loading weights (GPU only)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def check_capacity(kv_capacity: int, max_context: int, max_concurrency: int) -> None:
    """The startup rejections of the contract, each one clear line."""
    pages = pages_for(kv_capacity)
    if kv_capacity < max_context:
        raise EngineConfigError(
            f"kv_capacity={kv_capacity} tokens is smaller than one sequence (max_context={max_context})"
        )
    if pages < max_concurrency:
        raise EngineConfigError(
            f"kv_capacity={kv_capacity} tokens gives {pages} pages, fewer than one page per lane "
            f"(max_concurrency={max_concurrency})"
        )
    most = max_concurrency * pages_for(max_context)
    if pages > most:
        raise EngineConfigError(
            f"kv_capacity={kv_capacity} tokens ({pages} pages) is larger than all lanes could use: "
            f"max_concurrency={max_concurrency} x max_context={max_context} = {most} pages"
        )


def resolve_kv(
    cfg: TextConfig,
    kv_capacity: int | str | None,
    max_context: int,
    max_concurrency: int,
    prefill_chunk: int,
    num_slots: int,
    dtype: torch.dtype,
    device: torch.device,
    weights_bytes: int,
    kv_dtype: torch.dtype | None = None,
    mtp_layers: int = 0,
    snapshot_slots: int = 0,
) -> SizingLedger:
    """Resolve `kv_capacity` (tokens, "auto", or None = max_context) and validate it.

    `dtype` is the model dtype (conv states, workspace); `kv_dtype` the KV storage (None = dtype).
    `mtp_layers` (1 with the MTP drafter) adds its KV pool's bytes to every page; `snapshot_slots`
    says how many of `num_slots` are speculative per-position slots (already counted in `num_slots`).
    """
    if max_context <= 0:
        raise EngineConfigError(f"max_context must be positive, got {max_context}")
    if not 1 <= max_concurrency <= 8:
        raise EngineConfigError(f"max_concurrency must be in 1..8, got {max_concurrency}")
    pb, sb = page_bytes(cfg, kv_dtype or dtype), slot_bytes(cfg, dtype)
    mtp_pb = PAGE * KVPool.bytes_per_token(cfg, kv_dtype or dtype, num_layers=mtp_layers) if mtp_layers else 0
    ws = workspace_bytes(cfg, prefill_chunk, max_concurrency)
    free: int | None = None
    headroom = 0
    if kv_capacity is None:
        policy, cap = "max_context", max_context
    elif kv_capacity == "auto":
        policy = "auto"
        largest = max_concurrency * pages_for(max_context)
        if device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(device)
            headroom = AUTO_HEADROOM
            budget = free - num_slots * sb - ws - headroom
            pages = min(largest, max(budget, 0) // (pb + mtp_pb))
            cap = pages * PAGE
            if cap < max_context:
                raise EngineConfigError(
                    f"kv_capacity=auto: {free / GIB:.2f} GiB free after weights leaves room for "
                    f"{cap} tokens, less than one sequence (max_context={max_context})"
                )
        else:
            cap = max_context  # no device memory to maximize into: one full-length sequence
    elif isinstance(kv_capacity, int) and not isinstance(kv_capacity, bool):
        policy, cap = "explicit", kv_capacity
    else:
        raise EngineConfigError(f"kv_capacity must be a token count, 'auto' or unset, got {kv_capacity!r}")
    check_capacity(cap, max_context, max_concurrency)
    pages = pages_for(cap)
    return SizingLedger(
        policy=policy,
        kv_capacity=pages * PAGE,
        num_pages=pages,
        page_bytes=pb,
        kv_bytes=pages * pb,
        state_slots=num_slots,
        state_bytes=num_slots * sb,
        spec_snapshot_slots=snapshot_slots,
        mtp_page_bytes=mtp_pb,
        mtp_kv_bytes=pages * mtp_pb,
        weights_bytes=weights_bytes,
        workspace_bytes=ws,
        headroom_bytes=headroom,
        free_after_weights=free,
    )
