"""Thinking budgets: a thinking request reasons at most `budget` tokens (`</think>` included: the
contract counts the ids accepted in the reasoning channel); then the engine closes the reasoning
with the template's own end-of-thinking tokens and the answer follows.

The budget is a token mask (`ninfer.engine.sampler.TokenConstraint`): while reasoning, nothing is
masked (the model may end its thinking early); once the tokens left equal the close sequence up to
`</think>` (the template's "\\n</think>": the newline and `</think>`), only the next close token is
admitted, one position at a time, until the sequence is written (a budget of 1: `</think>` alone).
A masked position samples its one admitted token at any temperature, so the plain and the
speculative paths agree (drafts are verified under the same masks: a draft that leaves the close
sequence is rejected there).

A request with a grammar (`inner`) sees every token too: the grammar starts after `</think>` as
before, so the close stops at `</think>` (the grammar's answer follows at once, as when the model
closes its thinking itself), and the grammar's own reasoning limit still applies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ninfer.engine.sampler import DraftConstraint, word_bit

REASON, FORCE, ANSWER = "reason", "force", "answer"


@dataclass(frozen=True)
class ThinkClose:
    """The template's end of thinking as token ids: `before` `</think>` (`end`), then `after`."""

    before: tuple[int, ...]
    end: int
    after: tuple[int, ...]

    @classmethod
    def split(cls, ids: tuple[int, ...], end: int) -> ThinkClose:
        """From the ids of the rendered close ("\\n</think>\\n\\n") and the `</think>` id."""
        if ids.count(end) != 1:
            raise ValueError(f"the end-of-thinking tokens {ids} must hold </think> ({end}) once")
        i = ids.index(end)
        return cls(ids[:i], end, ids[i + 1 :])


@dataclass
class _State:
    phase: str
    left: int  # reasoning tokens still allowed (the forced ones through </think> included)
    queue: tuple[int, ...]  # close tokens still to write (FORCE)


class ThinkingBudget:
    """One request's budget (`DraftConstraint`), optionally around its grammar's matcher."""

    def __init__(self, budget: int, close: ThinkClose, inner: DraftConstraint | None = None) -> None:
        self.close = close
        self.inner = inner
        self._s = _State(REASON, budget, ())
        self._committed: _State | None = None  # the state to rewind to (speculative lookahead)
        self.forced = 0  # close tokens written because the budget ran out

    @property
    def in_reasoning(self) -> bool:
        return self._s.phase != ANSWER

    def _due(self, s: _State) -> _State:
        """The state at the next position: the close starts once only its part through `</think>`
        fits the tokens left (less room: `</think>` after the last tokens of the part before it)."""
        if s.phase == REASON and s.left <= len(self.close.before) + 1:
            room = max(0, s.left - 1)  # tokens of the part before </think> that fit
            before = self.close.before[len(self.close.before) - room :]
            after = () if self.inner is not None else self.close.after
            return _State(FORCE, s.left, (*before, self.close.end, *after))
        return s

    def fill(self, words: torch.Tensor) -> bool:
        s = self._s = self._due(self._s)
        if s.phase == FORCE:
            words.zero_()
            token = s.queue[0]
            words[token // 32] = word_bit(token % 32)
            return True
        if self.inner is not None:
            return self.inner.fill(words)
        return False

    def _step(self, s: _State, token: int) -> _State | None:
        """The state after `token`, or None when the mask of `s` does not admit it."""
        s = self._due(s)
        if s.phase == FORCE:
            if token != s.queue[0]:
                return None
            queue = s.queue[1:]
            left = s.left - 1 if self.close.end in s.queue else s.left  # through </think>: reasoning
            return _State(FORCE if queue else ANSWER, left, queue)
        if s.phase == REASON:
            if token == self.close.end:
                return _State(ANSWER, s.left, ())
            return _State(REASON, s.left - 1, ())
        return s

    def accept(self, token: int) -> None:
        nxt = self._step(self._s, token)
        if nxt is None:  # never expected: the mask admitted only the close token
            raise ValueError(f"token {token} outside the end-of-thinking sequence")
        if self._due(self._s).phase == FORCE:
            self.forced += 1
        self._s = nxt
        if self.inner is not None:
            self.inner.accept(token)

    def advance(self, token: int) -> bool:
        nxt = self._step(self._s, token)
        if nxt is None:
            return False
        if self.inner is not None and not self.inner.advance(token):  # both unchanged
            return False
        if self._committed is None:
            self._committed = self._s
        self._s = nxt
        return True

    def rewind(self) -> None:
        if self._committed is not None:
            self._s, self._committed = self._committed, None
        if self.inner is not None:
            self.inner.rewind()
