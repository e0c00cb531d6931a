"""Committing a step's runs of tokens: stops and max tokens, outputs to handles, then `Runner.settle`."""

from __future__ import annotations

from collections.abc import Callable

from ninfer.engine.counters import Counters
from ninfer.engine.handle import Outbox
from ninfer.engine.plan import DecodePlan, PrefillPlan, StepResult
from ninfer.engine.request import DECODE, Request
from ninfer.engine.retire import Retirer
from ninfer.engine.scheduler import Scheduler
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
        outbox: Outbox,
        settle: Settle,
    ) -> None:
        self.settle = settle  # the runner's: GPU work a step leaves until its tokens are committed
        self.outbox = outbox  # token outputs go out once the next step is launched
        self.scheduler = scheduler
        self.counters = counters
        self.retirer = retirer

    def prefill(self, plans: list[PrefillPlan], result: StepResult, now: float) -> None:
        """Account the prefill chunks of one step (one request's, or several in one replay); a
        request's final chunk samples its first token."""
        first = {sid: i for i, sid in enumerate(result.seq_ids)}  # rows that sampled
        for plan in plans:
            req = self.scheduler.by_id[plan.seq_id]
            self.scheduler.prefill_done(req, plan)
            req.stats.computed_prefill_tokens += len(plan.tokens)
            req.stats.vision_s += result.vision_seconds
            if req.phase == DECODE:
                self.retirer.drop_media(req)  # the prompt is in the cache: its payloads are not needed
            if result.prompt_logprobs is not None:
                req.prompt_lps.extend(result.prompt_logprobs)
            scored = None
            if req.phase == DECODE and plan.prompt_logprobs is not None:
                scored = tuple(req.prompt_lps)
            i = first.get(plan.seq_id)
            if i is not None:
                req.t_first = now
                lps = result.logprobs[i] if result.logprobs else None
                (token,) = result.runs[i]  # a prompt's first token
                self.token(req, token, now, lp=None if lps is None else lps[0], prompt_lps=scored)
            elif req.phase == DECODE and req.entitlement == 0:  # scoring only: no token is generated
                req.t_first = now
                out = StepOutput(token_ids=(), finish_reason="length", text="", prompt_logprobs=scored)
                self.retirer.end(req, out, keep=False)
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
            req = self.scheduler.get(sid)
            if req is None:  # finished while this round was in flight: its tokens are void
                committed.append(None)
                continue
            rows += 1
            lps = result.logprobs[i] if result.logprobs else None
            stats = req.stats.speculative  # empty for a request decoded without drafts
            spec_counters.begin_row(stats, result.drafted[i])
            n = 0
            for token in result.runs[i]:
                if n < result.accepted[i]:
                    spec_counters.commit_draft(stats, n)
                self.scheduler.decode_fed(req)
                n += 1
                if self.token(req, token, now, ahead, None if lps is None else lps[n - 1]):
                    break
            decoded += n
            retained = req.lane is not None and req.lane.cached > 0
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
        req: Request,
        token: int,
        now: float,
        ahead: bool = False,
        lp: TokenLogprob | None = None,
        prompt_lps: tuple[TokenLogprob | None, ...] | None = None,
    ) -> bool:
        """Commit one token; True when it finished the request (`ahead`: see `decode`;
        `prompt_lps`: the prompt logprobs, on the first token)."""
        self.scheduler.commit(req, token)
        try:
            text, hit = req.stops.push(token)
            finish: FinishReason | None = None
            if hit is not None:
                finish = "stop"
            elif len(req.generated) >= req.entitlement:
                finish = "length"
                tail = req.stops.flush()
                text = None if text is None else text + (tail or "")
        except ValueError as exc:  # e.g. a token id the tokenizer cannot decode
            out = StepOutput(token_ids=(token,), finish_reason="error", error=str(exc))
            self.retirer.end(req, out, keep=False)
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
            self.outbox.put(req.handle, out)
            return False
        if ahead:  # the launched next round feeds this token: the retained state will include it
            self.scheduler.decode_fed(req)
        self.retirer.end(req, out, keep=True)
        return True
