"""Verification of k drafts against the target's k+1 logit rows: greedy matching and rejection sampling.

Constrained rows (a grammar) are drafted and verified on masked logits: draft position j and
verified position j both carry the mask of the constraint's state after d_1..d_j (the sampler's
lookahead), so p and q are the masked distributions and a draft the mask refuses has p = 0.

Both distributions go through the request's own `RowSampler` pipeline (penalties with the draft
prefix counted as generated, temperature, top-k, top-p, min-p), and every random draw uses the
request's generator, so a seed reproduces a request. Rejection sampling (Leviathan et al.):
accept draft x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection emit a
sample of norm(max(0, p_i - q_i)); when all k are accepted emit a bonus sample of p_k. The
emitted tokens are distributed exactly as k+1 sequential samples of the target.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ninfer.engine.sampler import RowSampler, advance_drafts, draft_masked, logprob_rows
from ninfer.engine.types import TokenLogprob


@dataclass(frozen=True)
class Verdict:
    """One row's verification: `tokens` = the accepted drafts followed by the target's own token."""

    tokens: list[int]  # length accepted + 1
    accepted: int  # leading drafts accepted (0..k)


@contextmanager
def observed(sampler: RowSampler, prefix: Sequence[int]) -> Iterator[RowSampler]:
    """The sampler as if `prefix` had been generated (for penalties); its counts are restored after."""
    saved = dict(sampler.counts)
    try:
        for t in prefix:
            sampler.count(int(t))  # counted only: a constraint's state is the caller's (masked logits)
        yield sampler
    finally:
        sampler.counts = saved


def is_greedy(sampler: RowSampler) -> bool:
    return sampler.params.temperature == 0.0


def plain_greedy(sampler: RowSampler) -> bool:
    """Greedy without penalties: the choice is the raw argmax, so rows can share one batched argmax."""
    p = sampler.params
    return p.temperature == 0.0 and not (p.presence_penalty or p.frequency_penalty)


def match_greedy(target_tokens: Sequence[int], drafts: Sequence[int]) -> Verdict:
    """target_tokens: the target's greedy choice at each of the k+1 verified positions."""
    for i, d in enumerate(drafts):
        if int(target_tokens[i]) != int(d):
            return Verdict(tokens=[*map(int, drafts[:i]), int(target_tokens[i])], accepted=i)
    return Verdict(tokens=[*map(int, drafts), int(target_tokens[len(drafts)])], accepted=len(drafts))


def greedy_token(sampler: RowSampler, logits: torch.Tensor, prefix: Sequence[int]) -> int:
    """logits: [V] float32 -> the token plain greedy decoding would pick after `prefix`."""
    with observed(sampler, prefix) as s:
        return int(torch.argmax(s.adjust(logits)).item())


def distribution(sampler: RowSampler, logits: torch.Tensor, prefix: Sequence[int]) -> torch.Tensor:
    """logits: [V] float32 (-inf where a reduced head has no row) -> normalized probabilities [V]."""
    with observed(sampler, prefix) as s:
        probs = s.probs(s.adjust(logits)).to(torch.float64)
    total = probs.sum()
    if not total > 0:
        raise ValueError("sampling distribution has no mass (all logits -inf or NaN)")
    return probs / total


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One sample of a (possibly unnormalized) distribution [V] with the request's generator."""
    return int(torch.multinomial(probs.to(torch.float32), 1, generator=generator).item())


def _uniform(generator: torch.Generator) -> float:
    return float(torch.rand(1, generator=generator, device=generator.device).item())


def verify_greedy(sampler: RowSampler, target_logits: torch.Tensor, drafts: Sequence[int]) -> Verdict:
    """target_logits: [k+1, V] for inputs [t_last, d_1..d_k]. Accept while d_i equals the target's
    greedy choice after d_1..d_{i-1}; then append the target's own choice."""
    out: list[int] = []
    for i, d in enumerate(drafts):
        t = greedy_token(sampler, target_logits[i], out)
        if t != int(d):
            return Verdict(tokens=[*out, t], accepted=i)
        out.append(int(d))
    return Verdict(tokens=[*out, greedy_token(sampler, target_logits[len(out)], out)], accepted=len(out))


def verify_sampled(
    sampler: RowSampler,
    target_logits: torch.Tensor,
    drafts: Sequence[int],
    draft_probs: torch.Tensor | None,
) -> Verdict:
    """Rejection sampling. target_logits: [k+1, V]; draft_probs: [k, V], row i the normalized q the
    draft d_{i+1} was drawn from (None: deterministic drafts, q = one-hot)."""
    gen = sampler.generator
    out: list[int] = []
    for i, d in enumerate(drafts):
        d = int(d)
        p = distribution(sampler, target_logits[i], out)  # [V] float64
        if draft_probs is None:
            q = torch.zeros_like(p)
            q[d] = 1.0
        else:
            q = draft_probs[i].to(p.dtype)
        if q[d] <= 0:
            raise ValueError(f"draft token {d} has zero draft probability")
        if _uniform(gen) * float(q[d]) < float(p[d]):
            out.append(d)
            continue
        residual = (p - q).clamp_min(0.0)
        if not residual.sum() > 0:  # p == q up to rounding: the rejection had probability ~0
            residual = p
        return Verdict(tokens=[*out, draw(residual, gen)], accepted=i)
    bonus = distribution(sampler, target_logits[len(out)], out)
    return Verdict(tokens=[*out, draw(bonus, gen)], accepted=len(out))


def verify(
    sampler: RowSampler,
    target_logits: torch.Tensor,
    drafts: Sequence[int],
    draft_probs: torch.Tensor | None = None,
) -> Verdict:
    """Greedy requests match exactly; stochastic ones use rejection sampling."""
    if is_greedy(sampler):
        return verify_greedy(sampler, target_logits, drafts)
    return verify_sampled(sampler, target_logits, drafts, draft_probs)


def run_logprobs(
    samplers: Sequence[RowSampler], logits: Sequence[torch.Tensor], runs: Sequence[Sequence[int]]
) -> list[list[TokenLogprob] | None]:
    """Per row: the logprobs of each token of its committed run (None for rows without logprobs).
    logits[i]: [>= len(run), V] the verified logits of row i (masked for a constrained row: each
    position under the mask of its committed prefix); position t is penalized with run[:t] counted
    as generated, then `logprob_rows` reports it as the plain path would had it sampled the run
    one token at a time."""
    out: list[list[TokenLogprob] | None] = [None] * len(samplers)
    rows = [i for i, s in enumerate(samplers) if s.logprobs is not None]
    if not rows:
        return out
    parts: list[torch.Tensor] = []
    flat: list[RowSampler] = []  # one per reported position
    tokens: list[int] = []
    for i in rows:
        s, x, run = samplers[i], logits[i], [int(t) for t in runs[i]]
        if s.penalized:
            adjusted = []
            for t in range(len(run)):
                with observed(s, run[:t]) as o:
                    adjusted.append(o.adjust(x[t]))
            parts.append(torch.stack(adjusted))
        else:
            parts.append(x[: len(run)])
        flat += [s] * len(run)
        tokens += run
    adjusted = torch.cat(parts)  # [N, V]
    lp = logprob_rows(adjusted, torch.tensor(tokens, device=adjusted.device), flat)
    assert lp is not None  # every flat row asked for logprobs
    read = lp.read(tokens, flat, len(flat))
    at = 0
    for i in rows:
        n = len(runs[i])
        out[i] = [e for e in read[at : at + n] if e is not None]
        at += n
    return out


def propose(
    sampler: RowSampler, draft_logits: torch.Tensor, prefix: Sequence[int]
) -> tuple[int, torch.Tensor | None]:
    """One draft token from draft logits [V] after `prefix` (the earlier drafts of this round):
    greedy requests take the argmax (q unused, None); stochastic ones sample q and return it."""
    if is_greedy(sampler):
        return greedy_token(sampler, draft_logits, prefix), None
    q = distribution(sampler, draft_logits, prefix)
    return draw(q, sampler.generator), q


def draft_step(
    samplers: list[RowSampler], logits: torch.Tensor, drafts: list[list[int]], probs: list[list[torch.Tensor]]
) -> None:
    """One draft position of every row from draft logits [B, V]: constrained rows masked in their
    lookahead state (then advanced past the new draft), plain greedy rows take the argmax (one
    transfer), the others `propose`. Appends to `drafts` and, for sampled drafts, `probs`."""
    logits = draft_masked(logits, samplers)
    argmax = logits.argmax(-1).tolist()
    for i, s in enumerate(samplers):
        if plain_greedy(s):
            drafts[i].append(argmax[i])
            continue
        d, q = propose(s, logits[i], drafts[i])
        drafts[i].append(d)
        if q is not None:
            probs[i].append(q)
    advance_drafts(samplers, [d[-1] for d in drafts])
