"""The bench's --spec-* flags narrow the speculative rows and keep the mode's defaults otherwise."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ops.bench.model_run import sizes_for
from ops.bench.run import spec_override


def test_spec_rows_override() -> None:
    base = sizes_for(False, True, 64, 32768)
    args = argparse.Namespace(spec_ks="3", spec_acceptance="100,40", spec_batches="")
    got = spec_override(base, args).spec
    assert (got.ks, got.acceptance_pct, got.batches) == ((3,), (100, 40), base.spec.batches)
    assert got.context == base.spec.context and got.proposal_ids == 32768
    none = argparse.Namespace(spec_ks="", spec_acceptance="", spec_batches="")
    assert spec_override(base, none) == base
