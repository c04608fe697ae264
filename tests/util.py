"""Helpers shared by the tests: the error metric of docs/design.md §9 and NaN poisoning."""

from __future__ import annotations

import os

import pytest
import torch


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64; NaN or inf anywhere in `out` gives inf."""
    out64, ref64 = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out64).all():
        return float("inf")
    denom = ref64.norm().item()
    num = (out64 - ref64).norm().item()
    if denom == 0.0:
        return num
    return num / denom


def row_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The worst row's error against the typical row: max over rows r of ||out_r - ref_r||
    divided by the root-mean-square row norm of ref, a row being the last dimension (one
    token of one head). The whole-tensor rel_err averages a few bad rows away (a garbage chunk
    or a zeroed token among 32k); this does not. NaN or inf anywhere gives inf."""
    out64, ref64 = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out64).all():
        return float("inf")
    rows_ref = ref64.reshape(-1, ref64.shape[-1]) if ref64.dim() else ref64.reshape(1, 1)
    rows_out = out64.reshape(rows_ref.shape)
    scale = rows_ref.norm(dim=-1).pow(2).mean().sqrt().item()
    worst = (rows_out - rows_ref).norm(dim=-1).max().item()
    return worst / scale if scale > 0 else worst


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill a preallocated output with NaN so an unwritten element can never pass."""
    return t.fill_(float("nan"))


TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}
# row_err's bounds: TOL, except bf16, whose worst rows (8 mantissa bits, rows of 16-100 values)
# measure up to 1.44e-2 in the chunked CPU forms (GLA's dg; 2026-12-02) against a whole-tensor
# error near 4e-3. The worst of hundreds of rows sits above the mean; 2e-2 bounds it.
ROW_TOL = {**TOL, torch.bfloat16: 2e-2}

# pytestmark of the tests in tests/gpu: real Triton on a CUDA device only. Under
# TRITON_INTERPRET (set for the whole CPU session by tests/conftest.py) the kernels would
# run interpreted, so those tests belong to a pytest session of their own.
GPU_ONLY = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
        reason="TRITON_INTERPRET is set in this session; run tests/gpu on its own",
    ),
]


def record_gpu_errors(case: str, errors: dict[str, float]) -> None:
    """Print a GPU test case's errors and, when GPU_ERRORS_JSON names a file, merge them into
    it under `case` (the device scripts collect the figures of a run this way)."""
    import json

    print(case, {n: f"{e:.2e}" for n, e in errors.items()})
    path = os.environ.get("GPU_ERRORS_JSON")
    if not path:
        return
    old = {}
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    old[case] = errors
    with open(path, "w") as f:
        json.dump(old, f, indent=1)
