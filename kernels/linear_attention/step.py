"""Linear attention, one decoding step on the state."""

from __future__ import annotations

import torch

from kernels.common.checks import step_dtype


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
