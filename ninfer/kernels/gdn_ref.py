"""Torch reference of the gated delta rule (chunked and per-token), fp32 math, CPU and GPU."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def _prepare(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Expand grouped key heads, move heads before time, cast to fp32, l2-normalise and scale q/k.

    q, k: [B, T, nk, dk]; v: [B, T, nv, dv]; g, beta: [B, T, nv]
    returns q, k: [B, nv, T, dk]; v: [B, nv, T, dv]; g, beta: [B, nv, T] (all fp32)
    """
    nk, nv = k.shape[2], v.shape[2]
    if nv % nk:
        raise ValueError(f"value heads ({nv}) must be a multiple of key heads ({nk})")
    if nv != nk:  # value head h reads key/query head h // r
        q = q.repeat_interleave(nv // nk, dim=2)
        k = k.repeat_interleave(nv // nk, dim=2)
    q, k, v, g, beta = (x.transpose(1, 2).to(torch.float32).contiguous() for x in (q, k, v, g, beta))
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)  # eps inside the sum (FLA convention)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * (q.shape[-1] ** -0.5)
    return q, k, v, g, beta


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token gated delta rule: decay, delta write, read.

    q, k: [B, T, nk, dk]; v: [B, T, nv, dv]; g (log decay, fp32), beta: [B, T, nv];
    initial_state: [B, nv, dk, dv] or None (zeros).
    returns o: [B, T, nv, dv] in v's dtype, final_state: [B, nv, dk, dv] float32.
    """
    b, _, nv, dv = v.shape
    if initial_state is None:
        initial_state = torch.zeros(b, nv, k.shape[-1], dv, dtype=torch.float32, device=v.device)
    return _recurrence(q, k, v, g, beta, initial_state)


def _recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    on_state: Callable[[int, torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token loop; `on_state(t, S)` sees the fp32 state [B, nv, dk, dv] after token t."""
    out_dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    t = k.shape[2]
    s = state.to(torch.float32)
    outs = []
    for i in range(t):
        s = s * g[:, :, i].exp()[..., None, None]
        k_t = k[:, :, i]  # [B, nv, dk]
        pred = (s * k_t.unsqueeze(-1)).sum(-2)  # [B, nv, dv]
        delta = (v[:, :, i] - pred) * beta[:, :, i].unsqueeze(-1)
        s = s + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        outs.append((s * q[:, :, i].unsqueeze(-1)).sum(-2))
        if on_state is not None:
            on_state(i, s)
    o = torch.stack(outs, dim=2)  # [B, nv, T, dv]
    return o.transpose(1, 2).contiguous().to(out_dtype), s


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3.5 gating from the raw projections a, b [..., nv]: g = -exp(A_log)·softplus(a + dt_bias)
    in fp32 (log decay, <= 0) and beta = sigmoid(b) in b's dtype (the rounding transformers applies)."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.sigmoid()


def gdn_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_pool: torch.Tensor,
    slot_idx: torch.Tensor,
    start_slot: torch.Tensor,
) -> torch.Tensor:
    """Gated delta rule over T tokens per sequence with the state read from and written to a slot pool.

    q, k: [N, T, nk, dk]; v: [N, T, nv, dv]; a, b: [N, T, nv] raw gate projections (see `gdn_gates`);
    A_log, dt_bias: [nv]; ssm_pool: [num_slots, nv, dk, dv] (fp32), updated in place;
    slot_idx: [N, T] int, the slot that receives the state after token t (< 0: not stored);
    start_slot: [N] int, the slot the initial state is read from (< 0: padding row: output zeros,
    nothing written). All reads happen before any write, so a row may overwrite its start slot.
    Slots written by different rows must differ. returns o: [N, T, nv, dv] in v's dtype.
    The torch reference synchronises with the device on the write masks; the Triton op does not.
    """
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    valid = start_slot >= 0  # [N]
    s0 = ssm_pool.index_select(0, start_slot.clamp(min=0)).float()
    s0 = torch.where(valid[:, None, None, None], s0, 0.0)  # [N, nv, dk, dv]

    def store(t: int, s: torch.Tensor) -> None:
        keep = (slot_idx[:, t] >= 0) & valid
        ssm_pool[slot_idx[keep, t]] = s[keep].to(ssm_pool.dtype)

    o, _ = _recurrence(q, k, v, g, beta, s0, store)
    return torch.where(valid[:, None, None, None], o, 0.0)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule (WY / UT transform inside each chunk, recurrence across chunks).

    Same arguments and results as `recurrent_gated_delta_rule`; T is right-padded to a multiple
    of `chunk` internally (padding has g = 0, beta = 0, k = v = 0 and does not touch the state).
    """
    out_dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    pad = (-t) % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (t + pad) // chunk
    # [B, nv, n, C, d]
    q, k, v = (x.reshape(b, h, n, chunk, x.shape[-1]) for x in (q, k, v))
    g = g.reshape(b, h, n, chunk)
    beta = beta.reshape(b, h, n, chunk)

    cum = g.cumsum(-1)  # [B, nv, n, C] log decay from the chunk start to each position
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    # decay[i, j] = exp(cum_i - cum_j) for j <= i, 0 above the diagonal
    decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(upper, float("-inf")).exp()
    kb = k * beta.unsqueeze(-1)
    vb = v * beta.unsqueeze(-1)
    # (I + A) with A strictly lower = (beta k k^T) * decay; solve for the WY representation
    system = (kb @ k.transpose(-1, -2)) * decay
    u = torch.linalg.solve_triangular(system, vb, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, kb * cum.exp().unsqueeze(-1), upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay  # intra-chunk causal scores, diagonal included

    q_dec = q * cum.exp().unsqueeze(-1)  # reads of the chunk-start state
    k_dec = k * (cum[..., -1:] - cum).exp().unsqueeze(-1)  # writes, decayed to the chunk end
    chunk_decay = cum[..., -1].exp()[..., None, None]  # [B, nv, n, 1, 1]

    if initial_state is None:
        s = torch.zeros(b, h, dk, dv, dtype=torch.float32, device=v.device)
    else:
        s = initial_state.to(torch.float32)
    out = torch.empty_like(u)
    for c in range(n):
        v_new = u[:, :, c] - w[:, :, c] @ s  # [B, nv, C, dv]
        out[:, :, c] = q_dec[:, :, c] @ s + attn[:, :, c] @ v_new
        s = s * chunk_decay[:, :, c] + k_dec[:, :, c].transpose(-1, -2) @ v_new
    o = out.reshape(b, h, n * chunk, dv)[:, :, :t]
    return o.transpose(1, 2).contiguous().to(out_dtype), s
