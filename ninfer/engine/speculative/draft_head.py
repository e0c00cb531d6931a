"""The reduced-vocabulary proposal head: draft logits over N frequent ids, -inf for every other id."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ninfer.engine.types import EngineConfigError
from ninfer.formats import QuantWeight
from ninfer.kernels.ops import Ops
from ninfer.kernels.quant_ref import qlinear


class DraftHead:
    """Rows of lm_head for `token_ids`; `logits` maps them back onto the full vocabulary.

    For greedy drafting the argmax over the reduced rows is the draft; for stochastic requests
    the draft distribution is defined over the reduced ids and is zero elsewhere (rejection
    sampling against the full-head target stays exact).
    """

    def __init__(
        self,
        token_ids: torch.Tensor,
        weight: torch.Tensor | QuantWeight,
        vocab_size: int,
        ops: Ops | None = None,
    ) -> None:
        n = token_ids.shape[0]
        if token_ids.dim() != 1 or len(weight.shape) != 2 or weight.shape[0] != n or n == 0:
            raise EngineConfigError(
                f"lm_head_draft: token_ids {tuple(token_ids.shape)} and weight {tuple(weight.shape)} "
                "must be [N] and [N, H] with N > 0"
            )
        ids = token_ids.to(torch.int64)
        if int(ids.min()) < 0 or int(ids.max()) >= vocab_size or ids.unique().numel() != n:
            raise EngineConfigError(f"lm_head_draft: token_ids must be unique ids in [0, {vocab_size})")
        if n > 1 and not bool((ids[1:] > ids[:-1]).all()):  # ascending: argmax ties go to the lowest id
            ids, order = ids.sort()
            order = order.to(weight.device)
            weight = weight.select_rows(order) if isinstance(weight, QuantWeight) else weight[order]
        self.token_ids = ids  # [N] int64, ascending
        self.weight = weight  # [N, H] dense, or quantized (rows of a quantized lm_head)
        self.ops = ops  # the backend's qlinear for a quantized weight (None: the reference)
        self.vocab_size = vocab_size
        self._limits: dict[int, torch.Tensor] = {}  # vocab_limit -> columns at or past it [n] int64

    @classmethod
    def from_tensors(
        cls,
        tensors: Mapping[str, torch.Tensor | QuantWeight],
        vocab_size: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
        ops: Ops | None = None,
    ) -> DraftHead:
        if set(tensors) != {"token_ids", "weight"}:
            raise EngineConfigError(
                f"lm_head_draft: expected tensors token_ids and weight, got {sorted(tensors)}"
            )
        w, ids = tensors["weight"], tensors["token_ids"]
        if len(w.shape) != 2 or w.shape[1] != hidden_size or isinstance(ids, QuantWeight):
            raise EngineConfigError(f"lm_head_draft: weight {tuple(w.shape)} is not [N, {hidden_size}]")
        weight = w.to(device) if isinstance(w, QuantWeight) else w.to(device=device, dtype=dtype)
        return cls(ids.to(device), weight, vocab_size, ops)

    def _small(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, H] -> float32 logits over the reduced ids [B, N]."""
        if isinstance(self.weight, QuantWeight):
            run = qlinear if self.ops is None else self.ops.qlinear
            return run(hidden, self.weight).float()
        return (hidden @ self.weight.T).float()

    @property
    def size(self) -> int:
        return int(self.token_ids.shape[0])

    def greedy(self, hidden: torch.Tensor, vocab_limit: int | None = None) -> torch.Tensor:
        """hidden: [B, H] -> [B] int64 the argmax of `logits` (ids >= vocab_limit excluded) without
        the full-vocabulary row: ids are ascending, so ties resolve to the lowest id as there."""
        small = self._small(hidden)  # [B, N]
        if vocab_limit is not None:
            cols = self._limits.get(vocab_limit)
            if cols is None:
                cols = torch.nonzero(self.token_ids >= vocab_limit).view(-1)
                self._limits[vocab_limit] = cols
            if cols.numel():
                small.index_fill_(1, cols, float("-inf"))
        return self.token_ids[small.argmax(-1)]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [B, H] -> float32 logits [B, V], -inf outside the reduced ids."""
        small = self._small(hidden)  # [B, N]
        out = torch.full((hidden.shape[0], self.vocab_size), float("-inf"), device=hidden.device)
        out[:, self.token_ids] = small
        return out
