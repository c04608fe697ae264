"""The error metrics the kernel tests use (tests/util.py)."""

import pytest
import torch

from tests.util import rel_err, row_err


def test_row_err_sees_one_bad_token_that_rel_err_averages_away():
    ref = torch.randn(1, 32768, 2, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = ref.clone()
    out[0, 100, 1] = 0.0  # one token of one head zeroed
    assert rel_err(out, ref) < 1e-2  # under even the bf16 limit
    # the zeroed row's norm against the typical row's: near 1, but a row of 64 normal values
    # has a norm within about +-9% of the typical one, so the exact ratio is what is asserted
    typical = ref.reshape(-1, 64).norm(dim=-1).pow(2).mean().sqrt()
    assert row_err(out, ref) == pytest.approx((ref[0, 100, 1].norm() / typical).item(), rel=1e-12)
    assert row_err(out, ref) > 0.5


def test_row_err_of_a_garbage_chunk():
    gen = torch.Generator().manual_seed(1)
    ref = torch.randn(1, 32768, 2, 64, dtype=torch.float64, generator=gen)
    out = ref.clone()
    out[0, :64] = torch.randn(64, 2, 64, dtype=torch.float64, generator=gen)
    assert rel_err(out, ref) < 1e-1 and row_err(out, ref) > 1.0


def test_row_err_exact_zero_nan_and_scalars():
    ref = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert row_err(ref.clone(), ref) == 0.0
    bad = ref.clone()
    bad[1, 2] = float("nan")
    assert row_err(bad, ref) == float("inf")
    assert row_err(torch.tensor(2.0), torch.tensor(1.0)) == 1.0


def test_a_measured_error_records_the_bounds_it_is_held_to(monkeypatch):
    """While KERNEL_ERRORS_JSON is set the metrics return MeasuredError: `err < bound`,
    `err <= bound` and `bound > err` record the bound; a lower bound and arithmetic do not."""
    from tests import util

    monkeypatch.setattr(util, "ERROR_RECORDS", {})
    err = util.MeasuredError(2e-6, "tests/x.py::t", "rel_err", "float32")
    assert err < 1e-5 and not err <= 1e-6 and 1e-4 > err
    assert err > 1e-7 and type(2 * err) is float
    recorded = {tuple(row[:4]): row[4] for row in util.error_records()}
    where = ("tests/x.py::t", "rel_err", "float32")
    assert recorded == {(*where, None): 2e-6, (*where, 1e-5): 2e-6, (*where, 1e-6): 2e-6, (*where, 1e-4): 2e-6}
    assert util.MeasuredError(3e-6, *where) < 1e-5
    assert {tuple(row[:4]): row[4] for row in util.error_records()}[(*where, 1e-5)] == 3e-6


def test_merged_records_keep_each_keys_largest_error():
    from tests.util import merge_error_records

    a = [["t::a", "rel_err", "float32", 1e-5, 1e-6], ["t::b", "row_err", "float16", None, 2e-4]]
    b = [["t::a", "rel_err", "float32", 1e-5, 3e-6], ["t::a", "rel_err", "float32", None, 3e-6]]
    merged = {tuple(row[:4]): row[4] for row in merge_error_records(a, b)}
    assert merged == {("t::a", "rel_err", "float32", 1e-5): 3e-6, ("t::b", "row_err", "float16", None): 2e-4,
                      ("t::a", "rel_err", "float32", None): 3e-6}


def test_two_workers_records_reach_the_file(tmp_path):
    """Under xdist each worker hands its records to the controller, which writes them all."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "errors.json"
    tests = ["tests/test_util_metrics.py::test_row_err_of_a_garbage_chunk",
             "tests/test_util_metrics.py::test_row_err_sees_one_bad_token_that_rel_err_averages_away"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", *tests],
                          cwd=Path(__file__).resolve().parents[1], env={**os.environ, "KERNEL_ERRORS_JSON": str(out)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    rows = json.loads(out.read_text())["records"]
    bounded = {(test.split("::")[1], metric, bound) for test, metric, _, bound, _ in rows if bound is not None}
    assert bounded == {("test_row_err_of_a_garbage_chunk", "rel_err", 0.1),
                       ("test_row_err_sees_one_bad_token_that_rel_err_averages_away", "rel_err", 1e-2)}


def test_rounding_floor_is_what_rounding_the_reference_gives():
    """One row 10x the typical one: rounding the exact values to bf16 alone puts the worst row
    near ROW_TOL (up to 2^-9 x 10, here 0.018) where the other rows give 0.007; fp16 rounds it
    finer; an exact reference has none."""
    from tests.util import ROW_TOL, rounding_floor

    gen = torch.Generator().manual_seed(3)
    ref = torch.randn(4096, 2, dtype=torch.float64, generator=gen)
    ref[-1] = torch.tensor([8.1, 3.1], dtype=torch.float64)  # a last token's large gradient
    ref[-1] *= 10 * ref.norm(dim=-1).pow(2).mean().sqrt() / ref[-1].norm()
    bf16, fp16 = rounding_floor(ref, torch.bfloat16), rounding_floor(ref, torch.float16)
    assert bf16 == row_err(ref.to(torch.bfloat16), ref) and fp16 < bf16 / 2
    assert 2 ** -9 < bf16 < 10 * 2 ** -8 and rounding_floor(ref, torch.float64) == 0.0
    assert rounding_floor(ref[:-1], torch.bfloat16) < ROW_TOL[torch.bfloat16]


def test_rounding_verdict_tells_rounding_from_a_fault():
    """A bf16 worst row counts as rounding only when its fp16 twin passes fp16's TOL and
    shrinks the row at least ROUNDING_SHRINK-fold; an error that stays put is a fault."""
    from tests.util import ROUNDING_SHRINK, rounding_verdict

    assert rounding_verdict(0.046, 4e-4, 0.046 / 8) is None  # 8x smaller: rounding
    assert rounding_verdict(0.046, 4e-4, 0.046 / ROUNDING_SHRINK) is None  # the edge passes
    assert "does not scale" in rounding_verdict(0.046, 4e-4, 0.046 / 2)
    assert "fails TOL" in rounding_verdict(0.95, 0.9, 0.95)  # a wrong kernel, wrong in both


def test_fp32_peer_verdict_on_mesanets_strong_gate_gradient():
    """The case that fp32_peer_verdict exists for: MesaNet's dg under strong gates at K = 128,
    T = 130 has worst rows over ROW_TOL in the PyTorch chunked form itself (fp32, CPU), so a
    Triton row of that size is the quantity's conditioning; five times the peer's is not."""
    import torch

    from tests.nan_cases import make_leaves, output_dtypes, outputs_and_grads
    from tests.util import FP32_PEER_FACTOR, ROW_TOL, fp32_peer_verdict, row_err

    leaves = make_leaves("mesa", 130, "strong", False, B=2, H=2, K=128, V=128)
    peer = outputs_and_grads("mesa", leaves, torch.float32, "torch", cg_steps=100)
    ref = outputs_and_grads("mesa", leaves, torch.float64, "reference", rounded_as=output_dtypes("mesa", peer))
    peer_row = row_err(peer["dg"], ref["dg"])
    assert peer_row > ROW_TOL[torch.float32]
    assert fp32_peer_verdict(1.58e-5, peer_row) is None  # the H100's figure, 2026-12-07
    assert fp32_peer_verdict(FP32_PEER_FACTOR * peer_row, peer_row) is None
    assert "PyTorch backend" in fp32_peer_verdict(5 * peer_row, peer_row)
