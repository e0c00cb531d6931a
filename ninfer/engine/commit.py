"""Committing a step's runs of tokens: stops and max tokens, outputs to handles, then `Runner.settle`."""

from __future__ import annotations

from collections.abc import Callable

from ninfer.engine.counters import Counters
from ninfer.engine.handle import Outbox, RequestHandle
from ninfer.engine.plan import DecodePlan, PrefillPlan, StepResult
from ninfer.engine.retire import Retirer
from ninfer.engine.scheduler import DECODE, Scheduler, Seq
from ninfer.engine.speculative import counters as spec_counters
from ninfer.engine.types import FinishReason, StepOutput, TokenLogprob

# `Runner.settle`: (a step's result, tokens committed per row or None) -> seconds spent
Settle = Callable[[StepResult, list[int | None]], float]


class Committer:
    """Applies a `StepResult` to the live requests on the engine thread."""

    def __init__(
        self,
        scheduler: Scheduler,
        counters: Counters,
        retirer: Retirer,
        seqs: dict[int, Seq],
        handles: dict[int, RequestHandle],
        outbox: Outbox,
        settle: Settle,
    ) -> None:
        self.settle = settle  # the runner's: GPU work a step leaves until its tokens are committed
        self.outbox = outbox  # token outputs go out once the next step is launched
        self.scheduler = scheduler
        self.counters = counters
        self.retirer = retirer
        self.seqs = seqs
        self.handles = handles

    def prefill(self, plans: list[PrefillPlan], result: StepResult, now: float) -> None:
        """Account the prefill chunks of one step (one request's, or several in one replay); a
        request's final chunk samples its first token."""
        first = {sid: i for i, sid in enumerate(result.seq_ids)}  # rows that sampled
        for plan in plans:
            seq = self.seqs[plan.seq_id]
            self.scheduler.prefill_done(seq, plan)
            seq.stats.computed_prefill_tokens += len(plan.tokens)
            seq.stats.vision_s += result.vision_seconds
            if seq.phase == DECODE:
                self.retirer.drop_media(seq)  # the prompt is in the cache: its payloads are not needed
            if result.prompt_logprobs is not None:
                seq.prompt_lps.extend(result.prompt_logprobs)
            scored = None
            if seq.phase == DECODE and plan.prompt_logprobs is not None:
                scored = tuple(seq.prompt_lps)
            i = first.get(plan.seq_id)
            if i is not None:
                seq.t_first = now
                lps = result.logprobs[i] if result.logprobs else None
                (token,) = result.runs[i]  # a prompt's first token
                self.token(seq, token, now, lp=None if lps is None else lps[0], prompt_lps=scored)
            elif seq.phase == DECODE and seq.entitlement == 0:  # scoring only: no token is generated
                seq.t_first = now
                out = StepOutput(token_ids=(), finish_reason="length", text="", prompt_logprobs=scored)
                self.retirer.end(seq, out, keep=False)
        self.counters.add(prefill_tokens=sum(len(p.tokens) for p in plans), prefill_seconds=result.seconds)

    def decode(self, plan: DecodePlan, result: StepResult, now: float, ahead: bool = False) -> None:
        """Commit each row's run of tokens until its request finishes (stop or length), then let
        the runner settle the step (`settle`: a speculative round's lane state fix-up).

        `ahead`: the next round, over these rows, is already launched; a request finishing here
        has its last token fed by it, so its lane is retained with that token computed. Rows whose
        request finished in the round before (a launched-ahead round) are skipped."""
        decoded, rows = 0, 0
        committed: list[int | None] = []  # per row: tokens committed, None where no lane state is retained
        for i, sid in enumerate(result.seq_ids):
            seq = self.seqs.get(sid)
            if seq is None:  # finished while this round was in flight: its tokens are void
                committed.append(None)
                continue
            rows += 1
            lps = result.logprobs[i] if result.logprobs else None
            stats = seq.stats.speculative  # empty for a request decoded without drafts
            spec_counters.begin_row(stats, result.drafted[i])
            n = 0
            for token in result.runs[i]:
                if n < result.accepted[i]:
                    spec_counters.commit_draft(stats, n)
                self.scheduler.decode_fed(seq)
                n += 1
                if self.token(seq, token, now, ahead, None if lps is None else lps[n - 1]):
                    break
            decoded += n
            retained = seq.lane is not None and seq.lane.computed > 0
            committed.append(n if retained else None)
        seconds = result.seconds
        try:  # bring each retained lane's state to exactly its committed tokens
            seconds += self.settle(result, committed)
        except Exception as exc:
            self.retirer.drop_rows(plan, f"{type(exc).__name__}: {exc}")
        self.counters.add(
            decode_tokens=decoded,
            decode_rounds=1,
            decode_row_rounds=rows,
            decode_seconds=seconds,
        )

    def token(
        self,
        seq: Seq,
        token: int,
        now: float,
        ahead: bool = False,
        lp: TokenLogprob | None = None,
        prompt_lps: tuple[TokenLogprob | None, ...] | None = None,
    ) -> bool:
        """Commit one token; True when it finished the request (`ahead`: see `decode`;
        `prompt_lps`: the prompt logprobs, on the first token)."""
        self.scheduler.commit(seq, token)
        try:
            text, hit = seq.stops.push(token)
            finish: FinishReason | None = None
            if hit is not None:
                finish = "stop"
            elif len(seq.generated) >= seq.entitlement:
                finish = "length"
                tail = seq.stops.flush()
                text = None if text is None else text + (tail or "")
        except ValueError as exc:  # e.g. a token id the tokenizer cannot decode
            out = StepOutput(token_ids=(token,), finish_reason="error", error=str(exc))
            self.retirer.end(seq, out, keep=False)
            return True
        out = StepOutput(
            token_ids=(token,),
            finish_reason=finish,
            stop_string=hit.string if hit is not None else None,
            stop_token_id=hit.token_id if hit is not None else None,
            text=text,
            logprobs=None if lp is None else (lp,),
            prompt_logprobs=prompt_lps,
        )
        if finish is None:
            self.outbox.put(self.handles[seq.id], out)
            return False
        if ahead:  # the launched next round feeds this token: the retained state will include it
            self.scheduler.decode_fed(seq)
        self.retirer.end(seq, out, keep=True)
        return True
