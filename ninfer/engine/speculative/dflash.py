"""The DFlash drafter in the engine: per-request context K/V from the target's captured layer outputs,
one non-causal draft forward over [anchor, MASK x k] per round.

Context K/V: every token the target ran and whose state is kept (prefill chunks, plain steps, the
committed prefix of a verify round) gets, in each draft layer, K/V projected from
hidden_norm(fc(cat of the target's layer outputs at `target_layer_ids`)). They live in the drafter's
own KV pool with as many pages as the trunk's, indexed by the request's page ids, so the context is
retained, reused and freed together with the trunk's KV: an entry depends only on its token's
features and position, so a reused prefix needs no rebuild and GDN slot operations need no mirror.

The features of a forward are found by the identity of the hidden rows handed to `after_forward`:
a forward hook keeps the last few trunk outputs with the layer outputs captured alongside.
"""

from __future__ import annotations

from collections import deque

import torch

from ninfer.engine.pages import PAGE
from ninfer.engine.plan import DecodeRow, SlotOp
from ninfer.engine.sampler import rewind
from ninfer.engine.speculative.mtp import Proposal, mask_vocab, proposals
from ninfer.engine.speculative.rejection import draft_step, plain_greedy, propose
from ninfer.model.cache import KVPool
from ninfer.model.dflash import DFlashDrafter

KEEP_FORWARDS = 4  # trunk forwards whose captured features stay reachable (a round runs at most 3)


class DFlashEngineDrafter:
    name = "dflash"

    def __init__(
        self,
        model: torch.nn.Module,
        drafter: DFlashDrafter,
        num_pages: int,
        dtype: torch.dtype,
        device: torch.device,
        vocab_limit: int | None = None,
    ) -> None:
        cfg = drafter.cfg
        bad = [i for i in cfg.target_layer_ids if not 0 <= i < len(model.layers)]
        if bad:
            raise ValueError(f"DFlash target_layer_ids {bad} outside the target's {len(model.layers)} layers")
        if cfg.hidden_size != model.config.hidden_size:
            raise ValueError(
                f"DFlash hidden_size {cfg.hidden_size} != the target's {model.config.hidden_size}"
            )
        self.model, self.drafter, self.cfg = model, drafter, cfg
        self.layer_ids = cfg.target_layer_ids
        model.capture_layers = tuple(sorted(set(self.layer_ids)))
        self.kv = KVPool(
            cfg.num_hidden_layers, num_pages, PAGE, cfg.num_key_value_heads, cfg.head_dim, dtype, device
        )
        self.device = device
        self.vocab_limit = vocab_limit
        self._recent: deque[tuple[torch.Tensor, dict[int, torch.Tensor]]] = deque(maxlen=KEEP_FORWARDS)
        self._hook = model.register_forward_hook(self._keep)

    def _keep(self, module: torch.nn.Module, args: object, out: torch.Tensor) -> None:
        self._recent.append((out, module.captured))

    def close(self) -> None:
        self._hook.remove()
        self.model.capture_layers = ()

    def _features(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [q, H] rows of a recent trunk output [B, q', H] -> their features [q, L*H]."""
        for out, captured in reversed(self._recent):
            if out.untyped_storage().data_ptr() != hidden.untyped_storage().data_ptr():
                continue
            j, rest = divmod(hidden.storage_offset() - out.storage_offset(), out.stride(0))
            if rest != 0 or not 0 <= j < out.shape[0]:
                break
            q = hidden.shape[0]
            return torch.cat([captured[i][j, :q] for i in self.layer_ids], -1)
        raise RuntimeError("DFlash drafter: the hidden rows handed over come from no recent trunk forward")

    # ----- context K/V -----
    def lane_state(self) -> tuple[list[KVPool], None]:
        """The drafter's context KV on the lane's page ids (an entry depends only on its own token)."""
        return [self.kv], None

    def slot_op(self, op: SlotOp) -> None:
        """Nothing per slot: context entries live on the request's KV pages."""

    def after_forward(
        self,
        slot: int,
        start: int,
        tokens: list[int],
        hidden: torch.Tensor,
        rope: torch.Tensor,
        pages: list[int],
        catch_up: bool,
    ) -> None:
        """The trunk fed `tokens` at cache positions start.. (kept): write their context K/V."""
        q = len(tokens)
        if start + q > len(pages) * PAGE:
            raise RuntimeError(
                f"DFlash drafter: positions {start}..{start + q - 1} beyond the request's pages"
            )
        feats = self._features(hidden)  # [q, L*H]
        pos = torch.arange(start, start + q, device=self.device)  # [q] (text-only: plain positions)
        page_ids = torch.tensor(pages, dtype=torch.int64, device=self.device)
        rows = page_ids[pos // PAGE] * PAGE + pos % PAGE  # [q] flat pool rows
        for layer, (k, v) in enumerate(self.drafter.context_kv(feats.to(self.kv.dtype), pos)):
            self.kv.k[layer].view(-1, *k.shape[1:])[rows] = k
            self.kv.v[layer].view(-1, *v.shape[1:])[rows] = v

    def _context(
        self, rows: list[DecodeRow]
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
        """Per draft layer the padded context (K, V) [B, C, nkv, D], positions [B, C], validity [B, C]."""
        c = max(r.cached for r in rows)
        pos = torch.arange(c)  # [C]
        flat = torch.zeros(len(rows), c, dtype=torch.int64)
        for b, r in enumerate(rows):
            p = pos[: r.cached]
            flat[b, : r.cached] = torch.tensor(r.pages, dtype=torch.int64)[p // PAGE] * PAGE + p % PAGE
        valid = (pos[None, :] < torch.tensor([r.cached for r in rows])[:, None]).to(self.device)
        flat = flat.to(self.device)
        ctx = []
        for layer in range(self.cfg.num_hidden_layers):
            k, v = self.kv.k[layer], self.kv.v[layer]
            ctx.append((k.view(-1, *k.shape[2:])[flat], v.view(-1, *v.shape[2:])[flat]))
        return ctx, pos.to(self.device).expand(len(rows), c), valid

    # ----- drafting -----
    def propose(self, rows: list[DecodeRow], k: int) -> list[Proposal]:
        """k drafts per row from one block forward: [anchor = the row's token, MASK x k]."""
        ids = torch.tensor([[r.token] + [self.cfg.mask_token_id] * k for r in rows], device=self.device)
        embeds = self.model.embed_tokens(ids) * self.cfg.input_embedding_scale  # [B, k+1, H]
        first = torch.tensor([r.cached for r in rows], device=self.device)
        positions = first[:, None] + torch.arange(k + 1, device=self.device)  # [B, k+1]
        ctx, ctx_pos, valid = self._context(rows)
        hidden = self.drafter(embeds, positions, ctx, ctx_pos, valid)  # [B, k+1, H]
        logits = mask_vocab(
            self.drafter.logits(hidden[:, 1:], self.model.lm_head), self.vocab_limit
        )  # [B, k, V]
        samplers = [r.sampler for r in rows]
        if any(s.constraint is not None for s in samplers):
            drafts: list[list[int]] = [[] for _ in rows]
            probs: list[list[torch.Tensor]] = [[] for _ in rows]
            try:
                for j in range(k):  # position by position: a constrained row's mask follows its drafts
                    draft_step(samplers, logits[:, j], drafts, probs)
            finally:
                rewind(samplers)
            return proposals(drafts, probs)
        argmax = logits.argmax(-1).tolist()  # one transfer for the plain greedy rows
        out = []
        for i, r in enumerate(rows):
            if plain_greedy(r.sampler):
                out.append(Proposal(argmax[i], None))
                continue
            row: list[int] = []
            row_probs: list[torch.Tensor] = []
            for j in range(k):
                d, q = propose(r.sampler, logits[i, j], row)
                row.append(d)
                if q is not None:
                    row_probs.append(q)
            out.append(Proposal(row, torch.stack(row_probs) if row_probs else None))
        return out
