"""dq, dk for ungated and scalar-gated chunks (docs/design.md §10), and the scalar gate's gradient.

Per chunk (S: state entering it, dS': gradient of the state leaving it, dA = dO V^T on
the causal lower triangle, Gamma_ij = e^{gamma_i - gamma_j}):
    dq = scale (e^gamma ⊙ dO S^T + (dA ⊙ Gamma) K)
    dk = e^{gamma_C - gamma} ⊙ V dS'^T + scale (dA ⊙ Gamma)^T Q
Gate gradient: dg_t = sum_{t' >= t} (q_t'.dq_t' - k_t'.dk_t') + <h_T, dh_T>, since shifting
every log-gate from t on by eps scales exactly the terms those products count. Summed
over a whole sequence, the rounding of 32k such terms piles up (bf16: 5-10% error), so the
sum is cut at the chunk end: for t in chunk n,
    dg_t = sum_{t' >= t in chunk n} (q.dq - k.dk)_t' + <S', dS'>
with S' = e^{gamma_C} S + (K ⊙ e^{gamma_C - gamma})^T V the state leaving the chunk, so
<S', dS'> = e^{gamma_C} <S, dS'> + sum_j k_j . dk_j(inter).
Formed that way, dg is a difference of O(1) terms that cancel: each token's own term
(q_t.k_t)(do_t.v_t) sits in both q_t.dq_t and k_t.dk_t, and the last token's k.dk(inter) in
both sums, while under strong gates dg itself is ~e^g; fp32 rounding then leaves dg an error
of eps32 e^|g|. So the kernel sums only what does not cancel: with P = (dA ⊙ Gamma) ⊙ QK^T
(scaled) strictly below the diagonal,
    dg_t = sum_{t' >= t} (q.dq(inter)_t' + sum_j P_t'j - sum_i P_it')
           + sum_{j < t} k_j . dk_j(inter) + e^{gamma_C} <S, dS'>,
the same sum term by term, each part as small as the decays in it. Each K-block program
writes its share of dg; the shares are summed.

With DqkLaunch.fuse_dv, where one K-block spans the whole key width, the kernel also forms
    dv = A^T dO + (K ⊙ e^{gamma_C - gamma}) dS',  A = scale (Q K^T ⊙ Gamma) (causal),
in a second pass over V after dq and dk are stored, from the q and k tiles it holds (the dO
and dS' tiles again, as the first pass has just read them), exactly as
triton_output.chunk_bwd_dv does (the same products, the decay applied to the fp32 result):
that kernel, which reads q, k, dO and dS' once more, is not launched. Spill stack of the
kernel (sm_90 screen, Triton 3.9, `python tests/compile_sm90.py --resources`), unfused 240 B
at K = 64, 4 warps: dv in a second pass 656 B at 4 warps and 144 at 8 (K = 128 in one
128-key block: 1,864 / 256), dv inside the first pass 600 / 240 (1,968 / 864); hence the
second pass, at 4 warps: 8 warps over one 128-key block ran slower at both head dims (launch
candidate 7 in docs/results.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.triton.gates import GATE_SCALAR, pair_gate_grad, sum_before
from kernels.common.triton.tiles import load_gamma_rows, load_tile, load_tile_t, store_tile
from kernels.common.triton.utils import block_size, chunk_launch, dot_precision, new_buffer, warps


@triton.jit
def chunk_bwd_dqk_kernel(
    q, k, v, gamma, h, do, dh, dq, dk, dg, dv, scale, T, NT, dg_stride,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, FUSE_DV: tl.constexpr, DOT_PREC: tl.constexpr,
):
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = i_b.to(tl.int64) * T * H + i_h
    t0 = i_t * BT
    o_i = tl.arange(0, BT)
    m_t = t0 + o_i < T
    state = (i_bh * NT + i_t).to(tl.int64) * K * V
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_dA = tl.zeros([BT, BT], dtype=tl.float32)
    b_hdh = tl.zeros([BV, BK], dtype=tl.float32)  # S ⊙ dS' summed over V-blocks (scalar gate)
    for i_v in range(tl.cdiv(V, BV)):
        b_v = load_tile(v + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
        b_do = load_tile(do + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
        # states loaded transposed, [BV, BK]
        b_ht = load_tile_t(h + state, i_k * BK, i_v * BV, K, V, V, BK, BV).to(b_v.dtype)
        b_dht = load_tile_t(dh + state, i_k * BK, i_v * BV, K, V, V, BK, BV).to(b_v.dtype)
        b_dq += tl.dot(b_do, b_ht, input_precision=DOT_PREC)
        b_dk += tl.dot(b_v, b_dht, input_precision=DOT_PREC)
        b_dA += tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)
        if GATE == 1:
            b_hdh += b_ht.to(tl.float32) * b_dht.to(tl.float32)
    b_q = load_tile(q + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
    b_k = load_tile(k + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
    m_causal = o_i[:, None] >= o_i[None, :]
    if GATE == 1:
        last = tl.minimum(t0 + BT, T) - 1
        b_g = load_gamma_rows(gamma + seq, t0, T, H, BT)
        b_glast = tl.load(gamma + seq + last * H)
        b_dq *= tl.exp2(b_g)[:, None]
        b_dk *= tl.exp2(b_glast - b_g)[:, None]
        # this K-block's shares of the gate gradient's parts (module docstring)
        b_qdq_inter = tl.sum(b_dq * b_q.to(tl.float32), axis=1) * scale
        b_kdk_inter = tl.sum(b_dk * b_k.to(tl.float32), axis=1)
        b_after = tl.exp2(b_glast) * tl.sum(b_hdh)
        b_dA *= tl.exp2(tl.where(m_causal, b_g[:, None] - b_g[None, :], float("-inf"))) * scale
    else:
        b_dA = tl.where(m_causal, b_dA, 0.0) * scale
    b_dq = b_dq * scale + tl.dot(b_dA.to(b_k.dtype), b_k, input_precision=DOT_PREC)
    b_dk += tl.dot(tl.trans(b_dA).to(b_q.dtype), b_q, input_precision=DOT_PREC)
    store_tile(dq + seq * K, b_dq, t0, i_k * BK, T, K, H * K, BT, BK)
    store_tile(dk + seq * K, b_dk, t0, i_k * BK, T, K, H * K, BT, BK)
    if GATE == 1:
        b_dG = b_qdq_inter + pair_gate_grad(b_dA * tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PREC))
        b_dg = tl.cumsum(b_dG, axis=0, reverse=True) + sum_before(b_kdk_inter) + b_after
        # one share per K-block: dg is [NK, B, T, H]
        tl.store(dg + i_k.to(tl.int64) * dg_stride + seq + (t0 + o_i) * H, b_dg, mask=m_t)
    if FUSE_DV:  # one K-block (i_k = 0): b_q, b_k hold every key column
        b_At = tl.dot(b_k, tl.trans(b_q), input_precision=DOT_PREC)  # [key j, query i]
        m_causal_t = o_i[:, None] <= o_i[None, :]
        if GATE == 1:
            b_At *= tl.exp2(tl.where(m_causal_t, b_g[None, :] - b_g[:, None], float("-inf"))) * scale
            b_decay_v = tl.exp2(b_glast - b_g)
        else:
            b_At = tl.where(m_causal_t, b_At, 0.0) * scale
        b_At = b_At.to(b_k.dtype)  # the dtype its product takes, once rather than per V-block
        # dq, dk and dA are spent: this second pass over V holds only q, k, A^T and one dv tile
        for i_v in range(tl.cdiv(V, BV)):
            b_do = load_tile(do + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
            b_dh = load_tile(dh + state, 0, i_v * BV, K, V, V, BK, BV).to(b_k.dtype)
            b_dv = tl.dot(b_k, b_dh, input_precision=DOT_PREC)
            if GATE == 1:
                b_dv *= b_decay_v[:, None]
            b_dv += tl.dot(b_At, b_do, input_precision=DOT_PREC)
            store_tile(dv + seq * V, b_dv, t0, i_v * BV, T, V, H * V, BT, BV)


def dv_fused(K: int, gate: int) -> bool:
    """Whether chunk_bwd_dqk forms dv too for key width K under the launch settings in effect
    (DqkLaunch.fuse_dv, and one K-block of at most BK keys spans K)."""
    cfg = chunk_launch(gate).bwd_dqk
    return cfg.fuse_dv and block_size(K, cfg.BK) >= K


def chunk_bwd_dqk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
    h: torch.Tensor, dh: torch.Tensor, gamma: torch.Tensor | None, gate: int,
    scale: float, chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Gradients of q, k, (scalar gate) of the natural-log gate g and, where dv_fused holds,
    of v.

    q, k: [B, T, H, K]; v, do: [B, T, H, V]; h: [B, H, NT, K, V] states entering each chunk;
    dh: [B, H, NT, K, V] gradients of the states leaving each chunk (the last one: dh_T);
    gamma: [B, T, H] fp32 log2 cumulative gates or None. Returns dq, dk in q's dtype,
    dg: [B, T, H] fp32 for a scalar gate, else None, and dv [B, T, H, V] in do's dtype where
    dv_fused(K, gate), else None (chunk_bwd_dv forms it then).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, chunk_size)
    cfg = chunk_launch(gate).bwd_dqk
    BK, BV = block_size(K, cfg.BK), block_size(V, cfg.BV)
    NK = triton.cdiv(K, BK)
    fuse_dv = dv_fused(K, gate)
    dq = new_buffer((B, T, H, K), q.dtype, q.device)
    dk = new_buffer((B, T, H, K), k.dtype, k.device)
    dg = new_buffer((NK, B, T, H), torch.float32, q.device) if gate == GATE_SCALAR else None
    dv = new_buffer((B, T, H, V), do.dtype, do.device) if fuse_dv else None
    grid = (NK, NT, B * H)
    chunk_bwd_dqk_kernel[grid](
        q, k, v, gamma if gamma is not None else q, h, do, dh, dq, dk, dg if dg is not None else dq,
        dv if dv is not None else dq, scale, T, NT, B * T * H, H=H, K=K, V=V, BT=chunk_size, BK=BK, BV=BV,
        GATE=gate, FUSE_DV=fuse_dv, DOT_PREC=dot_precision(q.dtype, cfg.fp32_dots), num_warps=warps(cfg.num_warps),
        num_stages=cfg.num_stages,
    )
    if dg is not None:
        dg = dg[0] if NK == 1 else dg.sum(0)
    return dq, dk, dg, dv
