"""Linear attention, one decoding step on the state, and the argument checks every
`<op>_step` of this package shares."""

from __future__ import annotations

import torch

from kernels.common.checks import FLOAT_DTYPES


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def check_step_qkv(op: str, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor) -> tuple[int, int, int, int]:
    """Check one token's q_t, k_t: [B, H, K] and v_t: [B, H, V]; return (B, H, K, V)."""
    for name, t in (("q_t", q_t), ("k_t", k_t), ("v_t", v_t)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{op}: {name} must have 3 dimensions [B, H, D] (one token), got shape {_shape(t)}")
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{op}: {name} has dtype {t.dtype}; valid: float16, bfloat16, float32, float64")
    if q_t.shape != k_t.shape:
        raise ValueError(f"{op}: q_t and k_t must have the same shape [B, H, K], got {_shape(q_t)} and {_shape(k_t)}")
    if v_t.shape[:2] != q_t.shape[:2]:
        raise ValueError(f"{op}: v_t must be [B, H, V] with B, H as in q_t {_shape(q_t)}, got {_shape(v_t)}")
    B, H, K = q_t.shape
    return B, H, K, v_t.shape[-1]


def step_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a step computes and keeps its state in: fp64 for fp64 inputs, else fp32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def linear_attention_step_unchecked(
    q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, state: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = state + k_t v_t^T; o_t = h^T (scale q_t). q_t, k_t: [B, H, K]; v_t: [B, H, V];
    state: [B, H, K, V] or None (zeros). Returns (o_t [B, H, V] in q_t's dtype, h fp32/fp64)."""
    acc = step_dtype(q_t)
    write = k_t.to(acc)[..., :, None] * v_t.to(acc)[..., None, :]
    h = write if state is None else state.to(acc) + write
    o_t = torch.einsum("bhk,bhkv->bhv", q_t.to(acc) * scale, h)
    return o_t.to(q_t.dtype), h
