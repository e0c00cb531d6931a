"""lm-evaluation-harness evaluates tiny local tasks against the server (the package's
`compat_server`, terse model), each in one subprocess (`lm_eval_run.py`) with the Hugging Face
hubs offline.

generate_until (`data/lm_eval/ninfer_tiny.yaml`, a three-line local jsonl, `limit` 2) through
`local-completions` and `local-chat-completions`: both model classes must finish with 2 samples
each, every HTTP response must be a 2xx and the 4 generations done in the request log, with no
`--client-compat` adjustment.

loglikelihood (`ninfer_tiny_mc.yaml`, multiple choice) through `local-completions` with token-id
prompts (echo + logprobs, max_tokens 1): every choice's loglikelihood and greediness lm-eval
reports equal those of the artifact's model computed here by a plain forward (`LLM.logits`), the
prompts split as lm-eval splits them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.service.conftest import API_KEY, HERE, MODEL, ROOT, Server, Traffic

LIMIT = 2


def test_generate_until_task_both_model_classes(compat_server: Server, tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "OPENAI_API_KEY": API_KEY,  # lm-eval's local API models send it as the bearer token
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "TOKENIZERS_PARALLELISM": "false",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    traffic = Traffic(compat_server)
    argv = [sys.executable, str(HERE / "lm_eval_run.py"), compat_server.url, MODEL, str(LIMIT)]
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = out.stdout + out.stderr[-6000:]
    assert out.returncode == 0, output
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(summary) == {"local-completions", "local-chat-completions"}, summary
    assert all(s["samples"] == LIMIT and 0.0 <= s["exact_match"] <= 1.0 for s in summary.values()), summary
    done = traffic.check(output)
    assert sorted(e["protocol"] for e in done) == ["chat_completions"] * LIMIT + ["completions"] * LIMIT
    assert all(e["compat_adjustments"] == [] for e in done)


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "OPENAI_API_KEY": API_KEY,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "TOKENIZERS_PARALLELISM": "false",
        "NO_PROXY": "127.0.0.1,localhost",
    }


def test_loglikelihood_task_matches_the_model(
    compat_server: Server, demo_cache: Path, tmp_path: Path
) -> None:
    from transformers import PreTrainedTokenizerFast

    from ninfer.offline import LLM
    from tests.service.terse_artifact import ensure_terse_artifact

    artifact = ensure_terse_artifact(demo_cache)
    tok_dir = tmp_path / "tokenizer"  # what lm-eval's Hugging Face backend loads
    tok_dir.mkdir()
    shutil.copy(Path(artifact) / "tokenizer" / "tokenizer.json", tok_dir / "tokenizer.json")
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    traffic = Traffic(compat_server)
    argv = [sys.executable, str(HERE / "lm_eval_run.py"), compat_server.url, MODEL, "3", str(tok_dir)]
    out = subprocess.run(argv, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    output = out.stdout + out.stderr[-6000:]
    assert out.returncode == 0, output
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["samples"] == 3 and 0.0 <= summary["acc"] <= 1.0, summary
    scored = summary["scored"]
    assert len(scored) == 8, scored  # 3 + 2 + 3 choices
    done = traffic.check(output)
    assert [e["protocol"] for e in done] == ["completions"] * 8
    assert all(e["compat_adjustments"] == [] for e in done)
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"))
    llm = LLM(artifact)
    for context, continuation, loglikelihood, greedy in scored:
        whole = hf(context + continuation, add_special_tokens=False)["input_ids"]
        n_ctx = len(hf(context, add_special_tokens=False)["input_ids"])
        lsm = torch.log_softmax(llm.logits(whole), dim=-1)  # [n, V]
        want = [float(lsm[i - 1, whole[i]]) for i in range(n_ctx, len(whole))]
        best = all(int(lsm[i - 1].argmax()) == whole[i] for i in range(n_ctx, len(whole)))
        assert loglikelihood == pytest.approx(sum(want), abs=1e-3), (context, continuation)
        assert greedy == best, (context, continuation)
