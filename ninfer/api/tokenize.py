"""POST /tokenize and /detokenize: the artifact's tokenizer, without the chat template or the engine.

`/tokenize` takes `{"prompt": str}` and answers `{"tokens": [...], "count": n, "max_model_len": N}`;
`/detokenize` takes `{"tokens": [...]}` and answers `{"prompt": str}` (special tokens kept).
"""

from __future__ import annotations

import falcon

from ninfer.api import fields as f
from ninfer.api.completions import prompt_ids
from ninfer.api.context import ApiContext
from ninfer.api.fields import parse_body


class TokenizeResource:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = parse_body(req.context.body)
        f.reject_unknown(body, ("model", "prompt"))
        prompt = f.req_str(body, "prompt", nonempty=False)
        tokens = self.ctx.tokenizer().encode(prompt)
        served = self.ctx.require_served()
        resp.media = {"tokens": tokens, "count": len(tokens), "max_model_len": served.max_context}


class DetokenizeResource:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = parse_body(req.context.body)
        f.reject_unknown(body, ("model", "tokens"))
        tokens = f.req_list(body, "tokens", nonempty=False)
        text = prompt_ids(tokens, self.ctx.tokenizer(), "tokens")[1] if tokens else ""
        resp.media = {"prompt": text}


def routes(ctx: ApiContext) -> list[tuple[str, object]]:
    return [("/tokenize", TokenizeResource(ctx)), ("/detokenize", DetokenizeResource(ctx))]
