"""One-token decode step of DeltaNet."""

from __future__ import annotations

import torch

from kernels.common.checks import step_dtype
from kernels.common.step import check_step, linear_step
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
    B, H, K, V, state, scale = check_step(op, q_t, k_t, v_t, state, scale, beta=True, beta_t=beta_t)

    def torch_step() -> tuple[torch.Tensor, torch.Tensor]:
        dt = step_dtype(q_t)
        h = torch.zeros(B, H, K, V, dtype=dt, device=q_t.device) if state is None else state.to(dt)
        o_t, h = gdn_update(q_t.to(dt) * scale, k_t.to(dt), v_t.to(dt), None, beta_t.to(dt), h)
        return o_t.to(q_t.dtype), h

    return linear_step(op, backend, torch_step, q_t, k_t, v_t, None, beta_t, state, scale)
