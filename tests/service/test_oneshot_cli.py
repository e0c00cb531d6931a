"""`python -m ninfer` (the `ninfer` console script) as a subprocess on the demo artifact.

It runs the server's engine and frontend, so its stdout is the server's answer to the same
conversation and sampling, exactly: greedy with thinking off (the text on stdout; drafted with
MTP here, which leaves greedy tokens as they are), and seeded
sampling with thinking on (the demo model rarely closes its reasoning: the reasoning streams to
stderr, the answer text, if any, to stdout). Loading progress and the closing statistics are on
stderr. Bad input and settings the artifact cannot honour exit 2 with one line, before any
weight loads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from conftest import MODEL, ROOT, Server

from ninfer.oneshot import cli

COMMON = ["--device", "cpu", "--max-context", "512"]


def oneshot(args: list[str], cache: Path, timeout_s: float = 240.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NINFER_CACHE_DIR": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "ninfer", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout_s,
    )


def chat(server: Server, body: dict) -> dict:
    r = requests.post(f"{server.url}/v1/chat/completions", json={"model": MODEL, **body},
                      headers=server.headers(), timeout=120)  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()


def test_greedy_answer_is_the_servers(server: Server, demo_cache: Path) -> None:
    prompt = "One-shot: plan a morning in Porto."
    spec = ["--spec", "mtp", "--draft-tokens", "2"]  # greedy speculation: the same tokens as spec off
    proc = oneshot(
        ["--prompt", prompt, "--max-new", "8", "--greedy", "--no-thinking", *spec, *COMMON], demo_cache
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = chat(server, {"messages": [{"role": "user", "content": prompt}], "max_tokens": 8, "temperature": 0,
                         "enable_thinking": False})  # fmt: skip
    content = want["choices"][0]["message"]["content"]
    assert content and proc.stdout == content + ("" if content.endswith("\n") else "\n"), (
        proc.stdout,
        content,
    )
    err = [x for x in proc.stderr.splitlines() if x.startswith("ninfer: ")]  # a library warning aside
    phases = [line.split(" (")[0] for line in err[:3]]
    assert phases == ["ninfer: opening the artifact", "ninfer: loading the weights", "ninfer: warming up"], (
        err
    )
    assert err[3].startswith("ninfer: ready in "), err
    usage = want["usage"]
    assert err[4].startswith(
        f"ninfer: finish length; {usage['prompt_tokens']} prompt tokens (0 cached), 8 generated (0 reasoning); "
    ), err
    assert " tok/s" in err[4] and len(err) == 6, err
    assert err[5].startswith("ninfer: speculative mtp (k=2): "), err


def test_messages_file_seeded_sampling_and_reasoning_on_stderr(
    server: Server, demo_cache: Path, tmp_path: Path
) -> None:
    messages = [{"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": "One-shot: name a river in Peru."}]  # fmt: skip
    path = tmp_path / "conversation.json"
    path.write_text(json.dumps({"messages": messages}))
    args = ["--messages", str(path), "--max-new", "6", "--seed", "7", "--temperature", "0.9", *COMMON]
    proc = oneshot(args, demo_cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = chat(server, {"messages": messages, "max_tokens": 6, "seed": 7, "temperature": 0.9})
    message = want["choices"][0]["message"]
    reasoning, content = message.get("reasoning_content") or "", message["content"] or ""
    assert reasoning, message  # thinking on by default: the reasoning is what comes first
    assert f"[reasoning] {reasoning}\n[/reasoning]\n" in proc.stderr, (proc.stderr, reasoning)
    assert proc.stdout == (content + "\n" if content and not content.endswith("\n") else content)
    tokens = want["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert f"6 generated ({tokens} reasoning)" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--prompt", "x", "--spec", "mtp", "--lm-head-draft"], "ninfer: error: spec.lm_head_draft=true: this artifact has no"),
        (["--messages", "/nonexistent/conversation.json"], "ninfer: error: --messages /nonexistent/conversation.json: cannot read it"),
        (["--prompt", "x", "--messages", "y"], "ninfer: error: argument --messages: not allowed with argument --prompt"),
    ],
    ids=["lm_head_draft_without_head", "missing_messages_file", "prompt_and_messages"],
)  # fmt: skip
def test_bad_input_exits_2_with_one_line(args: list[str], line: str, demo_cache: Path) -> None:
    proc = oneshot([*args, *COMMON], demo_cache, timeout_s=120.0)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-3000:]
    errors = [x for x in proc.stderr.splitlines() if ": error: " in x]
    assert len(errors) == 1 and errors[0].startswith(line), proc.stderr
    assert "Traceback" not in proc.stderr and "loading the weights" not in proc.stderr


def test_refusals_before_loading_name_the_field(
    tmp_path: Path, demo_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In process: the server's own parser and settings rules refuse, before any weight loads."""
    monkeypatch.setenv("NINFER_CACHE_DIR", str(demo_cache))
    bad_role = tmp_path / "bad-role.json"
    bad_role.write_text(json.dumps([{"role": "wizard", "content": "hi"}]))
    not_json = tmp_path / "not.json"
    not_json.write_text("[{")
    cases = [
        (["--messages", str(bad_role)], "ninfer: error: messages[0].role: "),
        (["--messages", str(not_json)], f"ninfer: error: --messages {not_json}: not JSON"),
        (["--prompt", "x", "--max-context", "0"], "ninfer: error: --max-context=0 (engine.max_context): "),
        (["--prompt", "x", "--spec", "dflash"], "ninfer: error: spec.method=dflash: needs the 35B-A3B artifact"),
        (["--prompt", "x", "--vision"], "ninfer: error: vision.enabled=true: this artifact carries no vision tower"),
    ]  # fmt: skip
    for args, line in cases:
        assert cli.main([*args, "--device", "cpu"]) == 2, args
        captured = capsys.readouterr()
        errors = [x for x in captured.err.splitlines() if ": error: " in x]
        assert captured.out == "" and len(errors) == 1 and errors[0].startswith(line), (args, captured.err)
        assert "loading the weights" not in captured.err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--prompt", "x", "--max-new", "0"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "ninfer: error: argument --max-new: must be an integer >= 1, got 0\n"


def test_progress_line_is_rewritten_in_place_on_a_terminal() -> None:
    """On a terminal each phase rewrites one line (carriage return, erase); the end closes it."""
    from io import StringIO

    from ninfer.oneshot.progress import Progress

    live, plain = StringIO(), StringIO()
    for stream, is_tty in ((live, True), (plain, False)):
        with Progress(stream, "ninfer", live=is_tty) as progress:
            progress.phase("loading the weights")
            progress.phase("warming up")
            assert progress.done("ready") >= 0.0
    assert live.getvalue().count("\n") == 1 and live.getvalue().startswith(
        "\r\033[Kninfer: loading the weights ("
    )
    assert "\r\033[Kninfer: warming up (" in live.getvalue() and "ninfer: ready in " in live.getvalue()
    lines = plain.getvalue().splitlines()
    assert [x.split(" (")[0] for x in lines[:2]] == ["ninfer: loading the weights", "ninfer: warming up"]
    assert len(lines) == 3 and lines[2].startswith("ninfer: ready in ") and "\r" not in plain.getvalue()
