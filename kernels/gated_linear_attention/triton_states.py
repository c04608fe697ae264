"""State passing across chunks (docs/design.md §10), forward and backward.

Forward: S_0 = h0 and, chunk by chunk,
    S_{n+1} = e^{gamma_C} S_n + (K_n ⊙ e^{gamma_C - gamma})^T V_n
(gamma: cumulative log-gate of the chunk, gamma_C its last row; per channel of K for a
vector gate, one number per token for a scalar gate, zero without a gate).
`chunk_fwd_states` stores S_n, the state *entering* chunk n, for every chunk.

Backward: with dS_N = dh_T (gradient of the final state, or zero),
    dS_n = e^{gamma_C} dS_{n+1} + scale (Q_n ⊙ e^{gamma})^T dO_n
`chunk_bwd_states` stores dS_{n+1}, the gradient of the state *leaving* chunk n, for every
chunk (what chunk n's dk and dv need), and returns dS_0 = dh0.

Layouts: k, q: [B, T, H, K]; v, do: [B, T, H, V]; gamma: [B, T, H] or [B, T, H, K] fp32 in
log2 units (chunk_local_cumsum); per-chunk states: [B, H, NT, K, V] in `state_dtype`;
h0, ht, dht, dh0: [B, H, K, V] fp32. Each program owns one (K-block, V-block) of one head
and walks the chunks in order, keeping its block of the state in fp32 registers; tile
widths and launch settings come from the ChunkLaunch in effect (kernels/common/launch/).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.triton.gates import GATE_VECTOR
from kernels.common.triton.tiles import load_row, load_tile, load_tile_t, store_tile
from kernels.common.triton.utils import chunk_launch, dot_precision, new_buffer, sequential_blocks, warps


@triton.jit
def _decay_value_rows(b_v, gamma, seq, t0, T, H: tl.constexpr, BT: tl.constexpr):
    """A scalar gate's factors e^{gamma_C - gamma_t} on the rows of a value tile b_v [BT, BV]
    (token x value), in place of the key tile's columns (_decay_rows, FROM_END): returns
    (scaled tile in b_v's dtype, e^{gamma_C}). Padded rows get a finite factor; their values
    are zero."""
    o_t = t0 + tl.arange(0, BT)
    b_g = tl.load(gamma + seq + o_t * H, mask=o_t < T, other=0.0)
    b_glast = tl.load(gamma + seq + (tl.minimum(t0 + BT, T) - 1) * H)
    return (b_v * tl.exp2(b_glast - b_g)[:, None]).to(b_v.dtype), tl.exp2(b_glast)


@triton.jit
def _decay_rows(b_x, gamma, seq, t0, T, H: tl.constexpr, K: tl.constexpr,
                BT: tl.constexpr, BK: tl.constexpr, i_k, GATE: tl.constexpr, FROM_END: tl.constexpr):
    """Scale a transposed chunk tile b_x [BK, BT] (feature x token) by its gate factors:
    e^{gamma_C - gamma_t} when FROM_END (keys into the state), else e^{gamma_t} (queries
    against the entering state). Returns (scaled tile in b_x's dtype, e^{gamma_C} per row
    of the state block: [BK] for a vector gate, a scalar otherwise)."""
    o_t = t0 + tl.arange(0, BT)
    m_t = o_t < T
    last = tl.minimum(t0 + BT, T) - 1
    if GATE == 1:
        b_g = tl.load(gamma + seq + o_t * H, mask=m_t, other=0.0)
        b_glast = tl.load(gamma + seq + last * H)
        if FROM_END:
            b_f = tl.exp2(b_glast - b_g)
        else:
            b_f = tl.exp2(b_g)
        b_x = (b_x * b_f[None, :]).to(b_x.dtype)
        b_state_decay = tl.exp2(b_glast)
    else:
        b_g = load_tile_t(gamma + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
        b_glast = load_row(gamma + seq * K, last, i_k * BK, T, K, H * K, BK)
        if FROM_END:
            b_f = tl.exp2(b_glast[:, None] - b_g)
        else:
            b_f = tl.exp2(b_g)
        b_x = (b_x * b_f).to(b_x.dtype)
        b_state_decay = tl.exp2(b_glast)
    return b_x, b_state_decay


@triton.jit
def chunk_fwd_states_kernel(
    k, v, gamma, h, h0, ht, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, DOT_PREC: tl.constexpr,
):
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = i_b.to(tl.int64) * T * H + i_h
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_H0:
        b_h += load_tile(h0 + i_bh.to(tl.int64) * K * V, i_k * BK, i_v * BV, K, V, V, BK, BV)
    for i_t in range(NT):
        t0 = i_t * BT
        store_tile(h + (i_bh * NT + i_t).to(tl.int64) * K * V, b_h, i_k * BK, i_v * BV, K, V, V, BK, BV)
        # keys loaded transposed [BK, BT] so the update is one (K x T) @ (T x V) product
        b_kt = load_tile_t(k + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
        b_v = load_tile(v + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
        if GATE == 1:
            b_kt, b_decay = _decay_rows(b_kt, gamma, seq, t0, T, H, K, BT, BK, i_k, GATE, True)
            b_h *= b_decay
        elif GATE == 2:
            b_kt, b_decay = _decay_rows(b_kt, gamma, seq, t0, T, H, K, BT, BK, i_k, GATE, True)
            b_h *= b_decay[:, None]
        b_h += tl.dot(b_kt, b_v, input_precision=DOT_PREC)
    if STORE_HT:
        store_tile(ht + i_bh.to(tl.int64) * K * V, b_h, i_k * BK, i_v * BV, K, V, V, BK, BV)


@triton.jit
def chunk_bwd_states_kernel(
    q, do, gamma, dh, dht, dh0, scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr, DOT_PREC: tl.constexpr,
):
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = i_b.to(tl.int64) * T * H + i_h
    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_DHT:
        b_dh += load_tile(dht + i_bh.to(tl.int64) * K * V, i_k * BK, i_v * BV, K, V, V, BK, BV)
    for i_s in range(NT):
        i_t = NT - 1 - i_s
        t0 = i_t * BT
        store_tile(dh + (i_bh * NT + i_t).to(tl.int64) * K * V, b_dh, i_k * BK, i_v * BV, K, V, V, BK, BV)
        b_qt = load_tile_t(q + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
        b_do = load_tile(do + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
        if GATE == 1:
            b_qt, b_decay = _decay_rows(b_qt, gamma, seq, t0, T, H, K, BT, BK, i_k, GATE, False)
            b_dh *= b_decay
        elif GATE == 2:
            b_qt, b_decay = _decay_rows(b_qt, gamma, seq, t0, T, H, K, BT, BK, i_k, GATE, False)
            b_dh *= b_decay[:, None]
        b_dh += tl.dot(b_qt, b_do, input_precision=DOT_PREC) * scale
    if STORE_DH0:
        store_tile(dh0 + i_bh.to(tl.int64) * K * V, b_dh, i_k * BK, i_v * BV, K, V, V, BK, BV)


def chunk_fwd_states(
    k: torch.Tensor, v: torch.Tensor, gamma: torch.Tensor | None, gate: int,
    h0: torch.Tensor | None, output_final_state: bool, chunk_size: int,
    state_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """States entering each chunk.

    k: [B, T, H, K]; v: [B, T, H, V]; gamma: cumulative log2-gates [B, T, H] (gate=GATE_SCALAR),
    [B, T, H, K] (GATE_VECTOR) or None (GATE_NONE); h0: [B, H, K, V] fp32 or None.
    Returns h: [B, H, NT, K, V] in state_dtype (default k.dtype) and, when asked,
    the final state ht: [B, H, K, V] fp32.
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, chunk_size)
    name = "fwd_states_vector" if gate == GATE_VECTOR else "fwd_states"
    cfg = getattr(chunk_launch(gate), name)
    BK, BV = sequential_blocks(cfg, K, V, B * H, k.device)
    h = new_buffer((B, H, NT, K, V), state_dtype or k.dtype, k.device)
    ht = new_buffer((B, H, K, V), torch.float32, k.device) if output_final_state else None
    grid = (triton.cdiv(K, BK), triton.cdiv(V, BV), B * H)
    chunk_fwd_states_kernel[grid](
        k, v, gamma if gamma is not None else k, h, h0 if h0 is not None else h, ht if ht is not None else h,
        T, NT, H=H, K=K, V=V, BT=chunk_size, BK=BK, BV=BV, GATE=gate,
        HAS_H0=h0 is not None, STORE_HT=output_final_state, DOT_PREC=dot_precision(k.dtype, cfg.fp32_dots),
        num_warps=warps(cfg.num_warps), num_stages=cfg.num_stages,
    )
    return h, ht


def chunk_bwd_states(
    q: torch.Tensor, do: torch.Tensor, gamma: torch.Tensor | None, gate: int,
    dht: torch.Tensor | None, need_dh0: bool, scale: float, chunk_size: int,
    state_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradients of the states leaving each chunk, and of the initial state.

    q: [B, T, H, K]; do: [B, T, H, V]; gamma as in chunk_fwd_states; dht: [B, H, K, V] or None.
    Returns dh: [B, H, NT, K, V] in state_dtype (default q.dtype), where dh[:, :, n] is the
    gradient of the state after chunk n, and dh0: [B, H, K, V] fp32 when need_dh0.
    """
    B, T, H, K = q.shape
    V = do.shape[-1]
    NT = triton.cdiv(T, chunk_size)
    name = "bwd_states_vector" if gate == GATE_VECTOR else "bwd_states"
    cfg = getattr(chunk_launch(gate), name)
    BK, BV = sequential_blocks(cfg, K, V, B * H, q.device)
    dh = new_buffer((B, H, NT, K, V), state_dtype or q.dtype, q.device)
    dh0 = new_buffer((B, H, K, V), torch.float32, q.device) if need_dh0 else None
    grid = (triton.cdiv(K, BK), triton.cdiv(V, BV), B * H)
    chunk_bwd_states_kernel[grid](
        q, do, gamma if gamma is not None else q, dh,
        dht.contiguous().float() if dht is not None else dh, dh0 if dh0 is not None else dh,
        scale, T, NT, H=H, K=K, V=V, BT=chunk_size, BK=BK, BV=BV, GATE=gate,
        HAS_DHT=dht is not None, STORE_DH0=need_dh0, DOT_PREC=dot_precision(q.dtype, cfg.fp32_dots),
        num_warps=warps(cfg.num_warps), num_stages=cfg.num_stages,
    )
    return dh, dh0
