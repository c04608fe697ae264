"""Linearized softmax GDN on the chunked gated delta rule (docs/design.md §7): backend "torch".

At absolute position t (t = count + 1, count + 2, ... with count = tokens already seen)
the §7 recurrence h_t = ((1 - 1/t) I - (1/t) u_t u_t^T) h_{t-1} + (1/t) u_t w_t^T is the
gated delta rule with
    g_t = log(1 - 1/t),   beta_t = 1/(t - 1),   key u_t = k_t - kbar_t,
    value (1 - 1/t) w_t,  w_t = v_t - vbar_{t-1}
because exp(g_t) beta_t = (1 - 1/t)/(t - 1) = 1/t. For t >= 2, beta_t lies in (0, 1]. The
t = 1 step has g = log 0 and beta = 1/0 but writes nothing and erases everything: u_1 = 0
and the value is 0, so there we use g = 0 and beta = 1 (finite, and inert with a zero key)
and start from h = 0. Every division is by t or max(t - 1, 1): no inf or NaN appears, in
values or gradients. The gates depend on the absolute position, which is why a continued
call needs the state's count.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kernels.gated_delta_rule.chunked import chunk_gated_delta_rule, compute_dtype
from kernels.linearized_softmax_gdn.state import LinGDNState, is_empty


class Centred(NamedTuple):
    """Running-mean preprocessing shared by the GDN and VaLA forms; all [B, T, H, *]."""

    u: torch.Tensor  # k_t - kbar_t
    w: torch.Tensor  # v_t - vbar_{t-1}
    v_mean: torch.Tensor  # vbar_t
    k_cum: torch.Tensor  # k_sum + k_1 + ... + k_t
    v_cum: torch.Tensor  # v_sum + v_1 + ... + v_t
    positions: torch.Tensor  # t = count + 1 .. count + T, fp64: [T]


def centre(
    k: torch.Tensor, v: torch.Tensor, state: LinGDNState | None, dt: torch.dtype
) -> Centred:
    """Running means of k and v continuing `state` (None or count 0: from scratch), in dt."""
    B, T, H, _ = k.shape
    count = 0 if is_empty(state) else state.count
    positions = torch.arange(count + 1, count + T + 1, dtype=torch.float64, device=k.device)
    t = positions.to(dt)[None, :, None, None]
    t_prev = positions.sub(1).clamp(min=1).to(dt)[None, :, None, None]  # t - 1, or 1 at t = 1
    ks, vs = k.to(dt), v.to(dt)
    k_cum, v_cum = ks.cumsum(1), vs.cumsum(1)
    if is_empty(state):
        v_before = torch.zeros_like(v_cum[:, :1])
    else:
        k_cum = k_cum + state.k_sum.to(dt).unsqueeze(1)
        v_cum = v_cum + state.v_sum.to(dt).unsqueeze(1)
        v_before = state.v_sum.to(dt).unsqueeze(1)
    v_cum_prev = torch.cat([v_before, v_cum[:, :-1]], dim=1)  # sum up to t - 1 (0 at t = 1)
    return Centred(
        u=ks - k_cum / t,
        w=vs - v_cum_prev / t_prev,
        v_mean=v_cum / t,
        k_cum=k_cum,
        v_cum=v_cum,
        positions=positions,
    )


def gdn_gates(positions: torch.Tensor, dt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """g_t = log(1 - 1/t) and beta_t = 1/(t - 1) for t >= 2; g = 0, beta = 1 at t = 1. [T] each."""
    first = positions == 1
    g = torch.where(first, torch.zeros_like(positions), torch.log1p(-1 / positions))
    beta = 1 / positions.sub(1).clamp(min=1)
    return g.to(dt), beta.to(dt)


def chunk_linearized_softmax_gdn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    initial_state: LinGDNState | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, LinGDNState | None]:
    """q, k: [B, T, H, K]; v: [B, T, H, V]; initial_state: LinGDNState or None.

    Returns o [B, T, H, V] in q.dtype and, if asked, the LinGDNState after the last token
    (fp32, fp64 for fp64 inputs). Arguments are assumed valid.
    """
    B, T, H, _ = q.shape
    dt = compute_dtype(q, k, v)
    c = centre(k, v, initial_state, dt)
    g, beta = gdn_gates(c.positions, dt)
    t = c.positions.to(dt)[None, :, None, None]
    value = c.w * ((t - 1) / t)
    h0 = None if is_empty(initial_state) else initial_state.h
    o, h = chunk_gated_delta_rule(
        q, c.u, value, g[None, :, None].expand(B, T, H), beta[None, :, None].expand(B, T, H),
        scale, initial_state=h0, output_final_state=output_final_state,
        chunk_size=chunk_size, out_dtype=dt,
    )
    o = (o + c.v_mean).to(q.dtype)
    if not output_final_state:
        return o, None
    count = 0 if is_empty(initial_state) else initial_state.count
    return o, LinGDNState(h=h, k_sum=c.k_cum[:, -1], v_sum=c.v_cum[:, -1], count=count + T)
