"""The DFlash block drafter: a small Qwen3-style stack conditioned on target features."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from ninfer.formats import QuantWeight

FULL_ATTENTION, SLIDING_ATTENTION = "full_attention", "sliding_attention"


def default_target_layers(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """One draft layer: the middle target layer; else evenly spaced over 1..num_target_layers-3."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))


@dataclass(frozen=True)
class DFlashConfig:
    """The drafter's shapes and its `dflash_config` block (the HF config.json of the drafter)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int = 16
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    is_causal: bool | None = None
    attention_bias: bool = False
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None

    @classmethod
    def from_hf(cls, d: Mapping[str, Any]) -> DFlashConfig:
        arch = d.get("architectures") or ["DFlashDraftModel"]
        if arch != ["DFlashDraftModel"]:
            raise ValueError(
                f"DFlash drafter: unsupported architectures {arch} (this build runs DFlashDraftModel)"
            )
        extra = d.get("dflash_config") or {}

        def value(name: str, default: Any = None) -> Any:
            return extra.get(name, d.get(name, default))

        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"DFlash drafter: rope type {rope.get('rope_type')!r} is not supported")
        n = int(d["num_hidden_layers"])
        ids = value("target_layer_ids")
        mask = value("mask_token_id")
        if mask is None:
            raise ValueError("DFlash drafter: the config has no mask_token_id")
        softcap = value("final_logit_softcapping")
        heads = int(d["num_attention_heads"])
        return cls(
            hidden_size=int(d["hidden_size"]),
            num_hidden_layers=n,
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or d["hidden_size"] // heads),
            intermediate_size=int(d["intermediate_size"]),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10000.0))),
            target_layer_ids=tuple(int(i) for i in ids)
            if ids is not None
            else default_target_layers(int(d["num_target_layers"]), n),
            mask_token_id=int(mask),
            block_size=int(value("block_size", 16)),
            layer_types=tuple(d.get("layer_types") or (FULL_ATTENTION,) * n),
            # as Qwen3Config: the window applies only with use_sliding_window (sliding layers stay causal)
            sliding_window=d.get("sliding_window") if d.get("use_sliding_window") else None,
            is_causal=d.get("is_causal"),
            attention_bias=bool(d.get("attention_bias", False)),
            input_embedding_scale=float(value("input_embedding_scale", 1.0)),
            output_multiplier=float(value("output_multiplier", 1.0)),
            final_logit_softcapping=float(softcap) if softcap else None,
        )

    def to_hf(self) -> dict[str, Any]:
        """This config as a drafter checkpoint's config.json (`from_hf` reads it back equal)."""
        d: dict[str, Any] = {
            "architectures": ["DFlashDraftModel"],
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "layer_types": list(self.layer_types),
            "use_sliding_window": self.sliding_window is not None,
            "sliding_window": self.sliding_window,
            "attention_bias": self.attention_bias,
            "dflash_config": {
                "block_size": self.block_size,
                "target_layer_ids": list(self.target_layer_ids),
                "mask_token_id": self.mask_token_id,
                "input_embedding_scale": self.input_embedding_scale,
                "output_multiplier": self.output_multiplier,
                "final_logit_softcapping": self.final_logit_softcapping,
            },
        }
        if self.is_causal is not None:
            d["is_causal"] = self.is_causal
        return d


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm: weight * x / rms(x), normalised in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim]
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE over the whole head. x: [..., T, heads, D], positions: [..., T]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.int64).float() / d)  # [D/2]
    freqs = positions.float()[..., None] * inv  # [..., T, D/2]
    emb = torch.cat([freqs, freqs], -1)[..., None, :]  # [..., T, 1, D]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class DFlashLayer(nn.Module):
    """RMSNorm -> attention (Q from the block; K/V from context + block) -> RMSNorm -> SwiGLU."""

    def __init__(self, cfg: DFlashConfig, index: int) -> None:
        super().__init__()
        h, nh, nkv, hd, bias = (
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.attention_bias,
        )  # fmt: skip
        self.cfg = cfg
        self.q_proj = nn.Linear(h, nh * hd, bias=bias)
        self.k_proj = nn.Linear(h, nkv * hd, bias=bias)
        self.v_proj = nn.Linear(h, nkv * hd, bias=bias)
        self.o_proj = nn.Linear(nh * hd, h, bias=bias)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        kind = cfg.layer_types[index]
        self.causal = kind == SLIDING_ATTENTION if cfg.is_causal is None else bool(cfg.is_causal)
        self.window = cfg.sliding_window if kind == SLIDING_ATTENTION else None

    def kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [..., T, H] (context rows or normed block rows) -> roped K, V [..., T, nkv, D]."""
        shape = (*x.shape[:-1], self.cfg.num_key_value_heads, self.cfg.head_dim)
        k = rope(self.k_norm(self.k_proj(x).view(shape)), positions, self.cfg.rope_theta)
        return k, self.v_proj(x).view(shape)

    def visible(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """[B, T] x [B, S] absolute positions -> [B, T, S] which keys each query sees."""
        qp, kp = q_pos[:, :, None], k_pos[:, None, :]
        ok = torch.ones_like(qp >= kp)
        if self.causal:
            ok &= kp <= qp
        if self.window is not None:
            ok &= qp - kp < self.window
            if not self.causal:
                ok &= kp - qp < self.window
        return ok

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        ctx_pos: torch.Tensor,
        ctx_valid: torch.Tensor,
    ) -> torch.Tensor:
        """x: [B, T, H] block rows at `positions` [B, T]; ctx_k/ctx_v: [B, C, nkv, D] at ctx_pos [B, C],
        ctx_valid: [B, C] bool (padding keys are masked). -> [B, T, H]"""
        b, t, _ = x.shape
        nh, nkv, hd = self.cfg.num_attention_heads, self.cfg.num_key_value_heads, self.cfg.head_dim
        h = self.input_layernorm(x)
        q = rope(self.q_norm(self.q_proj(h).view(b, t, nh, hd)), positions, self.cfg.rope_theta)
        bk, bv = self.kv(h, positions)
        k = torch.cat([ctx_k, bk], 1).transpose(1, 2)  # [B, nkv, C+T, D]
        v = torch.cat([ctx_v, bv], 1).transpose(1, 2)
        k = k.repeat_interleave(nh // nkv, dim=1)  # [B, nh, C+T, D]
        v = v.repeat_interleave(nh // nkv, dim=1)
        valid = torch.cat([ctx_valid, torch.ones_like(positions, dtype=torch.bool)], 1)  # [B, C+T]
        mask = self.visible(positions, torch.cat([ctx_pos, positions], 1)) & valid[:, None, :]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask[:, None], scale=hd**-0.5)
        x = x + self.o_proj(o.transpose(1, 2).reshape(b, t, nh * hd))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class DFlashDrafter(nn.Module):
    """DFlashDraftModel: no embeddings or head of its own (the target's are used by the caller)."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DFlashLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def context_kv(
        self, features: torch.Tensor, positions: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Target features [..., N, L*H] of committed tokens at `positions` [..., N] -> per draft layer
        the context (K, V), each [..., N, nkv, D]."""
        ctx = self.hidden_norm(self.fc(features))  # [..., N, H]
        return [layer.kv(ctx, positions) for layer in self.layers]

    def forward(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        ctx: list[tuple[torch.Tensor, torch.Tensor]],
        ctx_pos: torch.Tensor,
        ctx_valid: torch.Tensor,
    ) -> torch.Tensor:
        """embeds: [B, T, H] block embeddings (anchor + masks, already scaled) -> normed hidden [B, T, H]."""
        x = embeds
        for layer, (k, v) in zip(self.layers, ctx, strict=True):
            x = layer(x, positions, k, v, ctx_pos, ctx_valid)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """hidden [..., H] -> float32 draft logits through the target's lm_head (multiplier, softcap)."""
        logits = lm_head(hidden).float() * self.cfg.output_multiplier
        cap = self.cfg.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits


def load_dflash(
    cfg: DFlashConfig, tensors: Mapping[str, torch.Tensor | QuantWeight], dtype: torch.dtype, device: Any
) -> DFlashDrafter:
    """Build the drafter from HF tensor names (`layers.{i}.self_attn.*`, `layers.{i}.mlp.*`, fc, norms).
    A quantized matrix (a seed file's W8 ones, as stored) is dequantized: the drafter runs dense weights."""
    from ninfer.formats import QuantWeight

    model = DFlashDrafter(cfg)
    names = {_module_name(n): t.dequantize() if isinstance(t, QuantWeight) else t for n, t in tensors.items()}
    own = model.state_dict()
    missing, extra = sorted(set(own) - set(names)), sorted(set(names) - set(own))
    if missing or extra:
        raise ValueError(f"DFlash weights: missing {missing[:5]}, unexpected {extra[:5]}")
    for n, t in names.items():
        if tuple(t.shape) != tuple(own[n].shape):
            raise ValueError(f"DFlash weights: {n} is {tuple(t.shape)}, expected {tuple(own[n].shape)}")
    model.load_state_dict(names)
    return model.to(device=device, dtype=dtype).eval()


def _module_name(name: str) -> str:
    """HF tensor name -> this module's (self_attn./mlp. prefixes dropped; `model.` prefix ignored)."""
    name = name.removeprefix("model.")
    return name.replace(".self_attn.", ".").replace(".mlp.", ".")
