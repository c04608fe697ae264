"""One-token decode step of the gated delta rule."""

from __future__ import annotations

import torch

from kernels.common.checks import step_dtype
from kernels.common.step import check_step, linear_step


def gdn_update(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    decay_t: torch.Tensor | None,
    beta_t: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h' = decay (h - beta k (h^T k)^T) + beta k v^T; o = h'^T q. All in one dtype, no checks.

    q_t, k_t: [B, H, K] (q_t already scaled); v_t: [B, H, V]; decay_t, beta_t: [B, H]
    (decay_t = exp(g_t), or None for no gate); state: [B, H, K, V].
    """
    recalled = torch.einsum("bhk,bhkv->bhv", k_t, state)
    b = beta_t[..., None, None]
    new_state = state - b * k_t.unsqueeze(-1) * recalled.unsqueeze(-2)
    if decay_t is not None:
        new_state = decay_t[..., None, None] * new_state
    new_state = new_state + b * k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
    return torch.einsum("bhk,bhkv->bhv", q_t, new_state), new_state


def gated_delta_rule_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    g_t: torch.Tensor,
    beta_t: torch.Tensor,
    state: torch.Tensor | None,
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode one token: h_t = exp(g_t) (I - beta_t k_t k_t^T) h_{t-1} + beta_t k_t v_t^T.

    q_t, k_t: [B, H, K]; v_t: [B, H, V]; g_t: [B, H] (<= 0); beta_t: [B, H] in (0, 1];
    state: [B, H, K, V] or None (zeros). Returns o_t [B, H, V] in q_t's dtype and the new
    state [B, H, K, V] in fp32 (fp64 for fp64 inputs).
    """
    op = "gated_delta_rule_step"
    B, H, K, V, state, scale = check_step(op, q_t, k_t, v_t, state, scale, gate="scalar", g_t=g_t,
                                          beta=True, beta_t=beta_t)

    def torch_step() -> tuple[torch.Tensor, torch.Tensor]:
        dt = step_dtype(q_t)
        h = torch.zeros(B, H, K, V, dtype=dt, device=q_t.device) if state is None else state.to(dt)
        o_t, h = gdn_update(q_t.to(dt) * scale, k_t.to(dt), v_t.to(dt), g_t.to(dt).exp(), beta_t.to(dt), h)
        return o_t.to(q_t.dtype), h

    return linear_step(op, backend, torch_step, q_t, k_t, v_t, g_t, beta_t, state, scale)
