"""Running-mean preprocessing of the linearized softmax GDN (docs/design.md §7) on Triton.

At absolute position t = count + 1, count + 2, ... (count = tokens already in the state), with
S_t = s0 + x_1 + ... + x_t the running sum (s0 = the state's sum, zero for an empty state):

    key   u_t = k_t - S^k_t / t              value (1 - 1/t)(v_t - vbar_{t-1}) = v_t - S^v_t / t
    v_bar_t = S^v_t / t                      k_sum_T = S^k_T,  v_sum_T = S^v_T

The value identity holds because (1 - 1/t) / (t - 1) = 1/t (for t >= 2; at t = 1 the state is
empty and both sides are 0), so keys and values are the same "centred" map x_t - S_t / t and
one kernel serves both. Every division is by t >= 1: nothing is ever inf or NaN.

Forward (prep_fwd, the scans `running_mean_fwd`): one program per (sequence = batch x head,
feature block) walks T in chunks of BT rows, prefix sums inside the chunk (tl.cumsum, or for
16-bit inputs a product with triangular ones under PrepLaunch.fwd_by_dot) plus an fp32 carry
of the sum so far, and writes key and value whole (centring them inside the delta rule's WY
kernel instead is slower: docs/design.md §7). The running mean of v, which the output adds,
is not stored: the scan of v stores the sum entering each 64-token chunk, and the delta
rule's output kernel forms v_bar from it and v; under LinGdnLaunch.mean_form "stored" the scan
writes v_bar whole (in v's dtype) and the output kernel only adds it.
Backward (`running_mean_bwd`): the adjoint is the reverse scan. With c_t = x_t - S_t/t and
m_t = S_t/t, the cotangent of S_t is r_t = (dm_t - dc_t) / t (+ dS_T at t = T), so
    dx_j = dc_j + sum_{t >= j} r_t,      ds0 = sum_t r_t + dS_T,
walked from the last chunk to the first with an fp32 carry (the in-tile sums by tl.cumsum, or
on the tensor cores in two bf16 parts under PrepLaunch.bwd_by_dot, for a 16-bit dx on a GPU).

With PrepLaunch.segment_rows, a long sequence is cut into segments of that many rows, each
walked by its own programs: a first kernel (`segment_sums`) sums each segment's rows (x
forward, r backward), and each segment's scan starts from the sums of the segments before it
(after it, backward). That reads x once more for T / segment_rows times the programs, where a
few long sequences would otherwise leave most of the GPU idle.

All sums, means and carries are fp32, key/value in the kernel dtype (fp16, bf16, fp32). fp64
inputs use `running_mean_torch` (same formulas in torch, fp64 throughout; the Triton kernels
stop at fp32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.launch import PrepLaunch, settings
from kernels.common.triton import utils
from kernels.common.triton.prefix import row_prefix_sums
from kernels.common.triton.tiles import load_tile, store_tile
from kernels.common.triton.utils import new_buffer, warps
from kernels.gated_delta_rule.triton_wy import CHUNK  # the delta rule's chunks, whose output reads the entering sums

DOT_ROWS = 64  # the most rows a tile's prefix sums take on the tensor cores


@triton.jit
def _load_carry(ptr, i_bh, o_d, m_d, D: tl.constexpr, BD: tl.constexpr, PRESENT: tl.constexpr):
    """This block of a [B, H, D] fp32 sum the scan starts from ([BD]), zeros when absent."""
    if PRESENT:
        return tl.load(ptr + i_bh * D + o_d, mask=m_d, other=0.0).to(tl.float32)
    return tl.zeros([BD], dtype=tl.float32)


@triton.jit
def _cotangent_rows(d_centred, d_mean, seq, i_t, i_d, count, T,
                    H: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                    HAS_DC: tl.constexpr, HAS_DM: tl.constexpr):
    """([BT, BD] r_t = (dm_t - dc_t) / t, [BT, BD] dc_t) in fp32 on rows i_t * BT ..; an
    absent cotangent counts as zero, rows past T as zero."""
    o_t = i_t * BT + tl.arange(0, BT)
    b_inv_t = 1.0 / (count + 1 + o_t).to(tl.float32)
    b_r = tl.zeros([BT, BD], dtype=tl.float32)
    b_dc = tl.zeros([BT, BD], dtype=tl.float32)
    if HAS_DC:
        b_dc = load_tile(d_centred + seq, i_t * BT, i_d * BD, T, D, H * D, BT, BD).to(tl.float32)
        b_r -= b_dc * b_inv_t[:, None]
    if HAS_DM:
        b_dm = load_tile(d_mean + seq, i_t * BT, i_d * BD, T, D, H * D, BT, BD).to(tl.float32)
        b_r += b_dm * b_inv_t[:, None]
    return b_r, b_dc


@triton.jit
def segment_sums_kernel(
    x, d_centred, d_mean, sums, count, T, SEG_T,
    H: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
    ADJOINT: tl.constexpr, HAS_DC: tl.constexpr, HAS_DM: tl.constexpr,
):
    """sums: [B * H, NS, D] fp32, the sum over each segment of SEG_T rows (a multiple of BT) of
    x's rows, or with ADJOINT of r_t (_cotangent_rows). Grid (cdiv(D, BD), B * H, NS)."""
    i_d, i_bh, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = (i_b.to(tl.int64) * T * H + i_h) * D
    o_d = i_d * BD + tl.arange(0, BD)
    b_acc = tl.zeros([BD], dtype=tl.float32)
    n_tiles = SEG_T // BT
    for j in range(n_tiles):
        i_t = i_s * n_tiles + j
        if ADJOINT:
            b_rows, _ = _cotangent_rows(d_centred, d_mean, seq, i_t, i_d, count, T, H, D, BT, BD, HAS_DC, HAS_DM)
        else:
            b_rows = load_tile(x + seq, i_t * BT, i_d * BD, T, D, H * D, BT, BD).to(tl.float32)
        b_acc += tl.sum(b_rows, axis=0)
    tl.store(sums + (i_bh * tl.num_programs(2) + i_s).to(tl.int64) * D + o_d, b_acc, mask=o_d < D)


@triton.jit
def _segment_carry(sums, i_bh, o_d, m_d, first, last, D: tl.constexpr, BD: tl.constexpr):
    """[BD]: the sum of segments first .. last - 1 of a [B * H, NS, D] segment_sums buffer."""
    b_acc = tl.zeros([BD], dtype=tl.float32)
    for i_p in range(first, last):
        b_acc += tl.load(sums + (i_bh * tl.num_programs(2) + i_p).to(tl.int64) * D + o_d, mask=m_d, other=0.0)
    return b_acc


@triton.jit
def running_mean_fwd_kernel(
    x, s0, centred, enter, mean, s_final, seg_sums, count, T, NC, SEG_T,
    H: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, CHUNK: tl.constexpr,
    HAS_S0: tl.constexpr, STORE_ENTER: tl.constexpr, STORE_MEAN: tl.constexpr, BY_DOT: tl.constexpr,
    SEGMENTED: tl.constexpr,
):
    """x, centred: [B, T, H, D]; s0, s_final: [B, H, D] fp32; enter: [B, H, NC, D] fp32, the
    sum entering each CHUNK-row chunk (s0 plus every row before it); mean: [B, T, H, D] in x's
    dtype, the running mean S_t / t (STORE_MEAN). Grid (cdiv(D, BD), B*H, NS): segment i_s
    walks rows i_s * SEG_T .. (a multiple of BT and of CHUNK), starting, when SEGMENTED, from
    seg_sums (segment_sums_kernel's) of the segments before it. BY_DOT: the in-tile sums by
    row_prefix_sums on the tensor cores (16-bit x)."""
    i_d, i_bh, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    # element offset of row 0 of this sequence in a [B, T, H, D] tensor
    seq = (i_b.to(tl.int64) * T * H + i_h) * D
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    b_carry = _load_carry(s0, i_bh, o_d, m_d, D, BD, HAS_S0)
    if SEGMENTED:
        b_carry += _segment_carry(seg_sums, i_bh, o_d, m_d, 0, i_s, D, BD)
    n_tiles = SEG_T // BT
    for j in range(n_tiles):
        i_t = i_s * n_tiles + j
        o_t = i_t * BT + tl.arange(0, BT)
        # 1/t at absolute positions; rows past T are masked out on store
        b_inv_t = 1.0 / (count + 1 + o_t).to(tl.float32)
        b_xin = load_tile(x + seq, i_t * BT, i_d * BD, T, D, H * D, BT, BD)
        b_x = b_xin.to(tl.float32)
        b_sum = row_prefix_sums(b_xin, BT, BY_DOT) + b_carry[None, :]
        b_mean = b_sum * b_inv_t[:, None]
        store_tile(centred + seq, b_x - b_mean, i_t * BT, i_d * BD, T, D, H * D, BT, BD)
        if STORE_MEAN:
            store_tile(mean + seq, b_mean, i_t * BT, i_d * BD, T, D, H * D, BT, BD)
        if STORE_ENTER:  # the rows that open a chunk: the sum before them
            p_enter = enter + (i_bh.to(tl.int64) * NC + o_t // CHUNK)[:, None] * D + o_d[None, :]
            m_open = ((o_t % CHUNK == 0) & (o_t < T))[:, None] & m_d[None, :]
            tl.store(p_enter, b_sum - b_x, mask=m_open)
        b_carry += tl.sum(b_x, axis=0)  # masked rows loaded as 0
    if i_s == tl.num_programs(2) - 1:  # the last segment's carry is the whole sum
        tl.store(s_final + i_bh * D + o_d, b_carry, mask=m_d)


@triton.jit
def running_mean_bwd_kernel(
    d_centred, d_mean, ds_final, dx, ds0, seg_sums, count, T, SEG_T,
    H: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
    HAS_DC: tl.constexpr, HAS_DM: tl.constexpr, HAS_DSF: tl.constexpr, HAS_S0: tl.constexpr,
    BY_DOT: tl.constexpr, SEGMENTED: tl.constexpr,
):
    """Adjoint of running_mean_fwd_kernel. d_centred, d_mean, dx: [B, T, H, D] (any float
    dtype; absent cotangents are flagged off); ds_final, ds0: [B, H, D] fp32. Grid and
    segments as the forward's, each segment starting, when SEGMENTED, from the r sums of the
    segments after it. BY_DOT: the in-tile suffix sums of the fp32 cotangents by
    row_prefix_sums on the tensor cores, for a 16-bit dx."""
    i_d, i_bh, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = (i_b.to(tl.int64) * T * H + i_h) * D
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    # carry = sum of r_s over the rows after this chunk, plus dS_T
    b_carry = _load_carry(ds_final, i_bh, o_d, m_d, D, BD, HAS_DSF)
    if SEGMENTED:
        b_carry += _segment_carry(seg_sums, i_bh, o_d, m_d, i_s + 1, tl.num_programs(2), D, BD)
    n_tiles = SEG_T // BT
    for i in range(n_tiles):
        i_t = i_s * n_tiles + n_tiles - 1 - i
        b_r, b_dc = _cotangent_rows(d_centred, d_mean, seq, i_t, i_d, count, T, H, D, BT, BD, HAS_DC, HAS_DM)
        b_dx = row_prefix_sums(b_r, BT, BY_DOT, REVERSE=True) + b_carry[None, :]
        if HAS_DC:
            b_dx += b_dc
        store_tile(dx + seq, b_dx, i_t * BT, i_d * BD, T, D, H * D, BT, BD)
        b_carry += tl.sum(b_r, axis=0)  # rows past T loaded as 0: they add nothing
    if HAS_S0:
        if i_s == 0:  # the first segment's carry has every r
            tl.store(ds0 + i_bh * D + o_d, b_carry, mask=m_d)


def prep_launch() -> PrepLaunch:
    """The running-mean kernels' launch settings in effect (kernels/common/launch/)."""
    return settings("linearized_softmax_gdn").prep


def launch_blocks(n_seq: int, D: int, T: int, cfg: PrepLaunch, by_dot: bool) -> tuple[int, int, int, int]:
    """(BT, BD, NS, SEG_T): NS segments of SEG_T rows (one segment of all the tiles unless
    cfg.segment_rows splits T, PrepLaunch.segments_at); BD halved from cfg.max_BD while n_seq * NS * cdiv(D, BD)
    programs are too few, then BT = tile_elems / BD rows per step (at most T rounded up to a
    power of two, at least 16, and at most DOT_ROWS when by_dot: the [BT, BT] matrix of ones
    stays in registers); SEG_T the larger of segment_rows and BT (powers of two both)."""
    split = cfg.segments_at(n_seq, T)
    ns = triton.cdiv(T, cfg.segment_rows) if split else 1
    bd = max(cfg.min_BD, min(cfg.max_BD, triton.next_power_of_2(D)))
    while bd > cfg.min_BD and n_seq * ns * triton.cdiv(D, bd) < cfg.min_programs:
        bd //= 2
    bt = max(16, min(cfg.tile_elems // bd, triton.next_power_of_2(T)))
    bt = min(bt, DOT_ROWS) if by_dot else bt
    seg = max(cfg.segment_rows, bt) if split else triton.cdiv(T, bt) * bt
    return bt, bd, triton.cdiv(T, seg), seg


def segment_sums(x, d_centred, d_mean, count: int, shape: tuple, device, blocks: tuple,
                 cfg: PrepLaunch) -> torch.Tensor | None:
    """[B * H, NS, D] fp32 segment sums of x (forward) or, with x None, of r (the adjoint, from
    d_centred and d_mean) for launch_blocks' `blocks`, or None with one segment."""
    B, T, H, D = shape
    bt, bd, ns, seg = blocks
    if ns == 1:
        return None
    sums = new_buffer((B * H, ns, D), torch.float32, device)
    stand_in = next(t for t in (x, d_centred, d_mean) if t is not None)
    segment_sums_kernel[(triton.cdiv(D, bd), B * H, ns)](
        x if x is not None else stand_in, d_centred if d_centred is not None else stand_in,
        d_mean if d_mean is not None else stand_in, sums, count, T, SEG_T=seg, H=H, D=D, BT=bt, BD=bd,
        ADJOINT=x is None, HAS_DC=d_centred is not None, HAS_DM=d_mean is not None,
        num_warps=warps(cfg.num_warps), num_stages=cfg.num_stages,
    )
    return sums


def running_mean_fwd(x: torch.Tensor, s0: torch.Tensor | None, count: int, store_enter: bool,
                     cfg: PrepLaunch | None = None, chunk: int = CHUNK, store_mean: bool = False):
    """x: [B, T, H, D]; s0: [B, H, D] fp32 or None; cfg: launch settings (None: those in
    effect). Returns (centred [B, T, H, D] in x's dtype, the sums entering each chunk of
    `chunk` rows [B, H, cdiv(T, chunk), D] fp32 or None unless store_enter, s_final
    [B, H, D] fp32, the running mean [B, T, H, D] in x's dtype or None unless store_mean).
    With the entering sums a chunk's running mean is (enter + the chunk's own cumulative
    sum) / t, formed where it is used; store_mean writes it whole instead."""
    B, T, H, D = x.shape
    x = x.contiguous()
    s0 = s0.float().contiguous() if s0 is not None else None
    centred = new_buffer((B, T, H, D), x.dtype, x.device)
    NC = triton.cdiv(T, chunk)
    enter = new_buffer((B, H, NC, D), torch.float32, x.device) if store_enter else None
    mean = new_buffer((B, T, H, D), x.dtype, x.device) if store_mean else None
    s_final = new_buffer((B, H, D), torch.float32, x.device)
    cfg = cfg or prep_launch()
    by_dot = cfg.fwd_by_dot and x.element_size() == 2  # fp32 keys and values keep the scan
    blocks = launch_blocks(B * H, D, T, cfg, by_dot)
    bt, bd, ns, seg = blocks
    if ns > 1 and seg % chunk:  # each segment opens whole chunks: the entering sums are the segment's own
        raise ValueError(f"running_mean_fwd: segments of {seg} rows are not whole chunks of {chunk}")
    seg_sums = segment_sums(x, None, None, count, (B, T, H, D), x.device, blocks, cfg)
    running_mean_fwd_kernel[(triton.cdiv(D, bd), B * H, ns)](
        x, s0, centred, enter, mean if mean is not None else centred, s_final,
        seg_sums if seg_sums is not None else s_final, count, T, NC, SEG_T=seg,
        H=H, D=D, BT=bt, BD=bd, CHUNK=chunk, HAS_S0=s0 is not None, STORE_ENTER=store_enter,
        STORE_MEAN=store_mean, BY_DOT=by_dot, SEGMENTED=seg_sums is not None, num_warps=warps(cfg.num_warps),
        num_stages=cfg.num_stages,
    )
    return centred, enter, s_final, mean


def running_mean_bwd(d_centred, d_mean, ds_final, count: int, x_meta: tuple, has_s0: bool,
                     cfg: PrepLaunch | None = None):
    """Cotangents (each may be None, else [B, T, H, D]; ds_final [B, H, D]) -> (dx
    [B, T, H, D], ds0 [B, H, D] fp32 or None); x_meta = (shape, dtype, device) of the
    forward's x, which dx takes; cfg: launch settings (None: those in effect)."""
    (B, T, H, D), dtype, device = x_meta
    dx = new_buffer((B, T, H, D), dtype, device)
    ds0 = new_buffer((B, H, D), torch.float32, device) if has_s0 else None
    d_centred = d_centred.contiguous() if d_centred is not None else None
    d_mean = d_mean.contiguous() if d_mean is not None else None
    ds_final = ds_final.float().contiguous() if ds_final is not None else None
    cfg = cfg or prep_launch()
    # an fp32 dx keeps the scan, and so does the interpreter, which cannot multiply the bf16 parts
    by_dot = cfg.bwd_by_dot and dx.element_size() == 2 and utils.bf16_products(dx.device)
    blocks = launch_blocks(B * H, D, T, cfg, by_dot)
    bt, bd, ns, seg = blocks
    seg_sums = (segment_sums(None, d_centred, d_mean, count, (B, T, H, D), device, blocks, cfg)
                if d_centred is not None or d_mean is not None else None)
    running_mean_bwd_kernel[(triton.cdiv(D, bd), B * H, ns)](
        d_centred, d_mean, ds_final, dx, ds0, seg_sums if seg_sums is not None else dx, count, T, SEG_T=seg,
        H=H, D=D, BT=bt, BD=bd, HAS_DC=d_centred is not None, HAS_DM=d_mean is not None,
        HAS_DSF=ds_final is not None, HAS_S0=has_s0, BY_DOT=by_dot, SEGMENTED=seg_sums is not None,
        num_warps=warps(cfg.num_warps), num_stages=cfg.num_stages,
    )
    return dx, ds0


def prep_fwd(k: torch.Tensor, v: torch.Tensor, k_sum0: torch.Tensor | None, v_sum0: torch.Tensor | None,
             count: int, cfg: PrepLaunch, store_mean: bool = False):
    """The running-mean scans: (k, v, k_sum0, v_sum0) -> (key, value, v_enter, k_sum_T,
    v_sum_T) of the module docstring. k: [B, T, H, K], v: [B, T, H, V] in fp16/bf16/fp32;
    k_sum0 [B, H, K] and v_sum0 [B, H, V] fp32, both None for an empty state (count = 0).
    key, value come in k's dtype, the sums in fp32: v_enter [B, H, cdiv(T, 64), V] the sums
    of v entering each 64-token chunk, from which the delta rule's output kernel adds the
    running mean of v to o; with store_mean, v_enter is instead that running mean itself,
    [B, T, H, V] in v's dtype (LinGdnLaunch.mean_form "stored")."""
    key, _, k_sum, _ = running_mean_fwd(k, k_sum0, count, store_enter=False, cfg=cfg)
    value, v_enter, v_sum, v_mean = running_mean_fwd(v, v_sum0, count, store_enter=not store_mean, cfg=cfg,
                                                     store_mean=store_mean)
    return key, value, v_mean if store_mean else v_enter, k_sum, v_sum


def prep_bwd(d_key, d_value, d_v_bar, d_k_sum, d_v_sum, count: int, k_meta: tuple, v_meta: tuple,
             has_s0: tuple[bool, bool], cfg: PrepLaunch):
    """prep_fwd's adjoint: cotangents of key, value, the running mean of v (o's own, read in
    its dtype), k_sum_T and v_sum_T (each may be None) -> (dk, dv, dk_sum0, dv_sum0);
    k_meta, v_meta = (shape, dtype, device) of the forward's k and v; has_s0: whether it had
    k_sum0 and v_sum0 (their gradients are None otherwise)."""
    dk, dk_sum0 = running_mean_bwd(d_key, None, d_k_sum, count, k_meta, has_s0[0], cfg)
    dv, dv_sum0 = running_mean_bwd(d_value, d_v_bar, d_v_sum, count, v_meta, has_s0[1], cfg)
    return dk, dv, dk_sum0, dv_sum0


def running_mean_torch(k, v, k_sum0, v_sum0, count: int, acc: torch.dtype, dt: torch.dtype):
    """key, value, the running mean of v [B, T, H, V], k_sum_T and v_sum_T in plain torch
    (autograd included): sums in `acc`, key/value in `dt`. Used for fp64 inputs (acc = fp64,
    dt = fp32, the kernels' widest type) and by the tests as the reference of prep_fwd.
    k_sum0/v_sum0 None for an empty state."""
    pos = torch.arange(count + 1, count + k.shape[1] + 1, device=k.device, dtype=torch.float64)
    t = pos.to(acc)[None, :, None, None]
    k_cum = torch.cumsum(k.to(acc), dim=1)
    v_cum = torch.cumsum(v.to(acc), dim=1)
    if k_sum0 is not None:
        k_cum = k_cum + k_sum0.to(acc)[:, None]
    if v_sum0 is not None:
        v_cum = v_cum + v_sum0.to(acc)[:, None]
    prev = torch.clamp(pos - 1.0, min=1.0).to(acc)[None, :, None, None]
    # the §7 value as written, (1 - 1/t)(v_t - vbar_{t-1}) with vbar_0 = 0 (equal to v_t - vbar_t)
    v_bar_prev = torch.where(t > 1.0, (v_cum - v.to(acc)) / prev, torch.zeros_like(v_cum))
    key = (k.to(acc) - k_cum / t).to(dt)
    value = ((1.0 - 1.0 / t) * (v.to(acc) - v_bar_prev)).to(dt)
    return key, value, v_cum / t, k_cum[:, -1], v_cum[:, -1]
