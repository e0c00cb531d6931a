"""The compile cache setup: environment variables, files present at start, files compiled since."""

from __future__ import annotations

import os

import pytest

from ninfer.service.compile_cache import ENV_ROOT, setup_compile_cache


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_CACHE_AUTOTUNING", ENV_ROOT):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_setup_points_both_caches_under_the_root_and_counts_files(tmp_path, clean_env) -> None:
    (tmp_path / "triton" / "abc").mkdir(parents=True)
    (tmp_path / "triton" / "abc" / "k.cubin").write_bytes(b"x")
    cache = setup_compile_cache(tmp_path)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "triton")
    assert os.environ["TRITON_CACHE_AUTOTUNING"] == "1"  # autotuned configs persist beside the kernels
    assert (cache.inductor_files_at_start, cache.triton_files_at_start, cache.warm) == (0, 1, True)
    (tmp_path / "inductor" / "g.py").write_text("")
    (tmp_path / "triton" / "abc" / "k.json").write_text("{}")
    rep = cache.report(compile_s=2.5)
    assert (rep["inductor_files_new"], rep["triton_files_new"], rep["compile_s"]) == (1, 1, 2.5)


def test_report_claims_no_compile_seconds_it_did_not_measure(tmp_path, clean_env, caplog) -> None:
    """A CPU start captures no graphs: the line says nothing compiled, and no seconds."""
    cache = setup_compile_cache(tmp_path)
    with caplog.at_level("INFO", logger="ninfer.service.compile_cache"):
        rep = cache.report()
    assert rep["compile_s"] is None and (rep["inductor_files_new"], rep["triton_files_new"]) == (0, 0)
    assert caplog.messages[-1].endswith("nothing compiled")
    (tmp_path / "triton" / "k.json").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "triton" / "k.json").write_text("{}")
    with caplog.at_level("INFO", logger="ninfer.service.compile_cache"):
        cache.report()
    assert "0 + 1 compiled during startup (compile time not measured)" in caplog.messages[-1]


def test_env_root_is_used_when_no_root_is_given(tmp_path, clean_env) -> None:
    clean_env.setenv(ENV_ROOT, str(tmp_path / "cc"))
    cache = setup_compile_cache()
    assert cache.root == (tmp_path / "cc").resolve() and not cache.warm
    assert os.environ["TRITON_CACHE_DIR"] == str((tmp_path / "cc" / "triton").resolve())
