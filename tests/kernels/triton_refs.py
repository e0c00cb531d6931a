"""Plain float64 torch references for the Triton kernel tests, written from the model math."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """g = -exp(A_log)·softplus(a + dt_bias), beta = sigmoid(b); a, b: [..., nv] -> float64."""
    g = -a_log.double().exp() * F.softplus(a.double() + dt_bias.double())  # threshold 20 like torch
    return g, torch.sigmoid(b.double())


def gdn_recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One sequence: q, k [T, nk, dk], v [T, nv, dv], g, beta [T, nv], state [nv, dk, dv].

    returns o [T, nv, dv] and the state after each token (list of T [nv, dk, dv]), all float64.
    """
    nk, nv = q.shape[1], v.shape[1]
    q = q.double().repeat_interleave(nv // nk, dim=1)  # value head h reads key head h // r
    k = k.double().repeat_interleave(nv // nk, dim=1)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * q.shape[-1] ** -0.5
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    s = state.double().clone()
    outs, states = [], []
    for t in range(q.shape[0]):
        s = s * g[t].double().exp()[:, None, None]
        pred = torch.einsum("hkv,hk->hv", s, k[t])
        s = s + torch.einsum("hk,hv->hkv", k[t], (v[t].double() - pred) * beta[t].double()[:, None])
        outs.append(torch.einsum("hkv,hk->hv", s, q[t]))
        states.append(s.clone())
    return torch.stack(outs), states


def causal_conv_window(
    x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, offset: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: x [T, C], weight [C, K], state [C, S] raw inputs; history = state[:, offset:offset+K-1].

    returns y [T, C] = silu(depthwise causal conv) and the new state [C, S] = the last S columns of
    [state[:, :offset+K-1] | xᵀ], in float64.
    """
    kernel = weight.shape[1]
    seq = torch.cat([state[:, : offset + kernel - 1].double(), x.double().T], dim=1)  # [C, offset+K-1+T]
    hist = seq[:, offset:]
    y = torch.stack([(hist[:, t : t + kernel] * weight.double()).sum(-1) for t in range(x.shape[0])])
    return F.silu(y), seq[:, -state.shape[1] :]


def paged_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    cache_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [B, T, nh, hd] over pages [num_pages, P, nkv, hd]; query i sees keys 0..cache_lens+i -> float64."""
    bsz, t, nh, hd = q.shape
    page, nkv = k_pool.shape[1], k_pool.shape[2]
    out = torch.zeros(bsz, t, nh, hd, dtype=torch.float64)
    for n in range(bsz):
        length = int(cache_lens[n]) + t
        pages = page_table[n, : (length + page - 1) // page].long()
        keys = k_pool[pages].reshape(-1, nkv, hd)[:length].double().repeat_interleave(nh // nkv, dim=1)
        vals = v_pool[pages].reshape(-1, nkv, hd)[:length].double().repeat_interleave(nh // nkv, dim=1)
        scores = torch.einsum("thd,lhd->thl", q[n].double(), keys) * scale  # [T, nh, L]
        causal = torch.arange(length)[None, :] <= (int(cache_lens[n]) + torch.arange(t))[:, None]
        scores = scores.masked_fill(~causal[:, None, :], float("-inf"))
        out[n] = torch.einsum("thl,lhd->thd", scores.softmax(-1), vals)
    return out
