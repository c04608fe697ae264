"""Vector-gate (GLA) intra-chunk kernels: the matrix A and the q/k/g gradients.

A_ij = scale sum_c q_ic k_jc e^{gamma_ic - gamma_jc} (i >= j in one chunk) does not factor
safely as (Q ⊙ e^gamma)(K ⊙ e^-gamma)^T: e^-gamma overflows once a channel's gates sum
below about -88 within a chunk (docs/design.md §10). Factoring around a reference point r inside
the range, (Q ⊙ e^{gamma - r})(K ⊙ e^{r - gamma})^T, is safe when the exponents stay within
+-span: query factors in [2^-span, 1], key factors in [1, 2^span] for keys after r, <= 1 for
keys before it (gamma only decreases). Each chunk and K-block takes one of three paths
(triton_vector_paths.py), chosen from the data:

1. PATH_CHUNK: every channel decays by at most 2^span across the chunk: the whole chunk
   factors around its first row, one dot.
2. PATH_SUB: it does so within every sub-chunk of BC rows (the launch's sub_chunk): each
   sub-chunk's rows factor around their own first row r_s against every key up to the
   sub-chunk's end, one dot per sub-chunk. Gates of a few nats a token (chunk spans of
   hundreds of bits) land here.
3. PATH_EXACT: otherwise. Blocks of rows in sub-chunk s against keys of earlier sub-chunks
   factor around r_s (both exponents <= 0, nothing can overflow whatever the gates); the
   diagonal BC x BC blocks are summed element by element with the exact exponent
   gamma_i - gamma_j <= 0. Its exp2 work dominates the kernels.

span is 64 (FACTORED_SPAN): with factors within 2^+-64 a key up to 2^63 and a query down to
2^-62 stay inside the normal range of fp32 and bf16 (2^+-126), so each product keeps the
relative rounding of the exact path's dots and no factor overflows or flushes to zero.
fp16 (range 2^+-15) always takes the exact path. The backward uses the same cut.

Padding rows past T take the gamma of the last valid row (a zero gate), so they obey the
same ordering and never produce an overflow either.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

from kernels.common.launch import ChunkLaunch, settings
from kernels.common.triton.cumsum import chunk_local_cumsum
from kernels.common.triton.gates import LOG2E, rows_before
from kernels.common.triton.tiles import load_tile, load_tile_t, store_tile
from kernels.common.triton.utils import block_size, dot_precision, new_buffer, warps
from kernels.gated_linear_attention.triton_vector_paths import (
    PATH_CHUNK,
    PATH_EXACT,
    PATH_SUB,
    chunk_path,
    dqk_intra_chunk,
    dqk_intra_exact,
    dqk_intra_sub,
    intra_A_chunk,
    intra_A_exact,
    intra_A_sub,
    load_chunk_qkg,
)

# log2 of the largest factor the factored paths accept, per input dtype (absent: never)
FACTORED_SPAN: dict[torch.dtype, float] = {torch.float32: 64.0, torch.bfloat16: 64.0}


def vector_launch() -> ChunkLaunch:
    """The launch settings in effect for the vector-gate kernels (gated_linear_attention's)."""
    return settings("gated_linear_attention")


def factored_span(dtype: torch.dtype) -> float:
    """The factored paths' bound for inputs of `dtype`; -1 (never taken) if it has none."""
    return FACTORED_SPAN.get(dtype, -1.0)


def sub_chunk(entry: str, chunk_size: int) -> int:
    """Rows per sub-chunk (PATH_SUB, PATH_EXACT) of the kernel `entry` ("intra_A" or
    "bwd_dqkg") under the launch settings in effect: its sub_chunk (a power of two, checked
    by the settings object), at most the chunk. PATH_EXACT's element-by-element work scales
    with it, the number of dots of both with chunk / sub_chunk."""
    return min(getattr(vector_launch(), entry).sub_chunk, chunk_size)


def chunk_paths(g: torch.Tensor, dtype: torch.dtype, chunk_size: int, entry: str) -> torch.Tensor:
    """The path (PATH_CHUNK / PATH_SUB / PATH_EXACT) the kernel `entry` ("intra_A"
    or "bwd_dqkg") takes for each chunk and K-block with inputs of `dtype`:
    [B, H, NT, n K-blocks] int64. g: [B, T, H, K] natural-log gates. The kernels' own test
    (chunk_path) in PyTorch, for tests and benchmark records."""
    B, T, H, K = g.shape
    BT, BC = chunk_size, sub_chunk(entry, chunk_size)
    BK = block_size(K, getattr(vector_launch(), entry).BK)
    NT, NK = triton.cdiv(T, BT), triton.cdiv(K, BK)
    gamma = chunk_local_cumsum(g.float().contiguous(), chunk_size, LOG2E)
    if NT * BT > T:  # padded rows repeat the last valid row
        gamma = torch.cat([gamma, gamma[:, -1:].expand(B, NT * BT - T, H, K)], dim=1)
    if NK * BK > K:  # padded channels never decay
        gamma = torch.cat([gamma, gamma.new_zeros(B, NT * BT, H, NK * BK - K)], dim=3)
    gamma = gamma.view(B, NT, BT // BC, BC, H, NK, BK)
    chunk_span = (gamma[:, :, 0, 0] - gamma[:, :, -1, -1]).amax(-1)  # [B, NT, H, NK]
    sub_span = (gamma[:, :, :, :1] - gamma).amax(dim=(2, 3)).amax(-1)
    span = factored_span(dtype)
    paths = torch.full_like(chunk_span, PATH_EXACT.value, dtype=torch.int64)
    paths = paths.masked_fill(sub_span <= span, PATH_SUB.value).masked_fill(chunk_span <= span, PATH_CHUNK.value)
    return paths.permute(0, 2, 1, 3)


def path_shares(g: torch.Tensor, dtype: torch.dtype, chunk_size: int = 64) -> dict[str, dict[str, float]]:
    """Per kernel ("intra_A", "bwd_dqkg"), the share of (chunk, head, K-block) programs on
    each path ("chunk", "sub", "exact") for natural-log gates g [B, T, H, K] and inputs of
    `dtype`, under the launch settings in effect: which paths a run or a test exercised."""
    return {entry: shares_of(chunk_paths(g, dtype, chunk_size, entry)) for entry in ("intra_A", "bwd_dqkg")}


def shares_of(paths: torch.Tensor) -> dict[str, float]:
    """The share of each path ("chunk", "sub", "exact") among the entries of a path tensor
    (chunk_paths', or a census the kernels wrote under record_paths)."""
    return {name: round(float((paths == i).float().mean()), 4) for i, name in enumerate(("chunk", "sub", "exact"))}


# The census being recorded (record_paths), None otherwise: entry -> one tensor per call.
_census: dict[str, list[torch.Tensor]] | None = None


@contextlib.contextmanager
def record_paths() -> Iterator[dict[str, list[torch.Tensor]]]:
    """Within the block, the vector-gate kernels report the path each program ran.

    Yields {"intra_A": [...], "bwd_dqkg": [...]}: per call of gla_intra_A / gla_bwd_dqkg, an
    int32 tensor [B, H, NT, NK] (chunks, K-blocks of that kernel's BK) holding the code
    (PATH_CHUNK 0, PATH_SUB 1, PATH_EXACT 2) of the branch the program took, written by the
    kernel itself; -1 where no program did any work. Outside the block the kernels are
    compiled without the store (STORE_PATHS off): the same machine code as without this
    facility. For tests and for records of the paths a run took; not thread-safe."""
    global _census
    outer, _census = _census, {"intra_A": [], "bwd_dqkg": []}
    try:
        yield _census
    finally:
        _census = outer


def _census_buffer(entry: str, B: int, H: int, NT: int, NK: int, device: torch.device) -> torch.Tensor | None:
    """The [B, H, NT, NK] int32 census one launch writes while record_paths is active (kept
    in the census under `entry`), else None."""
    if _census is None:
        return None
    paths = torch.full((B, H, NT, NK), -1, dtype=torch.int32, device=device)
    _census[entry].append(paths)
    return paths


@triton.jit
def gla_intra_A_kernel(
    q, k, gamma, A, paths, scale, span, T,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
    DOT_PREC: tl.constexpr, STORE_PATHS: tl.constexpr,
):
    """One program per (chunk, head), K-blocks in a loop. paths: the int32 census
    [B * H, NT, NK] of record_paths when STORE_PATHS, else unused (None)."""
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
        b_q, b_k, b_g, _, b_gfirst = load_chunk_qkg(q, k, gamma, seq, t0, last, m_t, i_k, T, H, K, BT, BK)
        path = chunk_path(gamma, seq, t0, last, i_k, T, span, H, K, BT, BC, BK)
        if STORE_PATHS:
            tl.store(paths + (i_bh * tl.num_programs(0) + i_t) * tl.cdiv(K, BK) + i_k, path)
        if path == PATH_CHUNK:
            b_A += tl.where(m_causal, intra_A_chunk(b_q, b_k, b_g, b_gfirst, DOT_PREC), 0.0)
        elif path == PATH_SUB:
            b_A += intra_A_sub(b_q, b_k, b_g, gamma, seq, t0, last, i_k, T, H, K, BT, BC, BK, DOT_PREC)
        else:
            b_A += intra_A_exact(b_q, b_k, b_g, k, gamma, seq, t0, o_i, o_t, m_t, o_k, m_k, i_k, T,
                                 H, K, BT, BC, BK, DOT_PREC)
    store_tile(A + seq * BT, b_A * scale, t0, 0, T, BT, H * BT, BT, BT)


def gla_intra_A(q: torch.Tensor, k: torch.Tensor, gamma: torch.Tensor, scale: float, chunk_size: int) -> torch.Tensor:
    """A: [B, T, H, BT] fp32, row t holds scale * sum_c q_tc k_jc e^{gamma_tc - gamma_jc} for
    the keys j of t's chunk (zero for j > t). q, k: [B, T, H, K]; gamma: [B, T, H, K] fp32
    log2 cumulative gates."""
    B, T, H, K = q.shape
    BT = chunk_size
    cfg = vector_launch().intra_A
    BK = block_size(K, cfg.BK)
    A = new_buffer((B, T, H, BT), torch.float32, q.device)
    grid = (triton.cdiv(T, BT), B * H)
    paths = _census_buffer("intra_A", B, H, grid[0], triton.cdiv(K, BK), q.device)
    gla_intra_A_kernel[grid](
        q, k, gamma, A, paths, scale, factored_span(q.dtype), T, H=H, K=K, BT=BT, BC=sub_chunk("intra_A", BT),
        BK=BK, DOT_PREC=dot_precision(q.dtype, cfg.fp32_dots), STORE_PATHS=paths is not None,
        num_warps=warps(cfg.num_warps), num_stages=cfg.num_stages,
    )
    return A


@triton.jit
def _sums_over_v(v, do, h, dh, seq, state, t0, i_k, T,
                 H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                 BV: tl.constexpr, DOT_PREC: tl.constexpr, WANT_DA: tl.constexpr, WANT_INTER: tl.constexpr):
    """One chunk's sums over V (zeros where not wanted): dO h^T and V dh^T ([BT, BK], the
    inter-chunk parts of dq, dk), dA = dO V^T ([BT, BT]) and <h, dh> per channel ([BK])."""
    b_dq_inter = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk_inter = tl.zeros([BT, BK], dtype=tl.float32)
    b_dA = tl.zeros([BT, BT], dtype=tl.float32)
    b_hdh = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_v = load_tile(v + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
        b_do = load_tile(do + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
        if WANT_INTER:
            b_ht = load_tile_t(h + state, i_k * BK, i_v * BV, K, V, V, BK, BV)
            b_dht = load_tile_t(dh + state, i_k * BK, i_v * BV, K, V, V, BK, BV)
            b_hdh += tl.sum(b_ht.to(tl.float32) * b_dht.to(tl.float32), axis=0)
            b_dq_inter += tl.dot(b_do, b_ht.to(b_do.dtype), input_precision=DOT_PREC)
            b_dk_inter += tl.dot(b_v, b_dht.to(b_v.dtype), input_precision=DOT_PREC)
        if WANT_DA:
            b_dA += tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)
    return b_dq_inter, b_dk_inter, b_dA, b_hdh


@triton.jit
def _dqkg_chunk(
    q, k, v, gamma, h, do, dh, dq, dk, dg, scale, path, T, NT, i_k, i_t, i_bh, seq, t0, last,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DOT_PREC: tl.constexpr, ONLY_PATH: tl.constexpr, INTER_AFTER: tl.constexpr,
):
    """dq, dk, dg of one chunk's K-block (gla_bwd_dqkg_kernel's program); path: its
    chunk_path; ONLY_PATH >= 0: the launch compiles that path alone."""
    o_i = tl.arange(0, BT)  # position in the chunk
    o_t = t0 + o_i
    m_t = o_t < T
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    state = (i_bh * NT + i_t).to(tl.int64) * K * V

    # --- everything that sums over V: dA, and (here or after the intra-chunk part, which
    # then runs with fewer live tiles) the inter-chunk parts and <S, dS'> per channel
    b_dq_inter, b_dk_inter, b_dA, b_hdh = _sums_over_v(v, do, h, dh, seq, state, t0, i_k, T, H, K, V, BT, BK, BV,
                                                       DOT_PREC, True, INTER_AFTER == 0)
    b_q, b_k, b_g, b_glast, b_gfirst = load_chunk_qkg(q, k, gamma, seq, t0, last, m_t, i_k, T, H, K, BT, BK)
    # the paths take dA strictly below the diagonal; each token's own pair (decay 1) enters
    # dq and dk apart and never dG, where it would cancel between q dq and k dk
    b_dAdiag = tl.sum(tl.where(o_i[:, None] == o_i[None, :], b_dA, 0.0), axis=1) * scale
    b_dA = tl.where(o_i[:, None] > o_i[None, :], b_dA, 0.0) * scale

    # --- intra-chunk part by the chunk's path
    if ONLY_PATH == PATH_CHUNK:
        b_dq, b_dk, b_dG = dqk_intra_chunk(b_q, b_k, b_g, b_gfirst, b_dA, DOT_PREC)
    elif ONLY_PATH == PATH_SUB:
        b_dq, b_dk, b_dG = dqk_intra_sub(b_q, b_k, b_g, b_dA, gamma, seq, t0, last, i_k, T, H, K, BT, BC, BK, DOT_PREC)
    elif ONLY_PATH == PATH_EXACT:
        b_dq, b_dk, b_dG = dqk_intra_exact(b_q, b_k, b_g, b_dA, q, k, gamma, seq, t0, last, o_i, o_t, o_k, m_k,
                                     i_k, T, H, K, BT, BC, BK, DOT_PREC)
    elif path == PATH_CHUNK:
        b_dq, b_dk, b_dG = dqk_intra_chunk(b_q, b_k, b_g, b_gfirst, b_dA, DOT_PREC)
    elif path == PATH_SUB:
        b_dq, b_dk, b_dG = dqk_intra_sub(b_q, b_k, b_g, b_dA, gamma, seq, t0, last, i_k, T, H, K, BT, BC, BK, DOT_PREC)
    else:
        b_dq, b_dk, b_dG = dqk_intra_exact(b_q, b_k, b_g, b_dA, q, k, gamma, seq, t0, last, o_i, o_t, o_k, m_k,
                                     i_k, T, H, K, BT, BC, BK, DOT_PREC)
    if INTER_AFTER:
        b_dq_inter, b_dk_inter, _, b_hdh = _sums_over_v(v, do, h, dh, seq, state, t0, i_k, T, H, K, V, BT, BK,
                                                        BV, DOT_PREC, False, True)
    b_qf, b_kf = b_q.to(tl.float32), b_k.to(tl.float32)

    # --- combine, and the gate gradient
    b_dq_inter *= tl.exp2(b_g) * scale
    b_dk_inter *= tl.exp2(b_glast[None, :] - b_g)
    b_dq += b_dq_inter + b_dAdiag[:, None] * b_kf
    b_dk += b_dk_inter + b_dAdiag[:, None] * b_qf
    # d gamma_t: the intra-chunk pairs straddling t, the inter-chunk query terms from t on,
    # the state leaving the chunk (<S, dS'> decayed), and the inter-chunk key terms of the
    # tokens before t alone: summed over all tokens and less a running sum from t, those
    # would cancel to eps32 of the chunk's last keys, whose decay to the chunk's end is ~1
    b_dG += b_qf * b_dq_inter
    b_dg = tl.cumsum(b_dG, axis=0, reverse=True) + (tl.exp2(b_glast) * b_hdh)[None, :]
    b_dg += rows_before(b_kf * b_dk_inter)
    store_tile(dq + seq * K, b_dq, t0, i_k * BK, T, K, H * K, BT, BK)
    store_tile(dk + seq * K, b_dk, t0, i_k * BK, T, K, H * K, BT, BK)
    store_tile(dg + seq * K, b_dg, t0, i_k * BK, T, K, H * K, BT, BK)


@triton.jit
def gla_bwd_dqkg_kernel(
    q, k, v, gamma, h, do, dh, dq, dk, dg, paths, scale, span, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DOT_PREC: tl.constexpr, ONLY_PATH: tl.constexpr, INTER_AFTER: tl.constexpr, STORE_PATHS: tl.constexpr,
):
    """One program per (K-block, chunk, head). ONLY_PATH -1: each program takes its chunk's
    path; PATH_CHUNK / PATH_SUB / PATH_EXACT: only programs whose chunk takes that path do
    any work, so one launch per path covers every chunk once, each compiled for its path
    alone with its own num_warps. paths: the int32 census [B * H, NT, NK] of record_paths
    when STORE_PATHS (a program that works writes the branch it compiled: ONLY_PATH, or
    its chunk's path in a launch taking every path), else unused (None)."""
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = i_b.to(tl.int64) * T * H + i_h
    t0 = i_t * BT
    last = tl.minimum(t0 + BT, T) - 1
    path = chunk_path(gamma, seq, t0, last, i_k, T, span, H, K, BT, BC, BK)
    if ONLY_PATH < 0:
        run = path >= 0
    else:
        run = path == ONLY_PATH
    if run:
        _dqkg_chunk(q, k, v, gamma, h, do, dh, dq, dk, dg, scale, path, T, NT, i_k, i_t, i_bh, seq, t0, last,
                    H, K, V, BT, BC, BK, BV, DOT_PREC, ONLY_PATH, INTER_AFTER)
        if STORE_PATHS:
            p_path = paths + (i_bh * NT + i_t) * tl.num_programs(0) + i_k
            if ONLY_PATH < 0:
                tl.store(p_path, path)
            else:
                tl.store(p_path, tl.full([], ONLY_PATH, tl.int32))


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
    launch = vector_launch()
    cfg = launch.bwd_dqkg
    BK, BV = block_size(K, cfg.BK), block_size(V, cfg.BV)
    dq = new_buffer((B, T, H, K), q.dtype, q.device)
    dk = new_buffer((B, T, H, K), k.dtype, k.device)
    dg = new_buffer((B, T, H, K), torch.float32, q.device)
    grid = (triton.cdiv(K, BK), NT, B * H)
    span = factored_span(q.dtype)
    paths = _census_buffer("bwd_dqkg", B, H, NT, grid[0], q.device)  # one census shared by the launches
    # split_paths: one launch per path, each with its own warps (an exact-only dtype,
    # span < 0, needs just the exact one); else one launch choosing per chunk
    launches = [(-1, cfg)]
    if cfg.split_paths:
        exact = (PATH_EXACT.value, launch.bwd_dqkg_exact)
        launches = [exact] if span < 0 else [(PATH_CHUNK.value, cfg), (PATH_SUB.value, launch.bwd_dqkg_sub), exact]
    for only_path, path_cfg in launches:
        gla_bwd_dqkg_kernel[grid](
            q, k, v, gamma, h, do, dh, dq, dk, dg, paths, scale, span, T, NT,
            H=H, K=K, V=V, BT=BT, BC=sub_chunk("bwd_dqkg", BT), BK=BK, BV=BV, DOT_PREC=dot_precision(q.dtype, path_cfg.fp32_dots),
            ONLY_PATH=only_path, INTER_AFTER=int(path_cfg.inter_after), STORE_PATHS=paths is not None,
            num_warps=warps(path_cfg.num_warps), num_stages=path_cfg.num_stages,
        )
    return dq, dk, dg
