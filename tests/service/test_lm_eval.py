"""lm-evaluation-harness evaluates a tiny local task through `local-completions` and
`local-chat-completions` against the server (the package's `compat_server`, terse model).

The task (`data/lm_eval/ninfer_tiny.yaml`) is generate_until over a three-line local jsonl, run
with `limit` 2 in one subprocess (`lm_eval_run.py`) with the Hugging Face hubs offline: both model
classes must finish with 2 samples each, every HTTP response must be a 2xx and the 4 generations
done in the request log, with no `--client-compat` adjustment. Loglikelihood tasks are not
supported (the engine computes no prompt logprobs): the request lm-eval sends for them is a 400
that names `echo`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import requests

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


def test_loglikelihood_request_is_a_clear_400(compat_server: Server) -> None:
    # lm-eval local-completions' loglikelihood payload (LocalCompletionsAPI._create_payload)
    body = {"model": MODEL, "prompt": "Q: 2 + 2?\nA: 4", "temperature": 0, "max_tokens": 1, "logprobs": 1}
    body |= {"seed": 1234, "echo": True}
    r = requests.post(
        f"{compat_server.url}/v1/completions", json=body, headers=compat_server.headers(), timeout=60
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "echo" and "loglikelihood" in error["message"], error
