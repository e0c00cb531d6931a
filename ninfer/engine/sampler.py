"""Per-request sampling: parameter resolution, penalties, top-k/top-p/min-p, seeded generators."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

import torch

from ninfer.engine.config import SamplingOverrides
from ninfer.engine.types import SamplingParams, TokenLogprob

KNOBS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty")
# Used for knobs neither the preset, the process nor the request sets: plain softmax sampling.
NEUTRAL: dict[str, float | int] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
_SEED_RNG = random.SystemRandom()
# Positive temperatures below the smallest normal float32 are sampled as greedy: the knob is a
# float32 on the device, where a subnormal may flush to zero (0 / 0 in the scaled logits).
MIN_TEMPERATURE = float(torch.finfo(torch.float32).tiny)


@dataclass(frozen=True)
class ResolvedSampling:
    temperature: float
    top_p: float
    top_k: int  # 0 = off
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    seed: int

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def resolve_sampling(
    params: SamplingParams, preset: Mapping[str, float | int] | None, overrides: SamplingOverrides
) -> ResolvedSampling:
    """preset (for the thinking mode) < process overrides < request fields < greedy."""
    preset = dict(preset or {})
    if preset.pop("repetition_penalty", 1.0) != 1.0:
        raise ValueError("repetition_penalty is not supported; only its neutral value 1.0 is accepted")
    unknown = set(preset) - set(KNOBS)
    if unknown:
        raise ValueError(f"unknown sampler preset keys {sorted(unknown)}; known: {KNOBS}")
    values: dict[str, float | int] = {}
    for name in KNOBS:
        v = getattr(params, name)
        if v is None:
            v = getattr(overrides, name)
        if v is None:
            v = preset.get(name, NEUTRAL[name])
        values[name] = v
    if overrides.greedy or 0.0 <= float(values["temperature"]) < MIN_TEMPERATURE:
        values["temperature"] = 0.0  # (-0.0 included; a negative or NaN one fails validation)
    seed = params.seed if params.seed is not None else overrides.seed
    if seed is None:
        seed = _SEED_RNG.randrange(2**63)
    top_k = int(values["top_k"])
    out = ResolvedSampling(
        temperature=float(values["temperature"]),
        top_p=float(values["top_p"]),
        top_k=0 if top_k < 0 else top_k,
        min_p=float(values["min_p"]),
        presence_penalty=float(values["presence_penalty"]),
        frequency_penalty=float(values["frequency_penalty"]),
        seed=int(seed),
    )
    _validate(out)
    return out


def _validate(s: ResolvedSampling) -> None:
    if not s.temperature >= 0.0:
        raise ValueError(f"temperature must be >= 0, got {s.temperature}")
    if not 0.0 <= s.top_p <= 1.0:
        raise ValueError(f"top_p must be in [0, 1], got {s.top_p}")
    if not 0.0 <= s.min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {s.min_p}")
    if s.seed < 0:
        raise ValueError(f"seed must be nonnegative, got {s.seed}")


def _scaled(logits: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """logits [..., V] -> (logits - row max) / temperature: every row's maximum becomes exactly 0
    and the rest <= 0 (-inf where the quotient overflows), so however small a positive
    temperature is, softmax stays finite (the limit: all mass on the maximum). Dividing the
    unshifted logits overflows to inf for tiny temperatures, and softmax of inf is NaN."""
    return (logits - logits.amax(dim=-1, keepdim=True)) / temperature


class TokenConstraint(Protocol):
    """A per-request token mask (`ninfer.engine.grammar.GrammarConstraint`)."""

    def fill(self, words: torch.Tensor) -> bool:
        """Write the allowed tokens of the next step into `words` (int32 [ceil(V / 32)], bit t % 32
        of word t // 32 set = allowed); False leaves the step unconstrained (words untouched)."""
        ...

    def accept(self, token: int) -> None: ...


@runtime_checkable
class DraftConstraint(TokenConstraint, Protocol):
    """A constraint that can look ahead through draft tokens (speculative decoding): `advance`
    accepts a token tentatively (False, state unchanged, when the current mask does not admit
    it), so that `fill` gives the next position's mask; `rewind` undoes every advance since the
    last rewind."""

    def advance(self, token: int) -> bool: ...

    def rewind(self) -> None: ...


class RowSampler:
    """Sampling state of one request: its own generator, so batch composition never matters."""

    def __init__(
        self,
        params: ResolvedSampling,
        device: torch.device | str = "cpu",
        *,
        logprobs: int | None = None,
        constraint: TokenConstraint | None = None,
    ) -> None:
        self.params = params
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(params.seed)
        self.counts: dict[int, int] = {}  # generated token id -> occurrences (for penalties)
        self.logprobs = logprobs  # top alternatives to report per token (None: no logprobs)
        self.constraint = constraint

    @property
    def penalized(self) -> bool:
        """Whether the logits depend on the tokens generated so far (presence / frequency penalty)."""
        return bool(self.params.presence_penalty or self.params.frequency_penalty)

    @property
    def host_bound(self) -> bool:
        """Whether a decode round needs this row's committed tokens on the host before it samples
        (a grammar mask) or reads more than the token back (logprobs). Penalties are not: a
        plain decode round reads its counts on the device (`penalty_counts.PenaltyCounts`)."""
        return self.constraint is not None or self.logprobs is not None

    def observe(self, token: int) -> None:
        """A committed token: counted (penalties) and accepted by the constraint."""
        self.count(token)
        if self.constraint is not None:
            self.constraint.accept(token)

    def count(self, token: int) -> None:
        self.counts[token] = self.counts.get(token, 0) + 1

    def adjust(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [V] float32 -> the penalized logits (OpenAI semantics over generated tokens):
        mu[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty."""
        p = self.params
        if self.counts and (p.presence_penalty or p.frequency_penalty):
            ids = torch.tensor(list(self.counts), device=logits.device)
            cnt = torch.tensor(list(self.counts.values()), device=logits.device, dtype=logits.dtype)
            logits = logits.clone()
            logits[ids] -= cnt * p.frequency_penalty + p.presence_penalty
        return logits

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [V] float32 (penalized) -> the (unnormalized) sampling distribution [V]."""
        p = self.params
        logits = _scaled(logits, p.temperature)
        # Same order as Hugging Face generation: temperature, top-k, top-p, min-p.
        if 0 < p.top_k < logits.numel():
            kth = torch.topk(logits, p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True, stable=True)
            cum = torch.cumsum(sorted_p, dim=-1)
            drop_sorted = (cum - sorted_p) >= p.top_p  # keep the smallest prefix reaching top_p
            drop_sorted[0] = False  # and always the most probable token (top_p = 0: only it)
            drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
            probs = probs.masked_fill(drop, 0.0)
        if p.min_p > 0.0:
            probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
        return probs

    def sample(self, logits: torch.Tensor) -> int:
        """logits: [V] float32 of one row; returns the chosen token id."""
        logits = self.adjust(logits)
        if self.params.temperature == 0.0:
            return int(torch.argmax(logits).item())
        return int(torch.multinomial(self.probs(logits), 1, generator=self.generator).item())


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on `device`: through pinned memory without waiting for the device."""
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _penalized(logits: torch.Tensor, samplers: list[RowSampler]) -> torch.Tensor:
    """logits: [B, V] float32 -> the rows with `RowSampler.adjust` applied, in one scatter."""
    rows: list[int] = []
    ids: list[int] = []
    vals: list[list[float]] = [[], [], []]  # count, frequency_penalty, presence_penalty
    for i, s in enumerate(samplers):
        p = s.params
        if s.counts and (p.presence_penalty or p.frequency_penalty):
            rows += [i] * len(s.counts)
            ids += list(s.counts)
            vals[0] += [float(c) for c in s.counts.values()]
            vals[1] += [p.frequency_penalty] * len(s.counts)
            vals[2] += [p.presence_penalty] * len(s.counts)
    out = logits
    if rows:
        idx = to_device(torch.tensor([rows, ids], dtype=torch.int64), logits.device)  # [2, N]
        cnt, freq, pres = to_device(torch.tensor(vals, dtype=logits.dtype), logits.device)  # 3 x [N]
        out = logits.clone()
        out[idx[0], idx[1]] -= cnt * freq + pres  # fp32, as adjust(): c * frequency + presence
    return _masked(out, samplers, out is logits)


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def unpack_bitmask(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 [N, ceil(V / 32)] packed masks -> bool [N, V] (bit t % 32 of word t // 32)."""
    shifts = _SHIFTS.get(words.device)
    if shifts is None:
        shifts = _SHIFTS[words.device] = torch.arange(32, dtype=torch.int32, device=words.device)
    bits = (words.unsqueeze(-1) >> shifts) & 1  # [N, W, 32]
    return bits.reshape(words.shape[0], -1)[:, :vocab].bool()


def _masked(logits: torch.Tensor, samplers: list[RowSampler], shared: bool) -> torch.Tensor:
    """Grammar masks: rows whose constraint fills a mask this step get -inf at disallowed tokens.
    The masks are filled on the host (after the step's launch: the GPU computes meanwhile) and go
    to the device in one copy; rows without a constraint are not touched. `shared`: `logits` is
    the caller's tensor (cloned before writing)."""
    rows = [i for i, s in enumerate(samplers) if s.constraint is not None]
    if not rows:
        return logits
    words = _all_allowed(len(rows), logits.shape[1])
    kept = [i for j, i in enumerate(rows) if samplers[i].constraint.fill(words[j])]  # type: ignore[union-attr]
    if not kept:
        return logits
    words = words[[rows.index(i) for i in kept]]
    out = logits.clone() if shared else logits
    idx = to_device(torch.tensor(kept, dtype=torch.int64), logits.device)
    out[idx] = _apply_masks(out[idx], words)
    return out


def _all_allowed(n: int, vocab: int) -> torch.Tensor:
    """n packed masks admitting every token: int32 [n, ceil(V / 32)] on the host."""
    return torch.full((n, (vocab + 31) // 32), -1, dtype=torch.int32)


def _apply_masks(logits: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """logits [N, V], host words [N, ceil(V / 32)] -> logits with -inf where a mask bit is clear."""
    allowed = unpack_bitmask(to_device(words, logits.device), logits.shape[1])  # [N, V]
    return logits.masked_fill(~allowed, float("-inf"))


# ----- speculative lookahead: masks of positions after draft tokens -----


def _lookahead(sampler: RowSampler) -> DraftConstraint:
    c = sampler.constraint
    if not isinstance(c, DraftConstraint):
        raise TypeError(f"{type(c).__name__} cannot look ahead through draft tokens")
    return c


def draft_masked(logits: torch.Tensor, samplers: list[RowSampler]) -> torch.Tensor:
    """One draft position's logits [B, V] with each constrained row's mask in its lookahead state
    (`advance_drafts`): what the plain path would apply had the row's drafts so far been committed.
    The same tensor when no row is masked; otherwise a copy."""
    return _masked(logits, samplers, shared=True)


def advance_drafts(samplers: list[RowSampler], tokens: Sequence[int]) -> None:
    """Each constrained row's lookahead past its newest draft `tokens[i]` (undone by `rewind`)."""
    for s, t in zip(samplers, tokens, strict=True):
        if s.constraint is not None:
            _lookahead(s).advance(int(t))


def rewind(samplers: list[RowSampler]) -> None:
    """Every constrained row back to its committed state."""
    for s in samplers:
        if s.constraint is not None:
            _lookahead(s).rewind()


def run_masked(
    logits: torch.Tensor, samplers: list[RowSampler], drafts: Sequence[Sequence[int]]
) -> tuple[list[int], torch.Tensor]:
    """Verification logits [B, q, V] of inputs [t_last, d_1..d_{q-1}] -> (the constrained rows,
    their logits [C, q, V] masked): position j gets the mask the plain path would apply after
    d_1..d_j were committed. A draft that the mask at its position does not admit ends the run
    there (later positions are left unmasked: acceptance cannot reach them). The constraints end
    in their committed state; rows without a constraint cost nothing."""
    rows = [i for i, s in enumerate(samplers) if s.constraint is not None]
    if not rows:
        return rows, logits[:0]
    q, v = logits.shape[1], logits.shape[2]
    words = _all_allowed(len(rows) * q, v).view(len(rows), q, -1)
    for c, i in enumerate(rows):
        con = _lookahead(samplers[i])
        try:
            for j, d in enumerate(drafts[i][: q - 1]):
                w = words[c, j]
                if con.fill(w) and not (int(w[d >> 5]) >> (d & 31)) & 1:
                    break  # disallowed: the target's choice here cannot be d
                if not con.advance(d):  # never expected (the mask admitted it): end the run here
                    w[d >> 5] &= ~word_bit(d & 31)
                    break
            else:
                con.fill(words[c, len(drafts[i][: q - 1])])
        finally:
            con.rewind()
    idx = to_device(torch.tensor(rows, dtype=torch.int64), logits.device)
    masked = _apply_masks(logits[idx].reshape(len(rows) * q, v), words.view(len(rows) * q, -1))
    return rows, masked.view(len(rows), q, v)


def word_bit(i: int) -> int:
    """Bit i of an int32 word as a Python int in int32 range (bit 31 is the sign bit)."""
    return (1 << i) - (1 << 32) if i == 31 else 1 << i


def batch_probs(logits: torch.Tensor, samplers: list[RowSampler]) -> torch.Tensor:
    """logits: [B, V] float32 (penalized) -> [B, V] unnormalized distributions, row i equal to
    `samplers[i].probs(logits[i])`; rows of greedy samplers are computed at temperature 1."""
    v = logits.shape[1]
    ps = [s.params for s in samplers]
    knobs = torch.tensor(
        [
            [p.temperature or 1.0 for p in ps],
            [p.top_k if 0 < p.top_k < v else 0 for p in ps],
            [p.top_p for p in ps],
            [p.min_p for p in ps],
        ],
        dtype=logits.dtype,
    )  # [4, B]; top_k <= 248320 is exact in float32
    temp, top_k, top_p, min_p = to_device(knobs, logits.device)[:, :, None]  # 4 x [B, 1]
    x = _scaled(logits, temp)
    kmax = max((p.top_k for p in ps if 0 < p.top_k < v), default=0)
    if kmax:  # the k-th largest value of each row; rows without top-k keep everything
        kth = torch.topk(x, kmax, dim=-1).values.gather(1, (top_k.long() - 1).clamp(min=0))  # [B, 1]
        kth = torch.where(top_k > 0, kth, float("-inf"))
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if any(p.top_p < 1.0 for p in ps):
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        drop_sorted = ((cum - sorted_p) >= top_p) & (top_p < 1.0)
        drop_sorted[:, 0] = False  # the most probable token always stays, as in `RowSampler.probs`
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
    if any(p.min_p > 0.0 for p in ps):
        probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
    return probs


def sample_rows(
    logits: torch.Tensor, samplers: list[RowSampler], argmax: torch.Tensor | None = None
) -> list[int]:
    """logits: [B, V] float32; row i is sampled by samplers[i] alone. `argmax` [B]: the logits'
    argmax when the caller has it already (a decode graph computes it in-graph); used only when
    no penalty changes the logits.

    Same tokens as `[s.sample(logits[i]) ...]`: greedy rows share one argmax; stochastic rows
    draw `argmax(probs / Exp(1))` from their own generator, which is exactly what
    `torch.multinomial(probs, 1)` computes, without its per-row host check. The only host sync
    is the final transfer of the tokens (and the validity flags multinomial would raise on).
    """
    if logits.shape[0] == 0:
        return []
    tokens, bad = sample_rows_device(logits, samplers, argmax)
    if bad is None:
        return tokens.tolist()
    return check_drawn(torch.cat([tokens, bad]).tolist())


@dataclass
class LogprobRows:
    """Logprobs of the rows that asked for them, on the device until `read`."""

    rows: list[int]  # batch rows, in order
    chosen: torch.Tensor  # [N] float32: the sampled token's logprob
    top_vals: torch.Tensor  # [N, K] float32
    top_ids: torch.Tensor  # [N, K] int64

    def read(self, tokens: list[int], samplers: list[RowSampler], b: int) -> list[TokenLogprob | None]:
        """-> per batch row: its `TokenLogprob` (None for rows without logprobs). Syncs."""
        out: list[TokenLogprob | None] = [None] * b
        chosen, vals, ids = self.chosen.tolist(), self.top_vals.tolist(), self.top_ids.tolist()
        for j, i in enumerate(self.rows):
            k = samplers[i].logprobs or 0
            out[i] = TokenLogprob(tokens[i], chosen[j], tuple(zip(ids[j][:k], vals[j][:k], strict=True)))
        return out


def logprob_rows(
    adjusted: torch.Tensor, tokens: torch.Tensor, samplers: list[RowSampler]
) -> LogprobRows | None:
    """adjusted [B, V]: the processed logits (penalties, masks) -> log-softmax at temperature
    (1 for greedy rows) of the rows with logprobs: the chosen token's and the top-k."""
    rows = [i for i, s in enumerate(samplers) if s.logprobs is not None]
    if not rows:
        return None
    idx = to_device(torch.tensor(rows, dtype=torch.int64), adjusted.device)
    temp = to_device(torch.tensor([[samplers[i].params.temperature or 1.0] for i in rows]), adjusted.device)
    lp = torch.log_softmax(_scaled(adjusted[idx], temp), dim=-1)  # [N, V]
    chosen = lp.gather(1, tokens[idx][:, None])[:, 0]
    k = max(samplers[i].logprobs or 0 for i in rows)
    top = torch.topk(lp, k, dim=-1) if k else None
    empty = lp[:, :0]
    return LogprobRows(
        rows,
        chosen,
        top.values if top is not None else empty,
        top.indices if top is not None else empty.long(),
    )


def sample_with_logprobs(
    logits: torch.Tensor, samplers: list[RowSampler], argmax: torch.Tensor | None = None
) -> tuple[list[int], list[TokenLogprob | None] | None]:
    """`sample_rows` and, when a row asked for them, each row's logprobs (None for the others)."""
    tokens, bad, lp = sample_rows_full(logits, samplers, argmax)
    out = tokens.tolist() if bad is None else check_drawn(torch.cat([tokens, bad]).tolist())
    return out, None if lp is None else lp.read(out, samplers, len(out))


def sample_rows_device(
    logits: torch.Tensor, samplers: list[RowSampler], argmax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`sample_rows` without the transfer: -> (tokens [B] int64, bad [B] int64 or None) on the
    logits' device, `bad` set where a stochastic row's distribution was not valid (None when no
    row is stochastic). With no penalty and no stochastic row, tokens is `argmax` itself."""
    tokens, bad, _ = sample_rows_full(logits, samplers, argmax)
    return tokens, bad


def sample_rows_full(
    logits: torch.Tensor,
    samplers: list[RowSampler],
    argmax: torch.Tensor | None = None,
    penalized: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, LogprobRows | None]:
    """`sample_rows_device` and the logprobs of the rows that asked for them. `penalized`: the
    logits already carry every row's penalties (`PenaltyCounts.penalize`); only masks are applied."""
    b = logits.shape[0]
    adjusted = _masked(logits, samplers, shared=True) if penalized else _penalized(logits, samplers)
    if argmax is None or adjusted is not logits:
        argmax = torch.argmax(adjusted, dim=-1)
    logits, greedy_tok = adjusted, argmax  # [B, V], [B]
    stochastic = [i for i, s in enumerate(samplers) if s.params.temperature != 0.0]
    if not stochastic:
        return greedy_tok, None, logprob_rows(adjusted, greedy_tok, samplers)
    probs = batch_probs(logits, samplers)  # [B, V]
    q = torch.ones_like(probs)
    for i in stochastic:  # per-request generator: one launch per row, no sync
        q[i].exponential_(1.0, generator=samplers[i].generator)
    drawn = torch.argmax(probs / q, dim=-1)  # [B]
    is_stoch = torch.zeros(b, dtype=torch.bool)
    is_stoch[stochastic] = True
    is_stoch = to_device(is_stoch, logits.device)
    bad = is_stoch & ~((probs.amax(dim=-1) < float("inf")) & (probs.amin(dim=-1) >= 0))  # [B]
    tokens = torch.where(is_stoch, drawn, greedy_tok)
    return tokens, bad.long(), logprob_rows(adjusted, tokens, samplers)


def check_drawn(values: list[int]) -> list[int]:
    """[tokens..., bad flags...] (2B values, as transferred) -> the B tokens; raises as
    `torch.multinomial` would when a flag is set."""
    b = len(values) // 2
    if any(values[b:]):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    return values[:b]
