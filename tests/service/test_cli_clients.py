"""Claude Code and Codex CLI, installed by npm into `.ci/node/`, complete a turn against the server.

The server runs with `--client-compat` over the terse test model (turns end after a few tokens;
see `terse_artifact.py`). Each CLI runs in print / exec mode with a temporary HOME, no network
beyond 127.0.0.1, telemetry and update checks off; it must exit 0, every response it got must be
a 2xx (`ninfer_http_requests_total`) and every generation done in the request log (`Traffic`). The
prompts are shortened (a short system prompt, one tool) so the CPU prefill stays within seconds;
the fields these clients always send (betas, context management, efforts, prompt-cache keys,
hosted tools) are still present and their adjustments are checked in the log.

Skipped only when `node` itself is absent; a missing CLI install is a failure (`.ci/run` installs
them with `npm install --prefix .ci/node`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.service.conftest import API_KEY, ROOT, Server, Traffic

NODE_BIN = ROOT / ".ci" / "node" / "node_modules" / ".bin"
CLI_TIMEOUT_S = 240

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")


def _cli(name: str) -> Path:
    path = NODE_BIN / name
    if not path.exists():
        pytest.fail(
            f"{path} is missing: npm install --prefix .ci/node @anthropic-ai/claude-code @openai/codex "
            "(.ci/run does this)"
        )
    return path


def _home(tmp: Path) -> dict[str, str]:
    """A clean environment: temporary HOME, no proxies, nothing inherited that names a remote API."""
    home = tmp / "home"
    home.mkdir()
    keep = ("PATH", "LANG", "LC_ALL", "TERM")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update({"HOME": str(home), "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"})
    return env


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def _check_all_2xx(traffic: Traffic, protocol: str, output: str) -> list[dict]:
    done = traffic.check(output)
    assert all(e["protocol"] == protocol and e["finish_reason"] in ("stop", "tool_calls") for e in done)
    return done


def _params(done: list[dict]) -> set[str]:
    return {a["param"] for e in done for a in e["compat_adjustments"]}


def test_claude_code_print_mode(compat_server: Server, tmp_path: Path) -> None:
    claude = _cli("claude")
    env = _home(tmp_path)
    env.update(
        {
            "ANTHROPIC_BASE_URL": compat_server.url,
            "ANTHROPIC_API_KEY": API_KEY,
            # documented switches: no telemetry, error reporting, update checks or other traffic
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
        }
    )
    traffic = Traffic(compat_server)
    argv = [str(claude), "-p", "Say hi", "--model", "ninfer-demo", "--tools", "Read"]
    argv += ["--system-prompt", "Answer briefly.", "--setting-sources", "", "--no-session-persistence"]
    out = _run(argv, env, tmp_path)
    output = out.stdout + out.stderr
    assert out.returncode == 0, output
    done = _check_all_2xx(traffic, "messages", output)
    params = _params(done)
    assert {"anthropic-beta", "?beta", "context_management", "output_config.effort"} <= params, params


def test_codex_exec(compat_server: Server, tmp_path: Path) -> None:
    codex = _cli("codex")
    env = _home(tmp_path)
    codex_home = Path(env["HOME"]) / ".codex"
    codex_home.mkdir()
    (codex_home / "instructions.md").write_text("Answer briefly.\n")
    (codex_home / "config.toml").write_text(
        f"""model = "ninfer-demo"
model_provider = "ninfer"
model_instructions_file = "{codex_home / "instructions.md"}"
check_for_update_on_startup = false

[analytics]
enabled = false

[otel]
exporter = "none"

[model_providers.ninfer]
name = "ninfer"
base_url = "{compat_server.url}/v1"
wire_api = "responses"
env_key = "NINFER_API_KEY"
request_max_retries = 0
stream_max_retries = 0
"""
    )
    env.update({"CODEX_HOME": str(codex_home), "NINFER_API_KEY": API_KEY})
    traffic = Traffic(compat_server)
    argv = [str(codex), "exec", "--skip-git-repo-check", "--ephemeral", "Say hi"]
    out = _run(argv, env, tmp_path)
    output = out.stdout + out.stderr
    assert out.returncode == 0, output
    done = _check_all_2xx(traffic, "responses", output)
    params = _params(done)
    assert {"prompt_cache_key", "client_metadata", "include", "reasoning.summary"} <= params, params
    dropped = {a["detail"] for e in done for a in e["compat_adjustments"] if a["action"] == "dropped_tool"}
    assert any("web_search" in d for d in dropped), dropped
