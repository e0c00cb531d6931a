"""Engine greedy output equals a plain one-sequence loop over the model (ninfer.offline's reference)."""

from __future__ import annotations

from ninfer.engine.types import GenerationRequest, SamplingParams
from ninfer.offline import LLM
from tests.engine.tiny import make_engine


def test_engine_matches_plain_greedy_loop(small_model) -> None:
    ref = LLM.from_model(small_model)
    prompts = [[(i * 31 + s) % 500 + 1 for i in range(n)] for s, n in enumerate((7, 70, 150, 33))]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    want = [list(o.token_ids) for o in ref.generate_reference(prompts, params)]
    eng = make_engine(small_model, max_concurrency=4, kv_capacity=1024, prefill_chunk=48)
    handles = [
        eng.submit(eng.reserve(), GenerationRequest(f"r{i}", tuple(p), params)) for i, p in enumerate(prompts)
    ]
    got = [h.result(60)[0] for h in handles]
    eng.shutdown(5)
    assert got == want


def test_offline_engine_is_built_from_its_own_settings(small_model, monkeypatch) -> None:
    monkeypatch.setenv("NINFER_KV_DTYPE", "int8")  # the process's variables do not reach it
    monkeypatch.setenv("NINFER_ENGINE_PREFILL_CHUNK", "7")
    llm = LLM.from_model(small_model)
    try:
        cfg = llm._engine(3, 100).config
        assert (cfg.max_concurrency, cfg.max_context, cfg.kv_capacity) == (3, 128, 3 * 128)
        assert (cfg.prefill_chunk, cfg.kv_dtype, cfg.thinking_preset, cfg.vocab_limit) == (
            512,
            None,
            None,
            None,
        )
        assert (cfg.device, cfg.dtype) == ("cpu", "float32")
        assert llm._engine(2, 128).config is cfg  # reused while it is large enough
    finally:
        llm.close()
