"""One-token decode step of the linearized softmax GDN (docs/design.md §7)."""

from __future__ import annotations

import torch

from kernels.common.step import check_step
from kernels.linearized_softmax_gdn.state import LinGDNState, check_lin_state, is_empty


def lin_state(op: str, state: LinGDNState | None, B: int, H: int, K: int, V: int) -> LinGDNState | None:
    check_lin_state(op, "state", state, B, H, K, V)
    return state


def linearized_softmax_gdn_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    state: LinGDNState | None,
    scale: float | None = None,
) -> tuple[torch.Tensor, LinGDNState]:
    """Decode token t = state.count + 1 (t = 1 for state None):
    kbar_t, vbar_t updated; u = k_t - kbar_t; w = v_t - vbar_{t-1};
    h_t = ((1 - 1/t) I - (1/t) u u^T) h_{t-1} + (1/t) u w^T;  o_t = h_t^T (scale q_t) + vbar_t.

    q_t, k_t: [B, H, K]; v_t: [B, H, V]; state: LinGDNState or None. Returns o_t [B, H, V]
    in q_t's dtype and the new LinGDNState (fp32 tensors, fp64 for fp64 inputs).
    """
    op = "linearized_softmax_gdn_step"
    B, H, K, V, _, scale = check_step(op, q_t, k_t, v_t, state, scale, state_check=lin_state)
    dt = torch.float64 if q_t.dtype == torch.float64 else torch.float32
    k, v = k_t.to(dt), v_t.to(dt)
    if is_empty(state):
        count = 0
        h = torch.zeros(B, H, K, V, dtype=dt, device=q_t.device)
        k_sum, v_sum = torch.zeros_like(k), torch.zeros_like(v)
    else:
        count = state.count
        h, k_sum, v_sum = (x.to(dt) for x in state[:3])
    t = count + 1
    v_mean_prev = v_sum / max(t - 1, 1)  # vbar_0 = 0: v_sum is zero when t = 1
    k_sum, v_sum = k_sum + k, v_sum + v
    u = k - k_sum / t
    u_h = torch.einsum("bhk,bhkv->bhv", u, h)
    h = (1 - 1 / t) * h + (u.unsqueeze(-1) * (v - v_mean_prev - u_h).unsqueeze(-2)) / t
    o_t = torch.einsum("bhk,bhkv->bhv", q_t.to(dt) * scale, h) + v_sum / t
    return o_t.to(q_t.dtype), LinGDNState(h=h, k_sum=k_sum, v_sum=v_sum, count=t)
