"""Speculative decoding: MTP and DFlash drafting, exact verification (greedy and rejection sampling), counters.

Module map:
    rejection.py   verification of k drafts against the target's k+1 logit rows (pure torch)
    counters.py    the per-request `speculative` object of request_done
    draft_head.py  the reduced-vocabulary proposal head (rows of lm_head for N frequent ids)
    mtp.py         the MTP drafter: its own one-layer KV pool, per-slot pending hidden rows
    dflash.py      the DFlash block drafter: context K/V from captured target layers, [anchor, MASK x k]
    oracle.py      a testing/benchmarking aid: drafts are the target's own greedy continuation
    decoder.py     one speculative decode round (draft -> verify -> accept) and the state fix-up
    build.py       startup checks and construction from EngineConfig
    load.py        loading the MTP head, proposal head or DFlash drafter from the artifact (only with --spec)

Engine hooks (the only places the engine knows about speculation, all behind the runner): the
runner hands decode plans to `SpecDecoder.decode`, which returns the one `StepResult` shape (a run
of tokens per row, drafted and accepted counts), and reports slot operations and prefill hidden
rows to it; the engine commits each row's run token by token until a stop or the length limit,
then calls `Runner.settle` with the committed counts, which runs the round's state fix-up
(`SpecDecoder.settle`). Grammar-constrained rows are drafted and verified
under their masks through the sampler's lookahead (`docs/grammar.md`, "Speculative decoding").
"""
