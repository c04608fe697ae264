"""One-token decode step of DeltaNet."""

from __future__ import annotations

import torch

from kernels.common.checks import check_state, check_step_beta, check_step_qkv, default_scale
from kernels.common.dispatch import resolve_step_backend
from kernels.gated_delta_rule.step import gdn_update


def delta_rule_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    beta_t: torch.Tensor,
    state: torch.Tensor | None,
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode one token: h_t = (I - beta_t k_t k_t^T) h_{t-1} + beta_t k_t v_t^T, o_t = h_t^T q'_t.

    q_t, k_t: [B, H, K]; v_t: [B, H, V]; beta_t: [B, H] in (0, 1]; state: [B, H, K, V] or
    None (zeros). Returns o_t [B, H, V] in q_t's dtype and the new state [B, H, K, V] in
    fp32 (fp64 for fp64 inputs). backend: see kernels.common.dispatch.resolve_step_backend.
    """
    op = "delta_rule_step"
    B, H, K, V = check_step_qkv(op, q_t, k_t, v_t)
    check_step_beta(op, beta_t, B, H)
    check_state(op, "state", state, (B, H, K, V))
    scale = default_scale(op, scale, K)
    if resolve_step_backend(op, backend, [q_t, k_t, v_t, None, beta_t, state]) == "triton":
        from kernels.common.triton.step import fused_step  # lazy: triton is optional

        return fused_step(q_t, k_t, v_t, None, beta_t, state, scale)
    dt = torch.float64 if q_t.dtype == torch.float64 else torch.float32
    h = torch.zeros(B, H, K, V, dtype=dt, device=q_t.device) if state is None else state.to(dt)
    o_t, h = gdn_update(q_t.to(dt) * scale, k_t.to(dt), v_t.to(dt), None, beta_t.to(dt), h)
    return o_t.to(q_t.dtype), h
