"""Run lm-eval on the tiny local tasks against the server.

`python tests/service/lm_eval_run.py SERVER_URL MODEL LIMIT` evaluates `data/lm_eval/ninfer_tiny`
(generate_until, a local jsonl) with lm-eval's own API model classes `local-completions` and
`local-chat-completions`, one after the other in this one process (lm-eval's import is the slow
part), and prints one JSON line: `{model class: {"samples": n, "exact_match": x}}`.

`... SERVER_URL MODEL LIMIT TOKENIZER_DIR` evaluates `data/lm_eval/ninfer_tiny_mc` (multiple
choice: loglikelihood requests, echo + logprobs over token-id prompts) with `local-completions`
and the Hugging Face tokenizer in TOKENIZER_DIR, and prints `{"samples": n, "acc": x, "scored":
[[context, continuation, loglikelihood, is_greedy], ...]}`.

The API key is lm-eval's `OPENAI_API_KEY`. Run by `test_lm_eval.py` in a subprocess with the
Hugging Face hubs offline.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

TASK_DIR = Path(__file__).resolve().parent / "data" / "lm_eval"
TASK = "ninfer_tiny"
MC_TASK = "ninfer_tiny_mc"


def task_config(task: str = TASK) -> dict[str, Any]:
    config = yaml.safe_load((TASK_DIR / f"{task}.yaml").read_text())
    files = config["dataset_kwargs"]["data_files"]
    files["test"] = str(TASK_DIR / files["test"])
    return config


def model_args(url: str, model: str, chat: bool) -> dict[str, Any]:
    """No tokenizer: lm-eval would probe /tokenizer_info (absent here) and then download one."""
    return {
        "model": model,
        "base_url": f"{url}/v1/chat/completions" if chat else f"{url}/v1/completions",
        "tokenizer_backend": "none",
        "tokenized_requests": False,
        "max_retries": 1,
        "timeout": 120,
    }


def main(url: str, model: str, limit: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    manager = TaskManager(include_path=str(TASK_DIR), include_defaults=False)
    for kind, chat in (("local-completions", False), ("local-chat-completions", True)):
        results = simple_evaluate(
            model=kind,
            model_args=model_args(url, model, chat),
            tasks=[task_config()],
            limit=limit,
            task_manager=manager,
            apply_chat_template=chat,
            bootstrap_iters=0,
        )
        assert results is not None
        metrics = results["results"][TASK]
        out[kind] = {
            "samples": results["n-samples"][TASK]["effective"],
            "exact_match": metrics["exact_match,none"],
        }
    return out


def loglikelihood(url: str, model: str, limit: int, tokenizer: str) -> dict[str, Any]:
    """The multiple-choice task through `local-completions` with token-id prompts: every choice
    is one echo + logprobs request (lm-eval sums the continuation's prompt logprobs)."""
    args = model_args(url, model, chat=False)
    args |= {"tokenizer_backend": "huggingface", "tokenizer": tokenizer, "tokenized_requests": True}
    manager = TaskManager(include_path=str(TASK_DIR), include_defaults=False)
    results = simple_evaluate(
        model="local-completions",
        model_args=args,
        tasks=[task_config(MC_TASK)],
        limit=limit,
        task_manager=manager,
        bootstrap_iters=0,
        log_samples=True,
    )
    assert results is not None
    scored = [
        [*sample["arguments"][i], *resp[0]]
        for sample in results["samples"][MC_TASK]
        for i, resp in enumerate(sample["resps"])
    ]
    return {
        "samples": results["n-samples"][MC_TASK]["effective"],
        "acc": results["results"][MC_TASK]["acc,none"],
        "scored": scored,
    }


if __name__ == "__main__":
    if len(sys.argv) > 4:
        print(json.dumps(loglikelihood(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])))
    else:
        print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
