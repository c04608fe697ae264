"""The three intra-chunk paths of the vector-gate (GLA) kernels, as Triton helpers: each
computes one K-block's share of a chunk's A (forward) or of its intra-chunk dq, dk
(backward). triton_vector.py explains the maths and when each path is safe; here:

- PATH_CHUNK, the whole chunk factored around its first row: one dot.
- PATH_SUB, each sub-chunk of BC rows factored around its own first row r_s: one dot per
  sub-chunk s, its rows against every key up to its end. A key j of sub-chunk u <= s
  enters with e^{r_s - gamma_j} = e^{r_u - gamma_j} * prod_{u <= w < s} e^{r_{w+1} - r_w}:
  its own factor (in [1, 2^span]) times a running product of per-channel decays, so the
  loop over s multiplies instead of taking a fresh exponential of every key each time.
- PATH_EXACT, sub-chunk blocks factored around the later sub-chunk's first row and the
  diagonal blocks summed element by element with the exact exponent.

Tiles are [BT, BK] (q, k, gamma of one chunk's K-block, gamma's padded rows set to the last
valid row's, i.e. zero gates) and [BT, BT] (A, dA). Exponents are in log2 units.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.common.triton.tiles import load_row, load_tile

# constexpr so the kernels can read them; .value in Python
PATH_CHUNK = tl.constexpr(0)
PATH_SUB = tl.constexpr(1)
PATH_EXACT = tl.constexpr(2)


@triton.jit
def load_chunk_qkg(q, k, gamma, seq, t0, last, m_t, i_k, T,
                   H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    """One chunk's K-block: q, k [BT, BK], gamma [BT, BK] with padded rows set to the last
    valid row (a zero gate), gamma's last and first rows [BK]."""
    b_q = load_tile(q + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
    b_k = load_tile(k + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
    b_g = load_tile(gamma + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
    b_glast = load_row(gamma + seq * K, last, i_k * BK, T, K, H * K, BK)
    b_g = tl.where(m_t[:, None], b_g, b_glast[None, :])
    b_gfirst = load_row(gamma + seq * K, t0, i_k * BK, T, K, H * K, BK)
    return b_q, b_k, b_g, b_glast, b_gfirst


@triton.jit
def load_sub_first(gamma, seq, t0, last, i_k, T,
                   H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr):
    """[BT, BK]: gamma at the first row of each row's sub-chunk (a sub-chunk wholly past T
    takes the last valid row, like the padded rows of load_chunk_qkg)."""
    o_first = (tl.arange(0, BT) // BC) * BC
    t_first = tl.minimum(t0 + o_first, last)
    o_k = i_k * BK + tl.arange(0, BK)
    p_g = gamma + (seq + t_first.to(tl.int64) * H)[:, None] * K + o_k[None, :]
    return tl.load(p_g, mask=(o_k < K)[None, :], other=0.0)


@triton.jit
def chunk_path(gamma, seq, t0, last, i_k, T, span,
               H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr):
    """The path of one chunk's K-block: PATH_CHUNK if every channel decays by at most 2^span
    from the chunk's first row to its last, else PATH_SUB if it does so within every
    sub-chunk, else PATH_EXACT (triton_vector.chunk_paths is the same test in PyTorch).
    The first test reads two rows; only chunks that fail it read the whole tile."""
    b_glast = load_row(gamma + seq * K, last, i_k * BK, T, K, H * K, BK)
    b_gfirst = load_row(gamma + seq * K, t0, i_k * BK, T, K, H * K, BK)
    path = tl.where(tl.max(b_gfirst - b_glast, axis=0) <= span, PATH_CHUNK, PATH_SUB)
    if path != PATH_CHUNK:
        o_t = t0 + tl.arange(0, BT)
        b_g = load_tile(gamma + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
        b_g = tl.where((o_t < T)[:, None], b_g, b_glast[None, :])
        b_gsub = load_sub_first(gamma, seq, t0, last, i_k, T, H, K, BT, BC, BK)
        path = tl.where(tl.max(tl.max(b_gsub - b_g, axis=1), axis=0) <= span, PATH_SUB, PATH_EXACT)
    return path


@triton.jit
def intra_A_chunk(b_q, b_k, b_g, b_gfirst, DOT_PREC: tl.constexpr):
    """PATH_CHUNK's A (before the causal mask): one dot around the chunk's first row."""
    b_qg = (b_q * tl.exp2(b_g - b_gfirst[None, :])).to(b_q.dtype)
    b_kg = (b_k * tl.exp2(b_gfirst[None, :] - b_g)).to(b_k.dtype)
    return tl.dot(b_qg, tl.trans(b_kg), input_precision=DOT_PREC)


@triton.jit
def intra_A_sub(b_q, b_k, b_g, gamma, seq, t0, last, i_k, T,
                H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                DOT_PREC: tl.constexpr):
    """PATH_SUB's A (causal): one dot per sub-chunk s, its rows against keys up to its end."""
    o_i = tl.arange(0, BT)
    o_sub = o_i // BC
    m_causal = o_i[:, None] >= o_i[None, :]
    b_gsub = load_sub_first(gamma, seq, t0, last, i_k, T, H, K, BT, BC, BK)
    b_qg = (b_q * tl.exp2(b_g - b_gsub)).to(b_q.dtype)  # factors in [2^-span, 1]
    # keys around r_s for sub-chunks <= s; a later key keeps its own factor (in [1, 2^span],
    # finite) and is masked out of the causal product
    b_kr = b_k.to(tl.float32) * tl.exp2(b_gsub - b_g)
    # the first sub-chunk rescales no key (o_sub < 0 is empty), so its previous row is moot
    b_gprev = tl.zeros([BK], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for s in tl.static_range(BT // BC):
        b_gr = load_row(gamma + seq * K, tl.minimum(t0 + s * BC, last), i_k * BK, T, K, H * K, BK)
        b_kr = tl.where((o_sub < s)[:, None], b_kr * tl.exp2(b_gr - b_gprev)[None, :], b_kr)
        b_gprev = b_gr
        b_part = tl.dot(b_qg, tl.trans(b_kr.to(b_k.dtype)), input_precision=DOT_PREC)
        b_A += tl.where((o_sub == s)[:, None] & m_causal, b_part, 0.0)
    return b_A


@triton.jit
def intra_A_exact(b_q, b_k, b_g, k, gamma, seq, t0, o_i, o_t, m_t, o_k, m_k, i_k, T,
                  H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                  DOT_PREC: tl.constexpr):
    """PATH_EXACT's A (causal): safe for any gates."""
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
def dqk_intra_chunk(b_q, b_k, b_g, b_gfirst, b_dA, DOT_PREC: tl.constexpr):
    """PATH_CHUNK's intra-chunk dq, dk and their share of dG = q dq - k dk, one dot each
    around the chunk's first row. b_dA: [BT, BT] fp32 (strictly lower, scaled: each
    token's own pair is the caller's); returns (dq, dk, dG)
    [BT, BK] fp32.

    dG sums pairs (i, j) twice, once from dq_i and once, subtracted, from dk_j; only pairs
    that straddle a position survive its reverse cumsum, and with short memory (decays of
    e^-1 a token and below) those are a small rest of much larger terms. So both sides use
    the same rounded factored operands, QG = q e^{gamma - r} and KG = k e^{r - gamma} as the
    dots saw them: dG = QG (dA KG) - KG (dA^T QG), in which each pair cancels exactly; q dq
    from the unrounded q would leave each pair's rounding (2^-9 in bf16) behind."""
    b_qfac = tl.exp2(b_g - b_gfirst[None, :])
    b_kfac = tl.exp2(b_gfirst[None, :] - b_g)
    b_kg = (b_k * b_kfac).to(b_k.dtype)
    b_qg = (b_q * b_qfac).to(b_q.dtype)
    b_dAc = b_dA.to(b_k.dtype)
    b_p = tl.dot(b_dAc, b_kg, input_precision=DOT_PREC)
    b_r = tl.dot(tl.trans(b_dAc), b_qg, input_precision=DOT_PREC)
    b_dG = b_qg.to(tl.float32) * b_p - b_kg.to(tl.float32) * b_r
    return b_p * b_qfac, b_r * b_kfac, b_dG


@triton.jit
def dqk_intra_sub(b_q, b_k, b_g, b_dA, gamma, seq, t0, last, i_k, T,
                  H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                  DOT_PREC: tl.constexpr):
    """PATH_SUB's intra-chunk dq, dk and share of dG, sub-chunk by sub-chunk as in intra_A_sub:
    dq_i = e^{gamma_i - r_s} sum_j dA_ij k_j e^{r_s - gamma_j} for the rows i of s;
    dk_j = sum_s e^{r_s - gamma_j} sum_{i in s} dA_ij q_i e^{gamma_i - r_s};
    dG from the rounded factored operands, as in dqk_intra_chunk."""
    o_sub = tl.arange(0, BT) // BC
    b_gsub = load_sub_first(gamma, seq, t0, last, i_k, T, H, K, BT, BC, BK)
    b_qg = (b_q * tl.exp2(b_g - b_gsub)).to(b_q.dtype)
    # e^{r_s - gamma_j} for keys of sub-chunks <= s; a later key keeps its own factor (in
    # [1, 2^span], finite) and meets only zeros of the causal dA
    b_kr = tl.exp2(b_gsub - b_g)
    b_gprev = tl.zeros([BK], dtype=tl.float32)  # moot in the first sub-chunk, as in intra_A_sub
    b_dAc = b_dA.to(b_k.dtype)
    b_p = tl.zeros([BT, BK], dtype=tl.float32)  # dq before the query factor
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_kgr = tl.zeros([BT, BK], dtype=tl.float32)  # sum_s KG_s (dA_s^T QG): dG's key side
    for s in tl.static_range(BT // BC):
        b_gr = load_row(gamma + seq * K, tl.minimum(t0 + s * BC, last), i_k * BK, T, K, H * K, BK)
        b_kr = tl.where((o_sub < s)[:, None], b_kr * tl.exp2(b_gr - b_gprev)[None, :], b_kr)
        b_gprev = b_gr
        m_s = (o_sub == s)[:, None]
        b_kg = (b_k * b_kr).to(b_k.dtype)
        b_p += tl.where(m_s, tl.dot(b_dAc, b_kg, input_precision=DOT_PREC), 0.0)
        b_r = tl.dot(tl.trans(tl.where(m_s, b_dAc, 0.0).to(b_q.dtype)), b_qg, input_precision=DOT_PREC)
        b_dk += b_r * b_kr
        b_kgr += b_r * b_kg.to(tl.float32)
    b_dG = b_qg.to(tl.float32) * b_p - b_kgr
    # the query factors again (recomputed: cheaper than a tile held through the loop)
    b_dq = b_p * tl.exp2(b_g - load_sub_first(gamma, seq, t0, last, i_k, T, H, K, BT, BC, BK))
    return b_dq, b_dk, b_dG


@triton.jit
def dqk_intra_exact(b_q, b_k, b_g, b_dA, q, k, gamma, seq, t0, last, o_i, o_t, o_k, m_k, i_k, T,
                    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                    DOT_PREC: tl.constexpr):
    """PATH_EXACT's intra-chunk dq, dk and share of dG (q dq - k dk), safe for any gates:
    dq_i = sum_{j<=i} dA_ij k_j e^{gamma_i - gamma_j}, dk_j = sum_{i>=j} dA_ij q_i e^{gamma_i - gamma_j}
    (the diagonal of dA is zero here: the caller adds each token's own pair)."""
    # --- off-diagonal sub-chunk blocks (masked full-chunk products)
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

    # --- diagonal sub-chunk blocks, element by element
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
    return b_dq, b_dk, b_q.to(tl.float32) * b_dq - b_k.to(tl.float32) * b_dk
