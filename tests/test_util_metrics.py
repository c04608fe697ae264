"""The error metrics the kernel tests use (tests/util.py)."""

import torch

from tests.util import rel_err, row_err


def test_row_err_sees_one_bad_token_that_rel_err_averages_away():
    ref = torch.randn(1, 32768, 2, 64, dtype=torch.float64)
    out = ref.clone()
    out[0, 100, 1] = 0.0  # one token of one head zeroed
    assert rel_err(out, ref) < 1e-2  # under even the bf16 limit
    assert 0.9 < row_err(out, ref) < 1.1


def test_row_err_of_a_garbage_chunk():
    ref = torch.randn(1, 32768, 2, 64, dtype=torch.float64)
    out = ref.clone()
    out[0, :64] = torch.randn(64, 2, 64, dtype=torch.float64)
    assert rel_err(out, ref) < 1e-1 and row_err(out, ref) > 1.0


def test_row_err_exact_zero_nan_and_scalars():
    ref = torch.randn(3, 5, dtype=torch.float64)
    assert row_err(ref.clone(), ref) == 0.0
    bad = ref.clone()
    bad[1, 2] = float("nan")
    assert row_err(bad, ref) == float("inf")
    assert row_err(torch.tensor(2.0), torch.tensor(1.0)) == 1.0
