"""The Qwen3.5/3.6 vision tower (`visual.*`): patch embed, resampled position table, 2-D rotary, blocks, merger.

Engine-facing API:

* `VisionConfig.from_hf(vision_config_dict)` — the checkpoint's ``vision_config``.
* `load_vision_tower(config, tensors, dtype, device) -> VisionTower` from canonical ``visual.*`` names.
* `VisionTower.forward(pixel_patches [N, patch_dim], grid_thw [M, 3]) -> [N / merge², out_hidden]`:
  ``pixel_patches`` are the concatenated payloads of M items in prompt order, each in merge-block
  order as `ninfer.media` prepares them (BF16 on the host, cast to the tower's dtype here);
  ``grid_thw`` holds each item's (t, h, w) in 16-px patches. Output rows are the merged tokens in the
  same order, one per ``<|image_pad|>`` / ``<|video_pad|>`` placeholder, ready to be scattered into
  the text embeddings (`VisionTower.split(out, grid_thw)` gives them per item).

Attention is bidirectional within each image / video frame and never crosses frames, so the items
of one call are independent: encoding them together or one by one gives the same rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VISUAL_PREFIX = "visual."


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower's shape (`Qwen3_5VisionConfig`)."""

    depth: int = 27
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_heads: int = 16
    out_hidden_size: int = 3584
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    num_position_embeddings: int = 2304
    rope_theta: float = 10000.0
    hidden_act: str = "gelu_pytorch_tanh"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values per raw patch: channels x temporal x patch x patch (1536)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size**2

    @classmethod
    def from_hf(cls, d: Mapping[str, Any]) -> VisionConfig:
        """From a Hugging Face ``vision_config`` dict."""
        rope = d.get("rope_parameters") or {}
        return cls(
            depth=int(d.get("depth", cls.depth)),
            hidden_size=int(d.get("hidden_size", cls.hidden_size)),
            intermediate_size=int(d.get("intermediate_size", cls.intermediate_size)),
            num_heads=int(d.get("num_heads", cls.num_heads)),
            out_hidden_size=int(d.get("out_hidden_size", cls.out_hidden_size)),
            in_channels=int(d.get("in_channels", cls.in_channels)),
            patch_size=int(d.get("patch_size", cls.patch_size)),
            temporal_patch_size=int(d.get("temporal_patch_size", cls.temporal_patch_size)),
            spatial_merge_size=int(d.get("spatial_merge_size", cls.spatial_merge_size)),
            num_position_embeddings=int(d.get("num_position_embeddings", cls.num_position_embeddings)),
            rope_theta=float(rope.get("rope_theta", d.get("rope_theta", cls.rope_theta))),
            hidden_act=str(d.get("hidden_act", cls.hidden_act)),
        )


def _act(name: str):
    if name == "gelu_pytorch_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    raise ValueError(f"unsupported vision activation {name!r}")


def merge_block_coords(h: int, w: int, merge: int, device: torch.device | None = None) -> torch.Tensor:
    """(row, col) patch coordinates of one frame in merge-block order -> [h*w, 2] int64."""
    rows = torch.arange(h, device=device).view(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
    cols = torch.arange(w, device=device).view(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
    # [h/m, m, w/m, m] -> [h/m, w/m, m, m]
    rows = rows.permute(0, 2, 1, 3).reshape(-1)
    cols = cols.permute(0, 2, 1, 3).reshape(-1)
    return torch.stack([rows, cols], dim=-1)


def _axis_taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear (align_corners) taps [n, 2] and weights [n, 2] from a `side` table to `size` points."""
    src = index.to(torch.float32) * (side - 1) / max(size - 1, 1)
    floor = torch.floor(src)
    offsets = torch.arange(2, device=index.device)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


class VisionBlock(nn.Module):
    """Pre-LN block: attention within each frame, then the GELU(tanh) MLP."""

    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.num_heads = c.num_heads
        self.norm1 = nn.LayerNorm(c.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(c.hidden_size, eps=1e-6)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(c.hidden_size, 3 * c.hidden_size)
        self.attn.proj = nn.Linear(c.hidden_size, c.hidden_size)
        self.mlp = nn.Module()
        self.mlp.linear_fc1 = nn.Linear(c.hidden_size, c.intermediate_size)
        self.mlp.linear_fc2 = nn.Linear(c.intermediate_size, c.hidden_size)
        self.act = _act(c.hidden_act)

    def _attention(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: list[tuple[int, int]]
    ) -> torch.Tensor:
        n = x.shape[0]
        qkv = self.attn.qkv(x).view(n, 3, self.num_heads, -1)  # [N, 3, heads, d]
        q, k, v = qkv.unbind(1)  # [N, heads, d] each
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out = torch.empty_like(q)
        start = 0
        for frames, length in segments:  # `frames` equal-length frames side by side
            end = start + frames * length
            qs, ks, vs = (
                t[start:end].view(frames, length, self.num_heads, -1).transpose(1, 2) for t in (q, k, v)
            )
            o = F.scaled_dot_product_attention(qs, ks, vs)  # [frames, heads, length, d]
            out[start:end] = o.transpose(1, 2).reshape(frames * length, self.num_heads, -1)
            start = end
        return self.attn.proj(out.reshape(n, -1))

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: list[tuple[int, int]]
    ) -> torch.Tensor:
        x = x + self._attention(self.norm1(x), cos, sin, segments)
        return x + self.mlp.linear_fc2(self.act(self.mlp.linear_fc1(self.norm2(x))))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """rotate_half rotary over the full head in fp32; x [N, heads, d], cos/sin [N, d]."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rot = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, None] + rot * sin[:, None]).to(x.dtype)


class VisionTower(nn.Module):
    """`Qwen3_5VisionModel` without deepstack; parameter names equal the canonical ``visual.*`` names."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.side = int(c.num_position_embeddings**0.5)
        if self.side * self.side != c.num_position_embeddings:
            raise ValueError(f"num_position_embeddings {c.num_position_embeddings} is not a square")
        self.patch_embed = nn.Module()
        kernel = (c.temporal_patch_size, c.patch_size, c.patch_size)
        self.patch_embed.proj = nn.Conv3d(c.in_channels, c.hidden_size, kernel, stride=kernel)
        table = torch.empty(c.num_position_embeddings, c.hidden_size)  # assigned at load (no init draw)
        self.pos_embed = nn.Embedding(c.num_position_embeddings, c.hidden_size, _weight=table)
        self.blocks = nn.ModuleList(VisionBlock(c) for _ in range(c.depth))
        self.merger = nn.Module()
        self.merger.norm = nn.LayerNorm(c.hidden_size, eps=1e-6)
        width = c.hidden_size * c.merge_unit
        self.merger.linear_fc1 = nn.Linear(width, width)
        self.merger.linear_fc2 = nn.Linear(width, c.out_hidden_size)
        spatial = c.head_dim // 2
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, spatial, 2, dtype=torch.float32) / spatial))
        self.register_buffer("inv_freq", inv, persistent=False)  # [head_dim / 4]

    def _frame_tables(self, grid_thw: list[tuple[int, int, int]], device: torch.device):
        """Per patch: interpolated position embedding [N, hidden] and rotary cos/sin [N, head_dim]."""
        c = self.config
        pos, angles = [], []
        for t, h, w in grid_thw:
            rc = merge_block_coords(h, w, c.spatial_merge_size, device)  # [h*w, 2]
            ht, hw_ = _axis_taps(rc[:, 0], h, self.side)
            wt, ww = _axis_taps(rc[:, 1], w, self.side)
            idx = (ht[:, :, None] * self.side + wt[:, None, :]).reshape(-1, 4)
            wts = (hw_[:, :, None] * ww[:, None, :]).reshape(-1, 4)
            table = (self.pos_embed(idx) * wts[:, :, None]).sum(1)  # fp32 weights, as transformers
            pos.append(table.repeat(t, 1))
            ang = rc[:, :, None].float() * self.inv_freq.to(device)  # [h*w, 2, head_dim/4]
            angles.append(ang.reshape(rc.shape[0], -1).repeat(t, 1))
        a = torch.cat(angles)
        a = torch.cat([a, a], dim=-1)  # [N, head_dim]
        return torch.cat(pos), a.cos(), a.sin()

    def forward(self, pixel_patches: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """pixel_patches [N, patch_dim], grid_thw [M, 3] -> merged tokens [N / merge², out_hidden]."""
        c = self.config
        grids = [tuple(int(v) for v in g) for g in grid_thw.tolist()]
        total = sum(t * h * w for t, h, w in grids)
        if pixel_patches.shape != (total, c.patch_dim):
            raise ValueError(
                f"pixel_patches {tuple(pixel_patches.shape)} != ({total}, {c.patch_dim}) for {grids}"
            )
        for t, h, w in grids:
            if h % c.spatial_merge_size or w % c.spatial_merge_size or t < 1:
                raise ValueError(f"grid {(t, h, w)} is not a whole number of merge blocks")
        weight = self.patch_embed.proj.weight
        x = F.linear(
            pixel_patches.to(weight.dtype), weight.view(c.hidden_size, -1), self.patch_embed.proj.bias
        )
        pos, cos, sin = self._frame_tables(grids, x.device)
        x = x + pos.to(x.dtype)  # [N, hidden]
        segments = [(t, h * w) for t, h, w in grids]
        for block in self.blocks:
            x = block(x, cos, sin, segments)
        x = self.merger.norm(x).view(-1, c.hidden_size * c.merge_unit)
        return self.merger.linear_fc2(F.gelu(self.merger.linear_fc1(x)))

    def split(self, merged: torch.Tensor, grid_thw: torch.Tensor) -> list[torch.Tensor]:
        """Split `forward`'s output into one [t*h*w / merge², out_hidden] tensor per item."""
        sizes = (grid_thw.prod(-1) // self.config.merge_unit).tolist()
        return list(torch.split(merged, sizes))


def load_vision_tower(
    config: VisionConfig,
    tensors: Mapping[str, torch.Tensor],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> VisionTower:
    """Build the tower from canonical ``visual.*`` tensors (other names are ignored); strict names and shapes."""
    with torch.device("meta"):
        tower = VisionTower(config)
    expected = {k: tuple(v.shape) for k, v in tower.state_dict().items()}
    given = {k[len(VISUAL_PREFIX) :]: v for k, v in tensors.items() if k.startswith(VISUAL_PREFIX)}
    missing = sorted(set(expected) - set(given))
    extra = sorted(set(given) - set(expected))
    bad = sorted(k for k in set(expected) & set(given) if tuple(given[k].shape) != expected[k])
    if missing or extra or bad:
        raise ValueError(
            f"vision weights do not match the config: missing {missing[:8]}, unexpected {extra[:8]}, mis-shaped {bad[:8]}"
        )
    tower.load_state_dict(
        {k: given[k].to(device=device, dtype=dtype) for k in expected}, strict=True, assign=True
    )
    spatial = config.head_dim // 2
    tower.inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, spatial, 2, dtype=torch.float32, device=device) / spatial)
    )
    return tower.eval()
