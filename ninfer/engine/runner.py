"""Executes a StepPlan against the model and the pools; the only code that touches device tensors."""

from __future__ import annotations

import time

import torch

from ninfer.engine.plan import DecodePlan, PrefillPlan, SlotOp, StepPlan, StepResult
from ninfer.engine.sampler import sample_rows
from ninfer.model.cache import ForwardBatch, KVPool, StatePool


class Runner:
    """Builds `ForwardBatch`es, runs the model, samples.

    Shapes are static per batch size: the page table is always `max_pages` wide (the pages of
    one max_context sequence), so decode batches can later be captured as CUDA graphs.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        kv: KVPool,
        states: StatePool,
        max_pages: int,
        device: torch.device,
        vocab_limit: int | None = None,
    ) -> None:
        self.model = model
        self.vocab_limit = vocab_limit
        self.kv = kv
        self.states = states
        self.max_pages = max_pages
        self.device = device

    def execute(self, plan: StepPlan) -> StepResult:
        t0 = time.perf_counter()
        with torch.inference_mode():
            if isinstance(plan, PrefillPlan):
                result = self._prefill(plan)
            else:
                result = self._decode(plan)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        result.seconds = time.perf_counter() - t0
        return result

    def _slot_ops(self, ops: list[SlotOp]) -> None:
        for op in ops:
            if op.src is None:
                self.states.zero_slot(op.dst)
            else:
                self.states.copy_slot(op.src, op.dst)

    def _batch(
        self, tokens: list[list[int]], starts: list[int], slots: list[int], pages: list[list[int]]
    ) -> ForwardBatch:
        b, q = len(tokens), len(tokens[0])
        dev = self.device
        table = torch.full((b, self.max_pages), -1, dtype=torch.int32)  # [B, max_pages]
        for i, p in enumerate(pages):
            table[i, : len(p)] = torch.tensor(p, dtype=torch.int32)
        lens = torch.tensor(starts, dtype=torch.int64)  # [B]
        pos = (lens[:, None] + torch.arange(q)).unsqueeze(0).expand(3, b, q)  # [3, B, q]
        return ForwardBatch(
            input_ids=torch.tensor(tokens, dtype=torch.int64).to(dev),  # [B, q]
            positions=pos.contiguous().to(dev),
            slots=torch.tensor(slots, dtype=torch.int64).to(dev),  # [B]
            page_table=table.to(dev),
            cache_lens=lens.to(dev),
        )

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, H] -> float32 logits [B, V] with the padded ids (>= vocab_limit) at -inf."""
        logits = self.model.logits(hidden)
        if self.vocab_limit is not None and self.vocab_limit < logits.shape[-1]:
            logits[..., self.vocab_limit :] = float("-inf")
        return logits

    def _prefill(self, plan: PrefillPlan) -> StepResult:
        self._slot_ops(plan.ops_before)
        batch = self._batch([plan.tokens], [plan.start], [plan.slot], [plan.pages])
        hidden = self.model(batch, self.kv, self.states)  # [1, q, H]
        self._slot_ops(plan.ops_after)
        if plan.sampler is None:
            return StepResult(seq_ids=[], tokens=[])
        logits = self._logits(hidden[:, -1])  # [1, V] float32
        return StepResult(seq_ids=[plan.seq_id], tokens=sample_rows(logits, [plan.sampler]))

    def _decode(self, plan: DecodePlan) -> StepResult:
        rows = plan.rows
        batch = self._batch(
            [[r.token] for r in rows],
            [r.position for r in rows],
            [r.slot for r in rows],
            [r.pages for r in rows],
        )
        hidden = self.model(batch, self.kv, self.states)  # [B, 1, H]
        logits = self._logits(hidden[:, -1])  # [B, V] float32
        tokens = sample_rows(logits, [r.sampler for r in rows])
        return StepResult(seq_ids=[r.seq_id for r in rows], tokens=tokens)
