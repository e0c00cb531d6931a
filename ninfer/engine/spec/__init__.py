"""Speculative decoding: MTP drafting, exact verification (greedy and rejection sampling), counters.

Module map:
    rejection.py   verification of k drafts against the target's k+1 logit rows (pure torch)
    counters.py    the per-request `speculative` object of request_done
    draft_head.py  the reduced-vocabulary proposal head (rows of lm_head for N frequent ids)
    mtp.py         the MTP drafter: its own one-layer KV pool, per-slot pending hidden rows
    oracle.py      a benchmarking aid: drafts are the target's own greedy continuation
    decoder.py     one speculative decode round (draft -> verify -> accept) and the state fix-up
"""
