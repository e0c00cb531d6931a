"""PDL launch policy: single-token steps launch without it, nested scopes, CPU tensors never."""

from __future__ import annotations

import torch

from ninfer.kernels.launch_scope import for_step, pdl_allowed, pdl_permitted
from ninfer.kernels.triton import pdl


def test_scopes_nest_and_restore() -> None:
    assert pdl_permitted()
    with pdl_allowed(False):
        assert not pdl_permitted()
        with pdl_allowed(True):
            assert pdl_permitted()
        assert not pdl_permitted()
    assert pdl_permitted()


def test_only_steps_of_two_tokens_or_more() -> None:
    assert not for_step(1, 1)
    assert for_step(2, 1) and for_step(1, 4) and for_step(8, 1)


def test_cpu_tensors_never_launch_programmatically(monkeypatch) -> None:
    monkeypatch.setattr(pdl, "_FROM_ENV", True)  # NINFER_PDL allows it
    assert pdl.launch(torch.zeros(1)) == {"PDL": False, "launch_pdl": False}
