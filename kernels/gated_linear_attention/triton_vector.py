"""Vector-gate (GLA) intra-chunk kernels: the matrix A and the q/k/g gradients.

A_ij = scale sum_c q_ic k_jc e^{gamma_ic - gamma_jc} (i >= j in one chunk) does not factor
safely as (Q ⊙ e^gamma)(K ⊙ e^-gamma)^T: e^-gamma overflows once a channel's gates sum
below about -88 within a chunk (DESIGN §10). So each chunk is cut into sub-chunks of BC
rows (LAUNCH "sub_chunk", 16 by default). A block of rows in sub-chunk s against columns of
earlier sub-chunks factors around
a reference point r = gamma at the first row of s: (Q ⊙ e^{gamma - r}) (K ⊙ e^{r - gamma})^T,
where both exponents are <= 0 (gamma only decreases). The diagonal BC x BC blocks are
summed element by element with the exact exponent gamma_i - gamma_j <= 0. No exponent is
ever positive, so no gate, however negative, overflows. The backward uses the same cut.

Padding rows past T take the gamma of the last valid row (a zero gate), so they obey the
same ordering and never produce an overflow either.

Fast path: where a chunk's gates are mild (every channel of the K-block decays by at most
2^FACTORED_SPAN from the chunk's first row to its last), the whole chunk factors around
r = gamma at its first row: (Q ⊙ e^{gamma - r}) (K ⊙ e^{r - gamma})^T. Then every key
factor lies in [1, 2^span] and every query factor in [2^-span, 1]: no overflow and no
underflow, and each product keeps the relative rounding of the sub-chunk path's dots. It is
one dot instead of the sub-chunk dots and the element-by-element diagonal (whose exp2 work
dominates the kernel). The choice is made per chunk and K-block from the data, so strongly
negative gates still take the exact sub-chunk path. fp16 never takes it (scaled keys
could leave fp16's range).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.triton.launch import LAUNCH, tile
from kernels.common.triton.tiles import load_row, load_tile, load_tile_t, store_tile
from kernels.common.triton.utils import dot_precision, new_buffer, warps

# rows per sub-chunk of the exact path: LAUNCH["intra_A"] / ["bwd_dqkg"]["sub_chunk"]
# (a power of two, at most the chunk): the element-by-element diagonal work scales with it, the
# number of off-diagonal dots with chunk / sub_chunk


def sub_chunk(entry: str, chunk_size: int) -> int:
    """The exact path's sub-chunk rows for LAUNCH[entry], checked."""
    bc = int(LAUNCH[entry].get("sub_chunk", 16))
    if bc < 1 or bc & (bc - 1):
        raise ValueError(f"LAUNCH[{entry!r}]['sub_chunk'] must be a power of two, got {bc}")
    return min(bc, chunk_size)
# log2 of the largest key factor the fast path accepts, per input dtype (absent: never).
# 2^32 leaves fp32's and bf16's range (2^128) far away for any sensible key.
FACTORED_SPAN: dict[torch.dtype, float] = {torch.float32: 32.0, torch.bfloat16: 32.0}


def factored_span(dtype: torch.dtype) -> float:
    """The fast path's bound for inputs of `dtype`; -1 (never taken) if it has none."""
    return FACTORED_SPAN.get(dtype, -1.0)


@triton.jit
def load_chunk_qkg(q, k, gamma, seq, t0, last, m_t, i_k, T,
                   H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    """One chunk's K-block: q, k [BT, BK], gamma [BT, BK] with padded rows set to the last
    valid row (a zero gate), gamma's last and first rows [BK]. The fast path is taken where
    max(first - last) <= span: the largest key factor it would form is 2^span."""
    b_q = load_tile(q + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
    b_k = load_tile(k + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
    b_g = load_tile(gamma + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
    b_glast = load_row(gamma + seq * K, last, i_k * BK, T, K, H * K, BK)
    b_g = tl.where(m_t[:, None], b_g, b_glast[None, :])
    b_gfirst = load_row(gamma + seq * K, t0, i_k * BK, T, K, H * K, BK)
    return b_q, b_k, b_g, b_glast, b_gfirst


@triton.jit
def _intra_A_exact(b_q, b_k, b_g, k, gamma, seq, t0, o_i, o_t, m_t, o_k, m_k, i_k, T,
                   H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                   DOT_PREC: tl.constexpr):
    """One K-block's share of a chunk's A by sub-chunks (module docstring): safe for any
    gates. b_q, b_k, b_g: the chunk's [BT, BK] tiles (b_g padded with the last valid row)."""
    NC: tl.constexpr = BT // BC
    o_first = (o_i // BC) * BC  # first position of each row's sub-chunk
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for s in tl.static_range(1, NC):
        r0 = t0 + s * BC
        if r0 < T:
            # rows of sub-chunk s against keys before it, factored around r = gamma at row r0
            b_gr = load_row(gamma + seq * K, r0, i_k * BK, T, K, H * K, BK)
            m_rows = (o_t >= r0) & (o_t < r0 + BC)
            b_qg = (b_q * tl.exp2(tl.where(m_rows[:, None], b_g - b_gr[None, :], float("-inf")))).to(b_q.dtype)
            b_kg = (b_k * tl.exp2(tl.where((o_t < r0)[:, None], b_gr[None, :] - b_g, float("-inf")))).to(b_k.dtype)
            b_A += tl.dot(b_qg, tl.trans(b_kg), input_precision=DOT_PREC)
    # diagonal sub-chunk blocks, element by element with exact exponents: in step jj
    # every row i meets the jj-th key of its own sub-chunk
    b_qf = b_q.to(tl.float32)
    for jj in range(BC):
        o_p = o_first + jj
        t_p = t0 + o_p
        m_p = (t_p < T)[:, None] & m_k[None, :]
        p_off = (seq + t_p.to(tl.int64) * H)[:, None] * K + o_k[None, :]
        b_kp = tl.load(k + p_off, mask=m_p, other=0.0).to(tl.float32)
        b_gp = tl.load(gamma + p_off, mask=m_p, other=0.0)
        m_le = (o_p <= o_i)[:, None] & m_p
        b_val = tl.sum(b_qf * b_kp * tl.exp2(tl.where(m_le, b_g - b_gp, float("-inf"))), axis=1)
        b_A += tl.where(o_i[None, :] == o_p[:, None], b_val[:, None], 0.0)
    return b_A


@triton.jit
def gla_intra_A_kernel(
    q, k, gamma, A, scale, span, T,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    seq = i_b.to(tl.int64) * T * H + i_h
    t0 = i_t * BT
    last = tl.minimum(t0 + BT, T) - 1
    o_i = tl.arange(0, BT)  # position in the chunk
    o_t = t0 + o_i
    m_t = o_t < T
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    m_causal = o_i[:, None] >= o_i[None, :]
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q, b_k, b_g, b_glast, b_gfirst = load_chunk_qkg(q, k, gamma, seq, t0, last, m_t, i_k, T, H, K, BT, BK)
        if tl.max(b_gfirst - b_glast, axis=0) <= span:
            # fast path (module docstring): one dot around the chunk's first row
            b_qg = (b_q * tl.exp2(b_g - b_gfirst[None, :])).to(b_q.dtype)
            b_kg = (b_k * tl.exp2(b_gfirst[None, :] - b_g)).to(b_k.dtype)
            b_A += tl.where(m_causal, tl.dot(b_qg, tl.trans(b_kg), input_precision=DOT_PREC), 0.0)
        else:
            b_A += _intra_A_exact(b_q, b_k, b_g, k, gamma, seq, t0, o_i, o_t, m_t, o_k, m_k, i_k, T,
                                  H, K, BT, BC, BK, DOT_PREC)
    store_tile(A + seq * BT, b_A * scale, t0, 0, T, BT, H * BT, BT, BT)


def gla_intra_A(q: torch.Tensor, k: torch.Tensor, gamma: torch.Tensor, scale: float, chunk_size: int) -> torch.Tensor:
    """A: [B, T, H, BT] fp32, row t holds scale * sum_c q_tc k_jc e^{gamma_tc - gamma_jc} for
    the keys j of t's chunk (zero for j > t). q, k: [B, T, H, K]; gamma: [B, T, H, K] fp32
    log2 cumulative gates."""
    B, T, H, K = q.shape
    BT = chunk_size
    cfg = LAUNCH["intra_A"]
    A = new_buffer((B, T, H, BT), torch.float32, q.device)
    grid = (triton.cdiv(T, BT), B * H)
    gla_intra_A_kernel[grid](
        q, k, gamma, A, scale, factored_span(q.dtype), T, H=H, K=K, BT=BT, BC=sub_chunk("intra_A", BT),
        BK=tile(K, cfg["BK"]), DOT_PREC=dot_precision(q.dtype),
        num_warps=warps(cfg["num_warps"]), num_stages=cfg["num_stages"],
    )
    return A


@triton.jit
def _dqk_intra_exact(b_q, b_k, b_g, b_dA, q, k, gamma, seq, t0, last, o_i, o_t, o_k, m_k, i_k, T,
                     H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                     DOT_PREC: tl.constexpr):
    """Intra-chunk dq, dk of one K-block by sub-chunks (module docstring), safe for any gates:
    dq_i = sum_{j<=i} dA_ij k_j e^{gamma_i - gamma_j}, dk_j = sum_{i>=j} dA_ij q_i e^{gamma_i - gamma_j}.
    b_dA: [BT, BT] fp32 (causal, scaled); returns (dq, dk) [BT, BK] fp32."""
    # --- intra-chunk, off-diagonal sub-chunk blocks (masked full-chunk products)
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    NC: tl.constexpr = BT // BC
    for s in tl.static_range(1, NC):
        r0 = t0 + s * BC
        if r0 < T:
            # rows of sub-chunk s against keys before it, around r = gamma at row r0
            b_gr = load_row(gamma + seq * K, r0, i_k * BK, T, K, H * K, BK)
            m_rows = (o_t >= r0) & (o_t < r0 + BC)
            b_kg = (b_k * tl.exp2(tl.where((o_t < r0)[:, None], b_gr[None, :] - b_g, float("-inf")))).to(b_k.dtype)
            b_dAs = tl.where(m_rows[:, None], b_dA, 0.0).to(b_k.dtype)
            b_part = tl.dot(b_dAs, b_kg, input_precision=DOT_PREC)
            b_dq += b_part * tl.exp2(tl.where(m_rows[:, None], b_g - b_gr[None, :], float("-inf")))
    for s in tl.static_range(0, NC - 1):
        c_end = t0 + s * BC + BC - 1
        if c_end < last:
            # keys of sub-chunk s against queries after it, around r = gamma at row c_end
            b_gr = load_row(gamma + seq * K, c_end, i_k * BK, T, K, H * K, BK)
            m_cols = (o_t > c_end - BC) & (o_t <= c_end)
            b_qg = (b_q * tl.exp2(tl.where((o_t > c_end)[:, None], b_g - b_gr[None, :], float("-inf")))).to(b_q.dtype)
            b_dAs = tl.where(m_cols[None, :], b_dA, 0.0).to(b_q.dtype)
            b_part = tl.dot(tl.trans(b_dAs), b_qg, input_precision=DOT_PREC)
            b_dk += b_part * tl.exp2(tl.where(m_cols[:, None], b_gr[None, :] - b_g, float("-inf")))

    # --- intra-chunk, diagonal sub-chunk blocks, element by element
    o_first = (o_i // BC) * BC  # first in-chunk row of each row's sub-chunk
    for jj in range(BC):
        o_p = o_first + jj  # partner position in the same sub-chunk
        t_p = t0 + o_p
        m_p = (t_p < T)[:, None] & m_k[None, :]
        p_off = (seq + t_p.to(tl.int64) * H)[:, None] * K + o_k[None, :]
        b_gp = tl.load(gamma + p_off, mask=m_p, other=0.0)
        # dq_i += dA_ip k_p e^{gamma_i - gamma_p} for partners p <= i
        b_dA_ip = tl.sum(tl.where(o_i[None, :] == o_p[:, None], b_dA, 0.0), axis=1)
        b_kp = tl.load(k + p_off, mask=m_p, other=0.0).to(tl.float32)
        m_le = (o_p <= o_i)[:, None] & m_p
        b_dq += b_dA_ip[:, None] * b_kp * tl.exp2(tl.where(m_le, b_g - b_gp, float("-inf")))
        # dk_j += dA_pj q_p e^{gamma_p - gamma_j} for partners p >= j
        b_dA_pj = tl.sum(tl.where(o_i[:, None] == o_p[None, :], b_dA, 0.0), axis=0)
        b_qp = tl.load(q + p_off, mask=m_p, other=0.0).to(tl.float32)
        m_ge = (o_p >= o_i)[:, None] & m_p
        b_dk += b_dA_pj[:, None] * b_qp * tl.exp2(tl.where(m_ge, b_gp - b_g, float("-inf")))
    return b_dq, b_dk


@triton.jit
def _dqkg_chunk(
    q, k, v, gamma, h, do, dh, dq, dk, dg, scale, span, T, NT, i_k, i_t, i_bh, seq, t0, last,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DOT_PREC: tl.constexpr, PATHS: tl.constexpr,
):
    """dq, dk, dg of one chunk's K-block (gla_bwd_dqkg_kernel's program)."""
    o_i = tl.arange(0, BT)  # position in the chunk
    o_t = t0 + o_i
    m_t = o_t < T
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    state = (i_bh * NT + i_t).to(tl.int64) * K * V

    # --- everything that sums over V: inter-chunk parts, dA, and <S, dS'> per channel
    b_dq_inter = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk_inter = tl.zeros([BT, BK], dtype=tl.float32)
    b_dA = tl.zeros([BT, BT], dtype=tl.float32)
    b_hdh = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_v = load_tile(v + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
        b_do = load_tile(do + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
        b_ht = load_tile_t(h + state, i_k * BK, i_v * BV, K, V, V, BK, BV)
        b_dht = load_tile_t(dh + state, i_k * BK, i_v * BV, K, V, V, BK, BV)
        b_hdh += tl.sum(b_ht.to(tl.float32) * b_dht.to(tl.float32), axis=0)
        b_dq_inter += tl.dot(b_do, b_ht.to(b_do.dtype), input_precision=DOT_PREC)
        b_dk_inter += tl.dot(b_v, b_dht.to(b_v.dtype), input_precision=DOT_PREC)
        b_dA += tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)

    b_q, b_k, b_g, b_glast, b_gfirst = load_chunk_qkg(q, k, gamma, seq, t0, last, m_t, i_k, T, H, K, BT, BK)
    b_dA = tl.where(o_i[:, None] >= o_i[None, :], b_dA, 0.0) * scale

    # --- intra-chunk part: one factored dot pair when the gates are mild, else sub-chunks
    # (PATHS 1 / 2: the launch has sorted the chunks already, only one path is compiled)
    if PATHS == 1:
        b_dq, b_dk = _dqk_intra_factored(b_q, b_k, b_g, b_gfirst, b_dA, DOT_PREC)
    elif PATHS == 2:
        b_dq, b_dk = _dqk_intra_exact(b_q, b_k, b_g, b_dA, q, k, gamma, seq, t0, last, o_i, o_t, o_k, m_k,
                                      i_k, T, H, K, BT, BC, BK, DOT_PREC)
    elif tl.max(b_gfirst - b_glast, axis=0) <= span:
        b_dq, b_dk = _dqk_intra_factored(b_q, b_k, b_g, b_gfirst, b_dA, DOT_PREC)
    else:
        b_dq, b_dk = _dqk_intra_exact(b_q, b_k, b_g, b_dA, q, k, gamma, seq, t0, last, o_i, o_t, o_k, m_k,
                                      i_k, T, H, K, BT, BC, BK, DOT_PREC)
    b_qf = b_q.to(tl.float32)
    b_kf = b_k.to(tl.float32)

    # --- combine, and the gate gradient
    b_dq += b_dq_inter * tl.exp2(b_g) * scale
    b_dk_inter *= tl.exp2(b_glast[None, :] - b_g)
    b_dk += b_dk_inter
    b_dG = b_qf * b_dq - b_kf * b_dk
    # suffix beyond this chunk: <S', dS'> per channel, S' = e^{gamma_C} S + (K e^{gamma_C - gamma})^T V
    b_after = tl.exp2(b_glast) * b_hdh + tl.sum(b_kf * b_dk_inter, axis=0)
    b_dg = tl.cumsum(b_dG, axis=0, reverse=True) + b_after[None, :]
    store_tile(dq + seq * K, b_dq, t0, i_k * BK, T, K, H * K, BT, BK)
    store_tile(dk + seq * K, b_dk, t0, i_k * BK, T, K, H * K, BT, BK)
    store_tile(dg + seq * K, b_dg, t0, i_k * BK, T, K, H * K, BT, BK)


@triton.jit
def _dqk_intra_factored(b_q, b_k, b_g, b_gfirst, b_dA, DOT_PREC: tl.constexpr):
    """The fast path's intra-chunk dq, dk: one dot each around the chunk's first row."""
    b_kg = (b_k * tl.exp2(b_gfirst[None, :] - b_g)).to(b_k.dtype)
    b_qg = (b_q * tl.exp2(b_g - b_gfirst[None, :])).to(b_q.dtype)
    b_dAc = b_dA.to(b_k.dtype)
    b_dq = tl.dot(b_dAc, b_kg, input_precision=DOT_PREC) * tl.exp2(b_g - b_gfirst[None, :])
    b_dk = tl.dot(tl.trans(b_dAc), b_qg, input_precision=DOT_PREC) * tl.exp2(b_gfirst[None, :] - b_g)
    return b_dq, b_dk


@triton.jit
def gla_bwd_dqkg_kernel(
    q, k, v, gamma, h, do, dh, dq, dk, dg, scale, span, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DOT_PREC: tl.constexpr, PATHS: tl.constexpr,
):
    """One program per (K-block, chunk, head). PATHS 0: each program takes the fast or the
    exact path for its chunk; 1 (2): only programs whose chunk takes the fast (exact) path
    do any work, so a pair of launches covers every chunk once, each compiled for one path
    with its own num_warps."""
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = i_b.to(tl.int64) * T * H + i_h
    t0 = i_t * BT
    last = tl.minimum(t0 + BT, T) - 1
    if PATHS == 0:
        _dqkg_chunk(q, k, v, gamma, h, do, dh, dq, dk, dg, scale, span, T, NT, i_k, i_t, i_bh, seq, t0, last,
                    H, K, V, BT, BC, BK, BV, DOT_PREC, PATHS)
    else:
        # the same test as load_chunk_qkg's rows make in _dqkg_chunk (PATHS 0)
        b_span = tl.max(load_row(gamma + seq * K, t0, i_k * BK, T, K, H * K, BK)
                        - load_row(gamma + seq * K, last, i_k * BK, T, K, H * K, BK), axis=0)
        if PATHS == 1:
            if b_span <= span:
                _dqkg_chunk(q, k, v, gamma, h, do, dh, dq, dk, dg, scale, span, T, NT, i_k, i_t, i_bh, seq, t0,
                            last, H, K, V, BT, BC, BK, BV, DOT_PREC, PATHS)
        else:
            if b_span > span:
                _dqkg_chunk(q, k, v, gamma, h, do, dh, dq, dk, dg, scale, span, T, NT, i_k, i_t, i_bh, seq, t0,
                            last, H, K, V, BT, BC, BK, BV, DOT_PREC, PATHS)


def gla_bwd_dqkg(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
    h: torch.Tensor, dh: torch.Tensor, gamma: torch.Tensor, scale: float, chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk (q's dtype) and dg ([B, T, H, K] fp32, gradient of the natural-log gates).

    q, k: [B, T, H, K]; v, do: [B, T, H, V]; h, dh: [B, H, NT, K, V] (states entering each
    chunk, gradients of states leaving it); gamma: [B, T, H, K] fp32 log2 cumulative gates.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    BT = chunk_size
    NT = triton.cdiv(T, BT)
    cfg = LAUNCH["bwd_dqkg"]
    BK, BV = tile(K, cfg["BK"]), tile(V, cfg["BV"])
    dq = new_buffer((B, T, H, K), q.dtype, q.device)
    dk = new_buffer((B, T, H, K), k.dtype, k.device)
    dg = new_buffer((B, T, H, K), torch.float32, q.device)
    grid = (triton.cdiv(K, BK), NT, B * H)
    span = factored_span(q.dtype)
    # split_paths: the fast and the exact chunks as two launches with their own warps (an
    # exact-only dtype, span < 0, needs just the one); else one launch choosing per chunk
    launches = [(0, cfg)]
    if cfg["split_paths"]:
        exact = (2, LAUNCH["bwd_dqkg_exact"])
        launches = [exact] if span < 0 else [(1, cfg), exact]
    for paths, launch in launches:
        gla_bwd_dqkg_kernel[grid](
            q, k, v, gamma, h, do, dh, dq, dk, dg, scale, span, T, NT,
            H=H, K=K, V=V, BT=BT, BC=sub_chunk("bwd_dqkg", BT), BK=BK, BV=BV, DOT_PREC=dot_precision(q.dtype),
            PATHS=paths, num_warps=warps(launch["num_warps"]), num_stages=launch["num_stages"],
        )
    return dq, dk, dg
