"""Helpers shared by the tests: the error metric of DESIGN §9 and NaN poisoning."""

from __future__ import annotations

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


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill a preallocated output with NaN so an unwritten element can never pass."""
    return t.fill_(float("nan"))


TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}
