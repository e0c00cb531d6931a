"""NInfer media: acquisition, decoding and preparation of images / videos into BF16 vision patches.

Modules: `errors` (MediaError, codes), `fetch` (bounded data-URI / HTTP(S) acquisition with the
address policy), `config` (processor parameters, PreparedMedia), `pixels` (smart_resize,
normalise, patchify), `image` / `video` (decode + BF16-pack, matching transformers), `cache`
(LRU + single flight + live-byte refcounts + preparation permit + worker pool), `preprocess`
(request-level preprocessing and budgets).
"""
