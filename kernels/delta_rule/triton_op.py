"""Triton backend of the delta rule: the gated delta rule kernels with no gate (USE_G=False,
so no gate tensor is read or differentiated). See kernels/gated_delta_rule/triton_op.py."""

from __future__ import annotations

import torch

from kernels.gated_delta_rule.triton_op import chunk_delta_rule_triton


def delta_rule_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, scale: float,
    initial_state: torch.Tensor | None = None, output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Delta rule on Triton: h_t = (I - beta_t k_t k_t^T) h_{t-1} + beta_t k_t v_t^T,
    o_t = h_t^T (scale q_t). q, k: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H] in (0, 1];
    initial_state [B, H, K, V] or None. Arguments are already validated by
    kernels.delta_rule.delta_rule; keys need not be unit norm (stable while
    beta ||k||^2 <= 2). Returns (o [B, T, H, V] in q's dtype, final state [B, H, K, V] fp32
    or None); differentiable in q, k, v, beta and initial_state."""
    return chunk_delta_rule_triton(
        "delta_rule", q, k, v, None, beta, scale, initial_state, output_final_state, chunk_size
    )
