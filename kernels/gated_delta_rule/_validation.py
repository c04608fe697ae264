"""Checks of the one-token (decode) tensors of the delta-rule family, beside
kernels/common/checks.py. Each failure is a ValueError naming the argument, what was
received and what is valid."""

from __future__ import annotations

import torch

from kernels.common.checks import FLOAT_DTYPES


def _shape(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return "[" + ", ".join(str(s) for s in t.shape) + "]"
    return type(t).__name__


def check_step_qkv(
    op: str, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor
) -> tuple[int, int, int, int]:
    """Check q_t, k_t: [B, H, K] and v_t: [B, H, V]; return (B, H, K, V)."""
    for name, t in (("q_t", q_t), ("k_t", k_t), ("v_t", v_t)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{op}: {name} must be a tensor of shape [B, H, D], got {_shape(t)}")
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{op}: {name} has dtype {t.dtype}; valid: float16, bfloat16, float32, float64")
    if q_t.shape != k_t.shape:
        raise ValueError(f"{op}: q_t and k_t must have one shape [B, H, K], got {_shape(q_t)} and {_shape(k_t)}")
    if v_t.shape[:2] != q_t.shape[:2]:
        raise ValueError(f"{op}: v_t must be [B, H, V] with B, H as in q_t {_shape(q_t)}, got {_shape(v_t)}")
    B, H, K = q_t.shape
    return B, H, K, v_t.shape[-1]


def check_step_gate(op: str, g_t: torch.Tensor, B: int, H: int) -> None:
    """g_t: [B, H], log-space decay, <= 0."""
    if not isinstance(g_t, torch.Tensor) or tuple(g_t.shape) != (B, H):
        raise ValueError(f"{op}: g_t must have shape [{B}, {H}], got {_shape(g_t)}")
    gmax = g_t.detach().max().item()
    if not gmax <= 0.0:  # also catches NaN
        raise ValueError(f"{op}: g_t is a log-space decay and must be <= 0, got max(g_t) = {gmax}")


def check_step_beta(op: str, beta_t: torch.Tensor, B: int, H: int) -> None:
    """beta_t: [B, H] in (0, 1]."""
    if not isinstance(beta_t, torch.Tensor) or tuple(beta_t.shape) != (B, H):
        raise ValueError(f"{op}: beta_t must have shape [{B}, {H}], got {_shape(beta_t)}")
    bmin, bmax = beta_t.detach().min().item(), beta_t.detach().max().item()
    if not (bmin > 0.0 and bmax <= 1.0):
        raise ValueError(f"{op}: beta_t must lie in (0, 1], got values in [{bmin}, {bmax}]")
