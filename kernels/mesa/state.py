"""The recurrent state of MesaNet (docs/design.md §8), shared by every backend of the op."""

from __future__ import annotations

from typing import NamedTuple

import torch


class MesaState(NamedTuple):
    """Decayed second-moment statistics of the keys seen so far, per head.

    h_kk: [B, H, K, K]  sum_j (decay from j to now) beta_j k_j k_j^T  (symmetric PSD)
    h_kv: [B, H, K, V]  sum_j (decay from j to now) beta_j k_j v_j^T
    Both fp32 (fp64 when the op computed in fp64).
    """

    h_kk: torch.Tensor
    h_kv: torch.Tensor


def compute_dtype(*tensors: torch.Tensor, dtype: torch.dtype | None = None) -> torch.dtype:
    """fp64 when any input is fp64 or fp64 is requested, else fp32 (never lower:
    H_kk accumulated in 16 bits stops being positive definite)."""
    if dtype is not None:
        return torch.float64 if dtype == torch.float64 else torch.float32
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
