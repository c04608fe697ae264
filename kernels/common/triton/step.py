"""Fused one-token decode step of the linear-attention family on Triton (no autograd).

    linear / GLA:       h' = D h + k v^T
    (gated) delta rule: h' = D h + beta k (v - (D h)^T k)^T       (= D (I - beta k k^T) h + beta k v^T)
    o = h'^T (scale q)

with D = 1 (no gate), e^{g} (scalar gate) or diag(e^{g}) (vector gate), formed as exp2(LOG2E g)
(kernels/common/triton/gates.py). One pass over the
state: each program reads its [K, BV] block of h once (the whole K, which the delta
rule's recall h^T k needs), and writes the new block and its slice of o. The PyTorch steps
(kernels/<op>/step.py) make several passes and temporaries of the state's size;
the 2026-11-29 H200 timing of both is `git show 4509c5c:results/bench/h200_linear_gla_tune.json`
(decode_step). States are
fp32; fp64 inputs are not taken (the callers keep them on the PyTorch step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.triton.gates import GATE_NONE, GATE_SCALAR, GATE_VECTOR, LOG2E_C
from kernels.common.triton.utils import new_buffer, warps


@triton.jit
def fused_step_kernel(
    q, k, v, g, beta, h, o, h_new, scale,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, DELTA: tl.constexpr, HAS_STATE: tl.constexpr,
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
            b_h *= tl.exp2(tl.load(g + row).to(tl.float32) * LOG2E_C)
        elif GATE == 2:
            b_h *= tl.exp2(tl.load(g + row * K + o_k, mask=m_k, other=0.0).to(tl.float32) * LOG2E_C)[:, None]
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if DELTA:
        # write beta (v - recalled) where recalled = (D h)^T k: the delta rule's correction
        b_beta = tl.load(beta + row).to(tl.float32)
        b_u = b_v - tl.sum(b_h * b_k[:, None], axis=0)
        b_h += (b_beta * b_k)[:, None] * b_u[None, :]
    else:
        b_h += b_k[:, None] * b_v[None, :]
    tl.store(h_new + p_h, b_h, mask=m_h)
    b_o = tl.sum(b_h * b_q[:, None], axis=0)
    tl.store(o + row * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)


def fused_step(
    q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, g_t: torch.Tensor | None,
    beta_t: torch.Tensor | None, state: torch.Tensor | None, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step, arguments already validated (fp16/bf16/fp32, no autograd).

    q_t, k_t: [B, H, K]; v_t: [B, H, V]; g_t: [B, H] (scalar gate), [B, H, K] (vector gate)
    or None; beta_t: [B, H] for the delta rules, None for (gated) linear attention;
    state: [B, H, K, V] or None (zeros); K, V <= 256.
    Returns (o_t [B, H, V] in q_t's dtype, new state [B, H, K, V] fp32).
    """
    if q_t.dtype == torch.float64:
        raise ValueError("fused_step: fp64 inputs run on the PyTorch step (backend='torch')")
    B, H, K = q_t.shape
    V = v_t.shape[-1]
    gate = GATE_NONE if g_t is None else (GATE_VECTOR if g_t.dim() == 3 else GATE_SCALAR)
    q_t, k_t, v_t = (t.contiguous() for t in (q_t, k_t, v_t))
    g_t = g_t.contiguous() if g_t is not None else None
    beta_t = beta_t.contiguous() if beta_t is not None else None
    state = state.contiguous() if state is not None else None
    BK = max(16, triton.next_power_of_2(K))
    BV = min(64 if BK <= 128 else 32, max(16, triton.next_power_of_2(V)))
    o = new_buffer((B, H, V), q_t.dtype, q_t.device)
    h_new = new_buffer((B, H, K, V), torch.float32, q_t.device)
    grid = (triton.cdiv(V, BV), B * H)
    fused_step_kernel[grid](
        q_t, k_t, v_t, g_t if g_t is not None else q_t, beta_t if beta_t is not None else q_t,
        state if state is not None else h_new, o, h_new, float(scale),
        K=K, V=V, BK=BK, BV=BV, GATE=gate, DELTA=beta_t is not None, HAS_STATE=state is not None,
        num_warps=warps(4),
    )
    return o, h_new
