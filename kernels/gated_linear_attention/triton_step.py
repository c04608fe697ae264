"""Fused one-token decode step of (gated) linear attention on Triton.

    h' = diag(e^{g_t}) h + k_t v_t^T        o_t = h'^T (scale q_t)

One pass over the state: each program reads its [K, BV] block of h once, and writes the
new block and its slice of o_t. The PyTorch step (kernels/<op>/step.py) makes several
passes and temporaries of the state's size; benchmarks/bench_linear_gla.py measures both.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.triton.utils import GATE_NONE, GATE_SCALAR, GATE_VECTOR, new_buffer, warps


@triton.jit
def fused_step_kernel(
    q, k, v, g, h, o, h_new, scale,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, HAS_STATE: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    row = i_bh.to(tl.int64)
    b_q = tl.load(q + row * K + o_k, mask=m_k, other=0.0).to(tl.float32) * scale
    b_k = tl.load(k + row * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_v = tl.load(v + row * V + o_v, mask=m_v, other=0.0).to(tl.float32)
    p_h = row * K * V + o_k[:, None] * V + o_v[None, :]
    if HAS_STATE:
        b_h = tl.load(h + p_h, mask=m_h, other=0.0).to(tl.float32)
        if GATE == 1:
            b_h *= tl.exp(tl.load(g + row).to(tl.float32))
        elif GATE == 2:
            b_h *= tl.exp(tl.load(g + row * K + o_k, mask=m_k, other=0.0).to(tl.float32))[:, None]
        b_h += b_k[:, None] * b_v[None, :]
    else:
        b_h = b_k[:, None] * b_v[None, :]
    tl.store(h_new + p_h, b_h.to(h_new.dtype.element_ty), mask=m_h)
    b_o = tl.sum(b_h * b_q[:, None], axis=0)
    tl.store(o + row * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)


def fused_step(
    q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, g_t: torch.Tensor | None,
    state: torch.Tensor | None, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step, arguments already validated (no autograd).

    q_t, k_t: [B, H, K]; v_t: [B, H, V]; g_t: [B, H] (scalar gate), [B, H, K] (vector gate)
    or None (linear attention); state: [B, H, K, V] or None (zeros); K, V <= 256.
    Returns (o_t [B, H, V] in q_t's dtype, new state [B, H, K, V] fp32, fp64 for fp64
    inputs; fp64 is computed in fp32).
    """
    B, H, K = q_t.shape
    V = v_t.shape[-1]
    gate = GATE_NONE if g_t is None else (GATE_VECTOR if g_t.dim() == 3 else GATE_SCALAR)
    state_dtype = torch.float64 if q_t.dtype == torch.float64 else torch.float32
    q_t, k_t, v_t = (t.contiguous() for t in (q_t, k_t, v_t))
    g_t = g_t.contiguous() if g_t is not None else None
    state = state.contiguous() if state is not None else None
    BK = max(16, triton.next_power_of_2(K))
    BV = 64 if BK <= 128 else 32
    BV = min(BV, max(16, triton.next_power_of_2(V)))
    o = new_buffer((B, H, V), q_t.dtype, q_t.device)
    h_new = new_buffer((B, H, K, V), state_dtype, q_t.device)
    grid = (triton.cdiv(V, BV), B * H)
    fused_step_kernel[grid](
        q_t, k_t, v_t, g_t if g_t is not None else q_t, state if state is not None else h_new, o, h_new,
        float(scale), K=K, V=V, BK=BK, BV=BV, GATE=gate, HAS_STATE=state is not None, num_warps=warps(4),
    )
    return o, h_new


def gated_linear_attention_step_triton(q_t, k_t, v_t, g_t, state, scale):
    """gated_linear_attention_step on Triton (validated arguments); see fused_step."""
    return fused_step(q_t, k_t, v_t, g_t, state, scale)
