"""Fused one-token decode step of linear attention on Triton: the ungated case of
kernels/gated_linear_attention/triton_step.py."""

from __future__ import annotations

import torch

from kernels.gated_linear_attention.triton_step import fused_step


def linear_attention_step_triton(
    q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, state: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """h' = h + k_t v_t^T, o_t = h'^T (scale q_t). q_t, k_t: [B, H, K]; v_t: [B, H, V];
    state: [B, H, K, V] or None. Returns (o_t [B, H, V] in q_t's dtype, new state fp32)."""
    return fused_step(q_t, k_t, v_t, None, state, scale)
