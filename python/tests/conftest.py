"""Shared helpers: the package (imported once), operator presence checks and error metrics."""
import pytest
import torch

import ops_transformer as ot

torch.manual_seed(0)


def need(*names):
    """Skip (do not fail) a test whose operator has not landed in the library yet."""
    missing = [n for n in names if not ot.has_op(n)]
    return pytest.mark.skipif(bool(missing), reason=f"operator not landed yet: {', '.join(missing)}")


def rel_err(got, want):
    """Normalised error ||got - want|| / max(||want||, tiny), computed in float64."""
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


TOL = {torch.float32: 2e-5, torch.bfloat16: 1.5e-2, torch.float16: 3e-3}
