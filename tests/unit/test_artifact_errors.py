"""Every unusable artifact or conversion input fails with ArtifactError / one stderr line, no traceback."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hf_fixtures import make_hf_checkpoint

from ninfer.artifact import ArtifactError, open_artifact
from ninfer.artifact.convert import convert


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("good")
    hf = make_hf_checkpoint(root / "hf", "moe", per_expert_keys=True)
    return hf, convert(hf, root / "good.ninfer")


@pytest.fixture
def art(good: tuple[Path, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(good[1], tmp_path / "copy.ninfer"))


@pytest.fixture
def hf(good: tuple[Path, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(good[0], tmp_path / "hf"))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "ninfer.artifact", *args], capture_output=True, text=True, env=env, timeout=120
    )


def assert_one_line_failure(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]


def redigest(root: Path, rel: str) -> None:
    """Make the manifest agree with an edited file, so only the content check can catch the edit."""
    m = json.loads((root / "manifest.json").read_text())
    m["digests"][rel] = hashlib.sha256((root / rel).read_bytes()).hexdigest()
    (root / "manifest.json").write_text(json.dumps(m))


def edit_json(path: Path, **changes: object) -> None:
    d = json.loads(path.read_text())
    d.update(changes)
    path.write_text(json.dumps(d))


def one_line(exc: pytest.ExceptionInfo[ArtifactError]) -> str:
    msg = str(exc.value)
    assert msg and "\n" not in msg
    return msg


def test_good_artifact_opens(art: Path) -> None:
    assert open_artifact(art, verify=True).has_component("mtp")


def test_missing_weight_file(art: Path) -> None:
    (art / "weights" / "mtp.safetensors").unlink()
    with pytest.raises(ArtifactError) as exc:
        open_artifact(art)
    assert "missing file" in one_line(exc) and "mtp.safetensors" in one_line(exc)
    assert_one_line_failure(cli("verify", str(art)), "missing file")


@pytest.mark.parametrize("rel", ["manifest.json", "tokenizer/tokenizer.json", "config.json"])
def test_missing_side_file(art: Path, rel: str) -> None:
    (art / rel).unlink()
    with pytest.raises(ArtifactError, match="missing file"):
        open_artifact(art)


def test_missing_artifact_directory(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="does not exist"):
        open_artifact(tmp_path / "nope.ninfer")


def test_wrong_digest(art: Path) -> None:
    path = art / "weights" / "text-00001-of-00001.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # one bit of tensor payload; size and header unchanged
    path.write_bytes(bytes(data))
    open_artifact(art)  # without verify only the structure is checked
    with pytest.raises(ArtifactError) as exc:
        open_artifact(art, verify=True)
    assert "digest mismatch" in one_line(exc) and "text-00001" in one_line(exc)
    assert_one_line_failure(cli("verify", str(art)), "digest mismatch")


def test_truncated_safetensors(art: Path) -> None:
    path = art / "weights" / "mtp.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    redigest(art, "weights/mtp.safetensors")
    with pytest.raises(ArtifactError) as exc:
        open_artifact(art)
    assert "truncated" in one_line(exc)
    path.write_bytes(b"\x10\x00")
    redigest(art, "weights/mtp.safetensors")
    with pytest.raises(ArtifactError, match="truncated"):
        open_artifact(art)


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("moe_intermediate_size", 48, "shape mismatch for model.layers.0.mlp.experts."),
        ("hidden_size", 96, "shape mismatch"),
        ("num_hidden_layers", 3, "unexpected tensor"),
        ("mtp_num_hidden_layers", 2, "missing tensor 'mtp.layers.1."),
    ],
)
def test_shape_mismatch_vs_config(art: Path, field: str, value: int, needle: str) -> None:
    cfg = json.loads((art / "config.json").read_text())
    cfg[field] = value
    if field == "num_hidden_layers":
        cfg["layer_types"] = cfg["layer_types"][:3]
    (art / "config.json").write_text(json.dumps(cfg))
    redigest(art, "config.json")
    with pytest.raises(ArtifactError) as exc:
        open_artifact(art)
    assert needle in one_line(exc)


def test_unknown_format_version(art: Path) -> None:
    edit_json(art / "manifest.json", format_version=2)
    with pytest.raises(ArtifactError) as exc:
        open_artifact(art)
    assert "format_version 2" in one_line(exc)
    assert_one_line_failure(cli("inspect", str(art)), "format_version")


def test_unknown_architecture_in_artifact(art: Path) -> None:
    edit_json(art / "config.json", family="llama")
    redigest(art, "config.json")
    with pytest.raises(ArtifactError, match="unknown architecture"):
        open_artifact(art)
    m = json.loads((art / "manifest.json").read_text())
    m["identity"]["family"] = "llama"
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="unknown architecture family 'llama'"):
        open_artifact(art)


def test_manifest_tensor_count_and_corrupt_json(art: Path) -> None:
    m = json.loads((art / "manifest.json").read_text())
    m["components"]["text"]["tensor_count"] += 1
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="manifest says"):
        open_artifact(art)
    (art / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        open_artifact(art)


def test_convert_unknown_architecture(hf: Path, tmp_path: Path) -> None:
    edit_json(hf / "config.json", model_type="llama", architectures=["LlamaForCausalLM"])
    with pytest.raises(ArtifactError) as exc:
        convert(hf, tmp_path / "out.ninfer")
    assert "unknown architecture" in one_line(exc) and "llama" in one_line(exc)
    assert_one_line_failure(cli("convert", str(hf), str(tmp_path / "out2.ninfer")), "unknown architecture")
    assert not (tmp_path / "out2.ninfer").exists()


def test_convert_needs_a_template(hf: Path, tmp_path: Path) -> None:
    (hf / "chat_template.jinja").unlink()
    with pytest.raises(ArtifactError) as exc:
        convert(hf, tmp_path / "out.ninfer")
    assert "--template qwen3_6|qwen3_5|qwen3_8" in one_line(exc)
    assert open_artifact(convert(hf, tmp_path / "out.ninfer", template="qwen3_6")).chat_template


def test_convert_bad_sources(hf: Path, tmp_path: Path) -> None:
    edit_json(hf / "config.json", intermediate_size=96, moe_intermediate_size=16)
    with pytest.raises(ArtifactError, match="shape mismatch"):
        convert(hf, tmp_path / "a.ninfer")
    edit_json(hf / "config.json", moe_intermediate_size=32, num_experts=16)
    with pytest.raises(ArtifactError, match="cover experts 8/16"):
        convert(hf, tmp_path / "b.ninfer")
    edit_json(hf / "config.json", num_experts=8)
    (hf / "model.safetensors").unlink()
    with pytest.raises(ArtifactError, match=r"no \*\.safetensors"):
        convert(hf, tmp_path / "c.ninfer")
    (hf / "config.json").unlink()
    with pytest.raises(ArtifactError, match="missing file"):
        convert(hf, tmp_path / "d.ninfer")
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []  # failed conversions leave no half-written directories


def test_convert_refuses_existing_output(good: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "out.ninfer"
    out.mkdir()
    with pytest.raises(ArtifactError, match="already exists"):
        convert(good[0], out)
    assert open_artifact(convert(good[0], out, force=True)).model_id == "hf"


def test_loaded_tensors_are_private_maps(art: Path) -> None:
    tensors = open_artifact(art).load_tensors("text")
    tensors["model.norm.weight"].add_(1.0)  # copy-on-write: the file must not change
    assert open_artifact(art, verify=True).has_component("text")


def test_cli_in_process(art: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ninfer.artifact.cli import main

    assert main(["inspect", str(art)]) == 0
    out = capsys.readouterr().out
    assert "model_id      hf" in out and "qwen3_5_moe" in out and "mtp" in out
    assert main(["verify", str(art)]) == 0
    assert main(["demo", str(art)]) == 1  # exists already
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists" in err
    assert main(["convert", str(tmp_path / "none"), str(tmp_path / "o.ninfer")]) == 1
    assert "does not exist" in capsys.readouterr().err
