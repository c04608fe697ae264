"""Linearized softmax GDN, one token at a time, written straight from docs/design.md §7 (not
through the gated delta rule, so that the GDN mapping of chunked.py is checked against it):

    kbar_t = mean(k_1..k_t)      vbar_t = mean(v_1..v_t)      vbar_0 = 0
    u_t = k_t - kbar_t           w_t = v_t - vbar_{t-1}
    h_t = ((1 - 1/t) I - (1/t) u_t u_t^T) h_{t-1} + (1/t) u_t w_t^T
    o_t = h_t^T q'_t + vbar_t,   q' = scale q
"""

from __future__ import annotations

import torch

from kernels.linearized_softmax_gdn.state import LinGDNState, is_empty


def linearized_softmax_gdn_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    initial_state: LinGDNState | None = None,
    output_final_state: bool = False,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, LinGDNState | None]:
    """Per-token §7 recurrence; differentiable; arguments assumed valid.

    q, k: [B, T, H, K]; v: [B, T, H, V]; initial_state: LinGDNState or None.
    Computes in `dtype` (default: fp64 for fp64 inputs, else fp32). Returns o [B, T, H, V]
    (in `dtype` when given, else q.dtype) and, if asked, the LinGDNState after the last token.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    dt = dtype or (torch.float64 if q.dtype == torch.float64 else torch.float32)
    qs, ks, vs = q.to(dt) * scale, k.to(dt), v.to(dt)
    if is_empty(initial_state):
        count = 0
        h = torch.zeros(B, H, K, V, dtype=dt, device=q.device)
        k_sum = torch.zeros(B, H, K, dtype=dt, device=q.device)
        v_sum = torch.zeros(B, H, V, dtype=dt, device=q.device)
    else:
        count = initial_state.count
        h, k_sum, v_sum = (x.to(dt) for x in initial_state[:3])
    outs = []
    for i in range(T):
        t = count + i + 1  # absolute position of this token
        v_mean_prev = v_sum / (t - 1) if t > 1 else torch.zeros_like(v_sum)  # vbar_0 = 0
        k_sum = k_sum + ks[:, i]
        v_sum = v_sum + vs[:, i]
        u = ks[:, i] - k_sum / t
        w = vs[:, i] - v_mean_prev
        u_h = torch.einsum("bhk,bhkv->bhv", u, h)  # u^T h
        h = (1 - 1 / t) * h + (u.unsqueeze(-1) * (w - u_h).unsqueeze(-2)) / t
        outs.append(torch.einsum("bhk,bhkv->bhv", qs[:, i], h) + v_sum / t)
    o = torch.stack(outs, dim=1).to(dtype or q.dtype)
    if not output_final_state:
        return o, None
    return o, LinGDNState(h=h, k_sum=k_sum, v_sum=v_sum, count=count + T)
