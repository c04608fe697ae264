"""Forward state passing and output of the (gated) delta rule (docs/design.md §10), chunks of BT tokens.

  state_fwd   grid (V-blocks, heads); each program walks its head's chunks in order with
              its [K, BV] block of the state S in fp32 registers:
                  store S_n;  U = U0 - W S_n (stored);  S_{n+1} = 2^{gamma_C} S_n + Kd^T U
              with Kd = K ⊙ 2^{gamma_C - gamma}.
  output_fwd  grid (V-blocks, chunks, heads), in parallel:
                  O = diag(2^gamma) Q S_n + (Q K^T ⊙ Gamma) U,  Gamma lower, diagonal included,
              plus, for the linearized softmax GDN, the running mean of its v (RunningMean),
              formed from v and the sums entering each chunk rather than read whole in fp32.
  state_fwd with the output fused (DeltaLaunch.fused_fwd): the state pass also writes O for
              each chunk as it goes, from S_n and U rounded to the stored dtype exactly as
              output_fwd reads them back (same results), saving output_fwd's reads of h, q,
              k and U at the price of fewer programs: for many sequences of heads. A forward
              without a backward (no gradient wanted) stores neither h nor U then: the
              inference pass reads q, k, W, U0 and writes only O (DeltaLaunch.infer_fused).

Layouts: q, k, w: [B, T, H, K]; u0, u, o: [B, T, H, V]; gamma: [B, T, H] fp32 (chunk-local
cumulative log2-gate, from wy_fwd); per-chunk states h: [B, H, NT, K, V] in the input dtype;
h0, ht: [B, H, K, V] fp32. q carries no scale: the kernels multiply by `scale`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.common.triton import utils
from kernels.common.triton.gates import causal_decay
from kernels.common.triton.prefix import row_prefix_sums
from kernels.common.triton.tiles import load_gamma_rows, load_tile, load_tile_t, store_tile
from kernels.common.triton.utils import block_size, dot_precision, full_block, new_buffer, sequential_block_v, warps
from kernels.gated_delta_rule.triton_wy import CHUNK, delta_launch


@dataclass(frozen=True)
class RunningMean:
    """A running mean the output adds: at 0-based token i of a sequence,
    (enter[n] + x_{64 n} + ... + x_i) / (count + i + 1), n = i // 64. x: [B, T, H, V]
    contiguous; enter: [B, H, cdiv(T, 64), V] fp32, the sums entering each chunk (the
    linearized softmax GDN's v and v_sum0 + the earlier tokens' v); count: tokens before T.
    form (LinGdnLaunch.mean_form): the in-chunk sums by tl.cumsum ("scan"), for a 16-bit x as
    a product with triangular ones ("dots", prefix.py), or per pass ("auto", sums_by_dot);
    "stored": x is the running mean itself, added as it is (enter None, count unused);
    into_acc (LinGdnLaunch.mean_in_acc): where the product lands (accumulates)."""

    x: torch.Tensor
    enter: torch.Tensor | None
    count: int
    form: str = "auto"
    into_acc: str = "one_wave"

    @property
    def stored(self) -> bool:
        """Whether x holds the mean whole (form "stored")."""
        return self.form == "stored"

    def sums_by_dot(self, state_pass: bool = False, K: int = 0, programs: int = 0,
                    multiprocessors: int | None = None) -> bool:
        """Whether a kernel takes the in-chunk sums on the tensor cores: never for an fp32 x
        (tl.cumsum keeps every bit its fp32 output wants); always in form "dots"; in form
        "auto" in the output kernel, and in the fused state pass (state_pass, at head dim K,
        `programs` on a GPU of `multiprocessors`, None off a GPU) at K <= 64 or where the
        programs fill at most one wave: at K = 128 with more programs the triangular
        product's registers cost the pass more than the scan does (LinGdnLaunch.mean_form)."""
        if self.x.element_size() != 2 or self.form in ("scan", "stored"):
            return False
        if self.form == "dots" or not state_pass:
            return True
        return K <= 64 or (multiprocessors is not None and programs <= multiprocessors)

    def accumulates(self, state_pass: bool = False, programs: int = 0, multiprocessors: int | None = None) -> bool:
        """Where a kernel takes the dots (sums_by_dot), whether their product accumulates into
        the output's own tile: "always"; "one_wave" in the fused state pass (state_pass) where
        `programs` fill at most one wave of the GPU's `multiprocessors` (None off a GPU: no);
        "never"."""
        if self.into_acc == "one_wave":
            return state_pass and multiprocessors is not None and programs <= multiprocessors
        return self.into_acc == "always"


@triton.jit
def _add_running_mean(b_o, mv, menter, seq, i_bh, i_t, t0, v0, T, NT, H, count,
                      V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, BY_DOT: tl.constexpr,
                      INTO_ACC: tl.constexpr, STORED: tl.constexpr):
    """b_o [BT, BV] fp32 plus the running mean of RunningMean (x = mv, enter = menter) on the
    rows of chunk i_t, columns v0 .. v0 + BV; its in-chunk sums by row_prefix_sums(BY_DOT).
    INTO_ACC (with BY_DOT, a 16-bit x): the product with triangular ones accumulates into
    t * b_o, scaled back by 1/t after, so no second [BT, BV] fp32 tile is live (the scaling
    there and back costs b_o a few fp32 roundings, far below its 16-bit output's). STORED: mv
    is the mean itself, loaded and added."""
    b_x = load_tile(mv + seq * V, t0, v0, T, V, H * V, BT, BV)
    if STORED:
        return b_o + b_x.to(tl.float32)
    o_v = v0 + tl.arange(0, BV)
    b_enter = tl.load(menter + (i_bh * NT + i_t).to(tl.int64) * V + o_v, mask=o_v < V, other=0.0)
    b_t = (count + 1 + t0 + tl.arange(0, BT)).to(tl.float32)
    b_inv_t = 1.0 / b_t
    if INTO_ACC and BY_DOT:
        o_r = tl.arange(0, BT)
        b_ones = tl.where(o_r[:, None] >= o_r[None, :], 1.0, 0.0).to(b_x.dtype)
        b_sum = tl.dot(b_ones, b_x, acc=b_o * b_t[:, None])
        return (b_sum + b_enter[None, :]) * b_inv_t[:, None]
    return b_o + (row_prefix_sums(b_x, BT, BY_DOT) + b_enter[None, :]) * b_inv_t[:, None]


@triton.jit(do_not_specialize=["T", "NT", "count"])
def state_fwd_kernel(
    k, w, u0, u, gam, h, h0, ht, q, o, pm, mv, menter, scale, T, NT, H, count,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, PREC: tl.constexpr,
    FUSE_OUTPUT: tl.constexpr, STORE_STATES: tl.constexpr, HAS_MEAN: tl.constexpr, MEAN_DOT: tl.constexpr,
    MEAN_ACC: tl.constexpr, MEAN_STORED: tl.constexpr, STORE_P: tl.constexpr, LOAD_P: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    seq = (i_b * T * H + i_h).to(tl.int64)
    v0 = i_v * BV
    dt = k.dtype.element_ty
    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_H0:
        b_s += load_tile(h0 + i_bh.to(tl.int64) * K * V, 0, v0, K, V, V, BK, BV)
    for i_t in range(NT):
        t0 = i_t * BT
        if STORE_STATES:
            store_tile(h + (i_bh * NT + i_t).to(tl.int64) * K * V, b_s, 0, v0, K, V, V, BK, BV)
        b_w = load_tile(w + seq * K, t0, 0, T, K, H * K, BT, BK)
        b_u = load_tile(u0 + seq * V, t0, v0, T, V, H * V, BT, BV).to(tl.float32)
        b_u -= tl.dot(b_w, b_s.to(dt), input_precision=PREC)
        if STORE_STATES:
            store_tile(u + seq * V, b_u, t0, v0, T, V, H * V, BT, BV)
        b_kt = load_tile_t(k + seq * K, t0, 0, T, K, H * K, BT, BK)
        b_g = tl.zeros([BT], dtype=tl.float32)
        if USE_G:
            b_g = load_gamma_rows(gam + seq, t0, T, H, BT)
        if FUSE_OUTPUT:  # output_fwd's arithmetic on the values it would read back
            b_q = load_tile(q + seq * K, t0, 0, T, K, H * K, BT, BK)
            b_o = tl.dot(b_q, b_s.to(h.dtype.element_ty).to(dt), input_precision=PREC)
            if USE_G:
                b_o *= tl.exp2(b_g)[:, None]
            if LOAD_P:  # P formed by wy_fwd
                b_a = load_tile(pm + seq * BT, t0, 0, T, BT, H * BT, BT, BT)
            else:
                b_a = causal_decay(tl.dot(b_q, b_kt, input_precision=PREC) * scale, b_g, b_g, True, USE_G)
                if STORE_P:  # P as the product below reads it, once per head (the first V-block)
                    if i_v == 0:
                        store_tile(pm + seq * BT, b_a.to(dt), t0, 0, T, BT, H * BT, BT, BT)
            b_o = b_o * scale + tl.dot(b_a.to(dt), b_u.to(u.dtype.element_ty).to(dt), input_precision=PREC)
            if HAS_MEAN:
                b_o = _add_running_mean(b_o, mv, menter, seq, i_bh, i_t, t0, v0, T, NT, H, count, V, BT, BV,
                                        MEAN_DOT, MEAN_ACC, MEAN_STORED)
            store_tile(o + seq * V, b_o, t0, v0, T, V, H * V, BT, BV)
        if USE_G:
            last = tl.minimum(t0 + BT, T) - 1
            b_glast = tl.load(gam + seq + last * H)
            b_s *= tl.exp2(b_glast)
            # padded rows have U = 0, so their (finite) factor is irrelevant
            b_u *= tl.exp2(b_glast - b_g)[:, None]
        b_s += tl.dot(b_kt, b_u.to(dt), input_precision=PREC)
    if STORE_HT:
        store_tile(ht + i_bh.to(tl.int64) * K * V, b_s, 0, v0, K, V, V, BK, BV)


@triton.jit(do_not_specialize=["T", "NT", "count"])
def output_fwd_kernel(
    q, k, u, h, gam, mv, menter, o, pm, scale, T, NT, H, count,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, HAS_MEAN: tl.constexpr, MEAN_DOT: tl.constexpr, MEAN_ACC: tl.constexpr,
    MEAN_STORED: tl.constexpr, PREC: tl.constexpr, HEADS_FIRST: tl.constexpr, STORE_P: tl.constexpr,
    LOAD_P: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_t, i_bh = utils.chunk_and_head(1, HEADS_FIRST)
    i_b, i_h = i_bh // H, i_bh % H
    seq = (i_b * T * H + i_h).to(tl.int64)
    t0, v0 = i_t * BT, i_v * BV
    p_h = h + (i_bh * NT + i_t).to(tl.int64) * K * V
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_a = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_q = load_tile(q + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
        b_h = load_tile(p_h, i_k * BK, v0, K, V, V, BK, BV)
        b_o += tl.dot(b_q, b_h, input_precision=PREC)
        if not LOAD_P:
            b_kt = load_tile_t(k + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
            b_a += tl.dot(b_q, b_kt, input_precision=PREC)
    b_g = tl.zeros([BT], dtype=tl.float32)
    if USE_G:
        b_g = load_gamma_rows(gam + seq, t0, T, H, BT)
        b_o *= tl.exp2(b_g)[:, None]
    b_u = load_tile(u + seq * V, t0, v0, T, V, H * V, BT, BV)
    if LOAD_P:  # P formed by wy_fwd
        b_a = load_tile(pm + seq * BT, t0, 0, T, BT, H * BT, BT, BT).to(tl.float32)
    else:
        b_a = causal_decay(b_a * scale, b_g, b_g, True, USE_G)
        if STORE_P:  # P as the product below reads it, once per chunk (the first V-block)
            if i_v == 0:
                store_tile(pm + seq * BT, b_a.to(b_u.dtype), t0, 0, T, BT, H * BT, BT, BT)
    b_o = b_o * scale + tl.dot(b_a.to(b_u.dtype), b_u, input_precision=PREC)
    if HAS_MEAN:  # the running mean of mv, added before the one rounding to o's dtype
        b_o = _add_running_mean(b_o, mv, menter, seq, i_bh, i_t, t0, v0, T, NT, H, count, V, BT, BV,
                                MEAN_DOT, MEAN_ACC, MEAN_STORED)
    store_tile(o + seq * V, b_o, t0, v0, T, V, H * V, BT, BV)


def _mean_args(mean: RunningMean | None, NT: int, chunk_size: int, where: str, stand_in: torch.Tensor,
               state_pass: bool = False, K: int = 0, programs: int = 0, multiprocessors: int | None = None):
    """The kernels' (mv, menter, count) of `mean`, checked against NT chunks of chunk_size, and
    their constexprs HAS_MEAN, MEAN_DOT, MEAN_ACC and MEAN_STORED for a pass of `programs`
    (state_pass, K and multiprocessors as RunningMean.sums_by_dot and .accumulates take them);
    without a mean, a stand-in tensor (never read), count 0 and every switch off."""
    if mean is None:
        return stand_in, stand_in, 0, dict(HAS_MEAN=False, MEAN_DOT=False, MEAN_ACC=False, MEAN_STORED=False)
    if mean.stored:  # the mean itself, [B, T, H, V]: no entering sums
        return mean.x, mean.x, mean.count, dict(HAS_MEAN=True, MEAN_DOT=False, MEAN_ACC=False, MEAN_STORED=True)
    if mean.enter.shape[2] != NT:
        raise ValueError(f"{where}: the running mean's entering sums have {mean.enter.shape[2]} chunks, "
                         f"the output {NT} of {chunk_size} tokens")
    by_dot = mean.sums_by_dot(state_pass, K, programs, multiprocessors)
    into_acc = by_dot and mean.accumulates(state_pass, programs, multiprocessors)
    return mean.x, mean.enter, mean.count, dict(HAS_MEAN=True, MEAN_DOT=by_dot, MEAN_ACC=into_acc, MEAN_STORED=False)


def _p_flags(p: torch.Tensor | None, p_formed: bool) -> dict:
    """The output kernels' STORE_P (form P and store it into p) and LOAD_P (read P from p,
    formed by wy_fwd where p_formed); both off without p."""
    return dict(STORE_P=p is not None and not p_formed, LOAD_P=p is not None and p_formed)


def _fused_settings(launch, inference: bool):
    """The fused state pass's settings: without a backward to come (infer_fused) or with one."""
    return launch.infer_fused if inference else launch.fused_fwd


def fused_output_applies(n_heads: int, gated: bool, inference: bool = False) -> bool:
    """Whether the forward runs state_fwd with the output fused for n_heads = B * H, under
    the launch settings in effect (of gated_delta_rule if gated, else delta_rule): those of
    a forward with a backward to come (fused_fwd) or without (infer_fused)."""
    cfg = _fused_settings(delta_launch(gated), inference)
    return cfg.enabled and n_heads >= cfg.min_heads


def state_fwd(
    k: torch.Tensor, w: torch.Tensor, u0: torch.Tensor, gam: torch.Tensor | None,
    h0: torch.Tensor | None, output_final_state: bool,
    q: torch.Tensor | None = None, scale: float = 1.0, chunk_size: int = CHUNK, store_states: bool = True,
    mean: RunningMean | None = None, p: torch.Tensor | None = None, p_formed: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Returns (h [B, H, NT, K, V] states entering each chunk, U [B, T, H, V], final state
    [B, H, K, V] fp32 or None, O [B, T, H, V] or None). h0: [B, H, K, V] fp32 contiguous or
    None. With q ([B, T, H, K]) the output O = output_fwd(q, k, U, h, gam, scale) is
    computed in the same pass (plus `mean`'s running mean, as output_fwd adds it), and
    store_states=False (only with q: a forward no backward follows) leaves h and U unwritten
    (returned as None). p (only with q): a [B, T, H, chunk_size] buffer in q's dtype that
    receives each chunk's P = scale (Q K^T ⊙ Gamma), lower with the diagonal, row t holding
    row (t mod chunk_size) of its chunk's (DeltaLaunch.store_p), or with p_formed holds P
    already (wy_fwd's, DeltaLaunch.p_in_wy), which the output reads instead of forming it."""
    if p is not None and q is None:
        raise ValueError("state_fwd: p (the output's P stored) needs q (the output fused)")
    if not store_states and q is None:
        raise ValueError("state_fwd: store_states=False needs q (the output fused): output_fwd reads h and U")
    if mean is not None and q is None:
        raise ValueError("state_fwd: a running mean is added to the output: it needs q (the output fused)")
    B, T, H, K = k.shape
    V = u0.shape[-1]
    NT = triton.cdiv(T, chunk_size)
    dev, dt = k.device, k.dtype
    h = new_buffer((B, H, NT, K, V), dt, dev) if store_states else None
    u = new_buffer((B, T, H, V), dt, dev) if store_states else None
    ht = new_buffer((B, H, K, V), torch.float32, dev) if output_final_state else None
    o = new_buffer((B, T, H, V), dt, dev) if q is not None else None
    launch = delta_launch(gam is not None)
    cfg = launch.state_fwd if q is None else _fused_settings(launch, inference=not store_states)
    cap = cfg.BV if q is None else cfg.block_v(full_block(K))
    BV = sequential_block_v(V, cap, launch.seq.min_BV, launch.seq.min_waves, B * H, dev)
    programs, multiprocessors = triton.cdiv(V, BV) * B * H, utils.multiprocessors(dev)
    stages = cfg.stages_at(full_block(K), k.element_size(), programs, multiprocessors)
    mv, menter, count, mean_flags = _mean_args(mean, NT, chunk_size, "state_fwd", k, state_pass=True, K=K,
                                               programs=programs, multiprocessors=multiprocessors)
    state_fwd_kernel[(triton.cdiv(V, BV), B * H)](
        k, w, u0, u if u is not None else u0, gam if gam is not None else k, h if h is not None else k,
        h0 if h0 is not None else k, ht if ht is not None else k, q if q is not None else k,
        o if o is not None else u0, p if p is not None else k, mv, menter, scale, T, NT, H, count,
        K=K, V=V, BT=chunk_size, BK=full_block(K), BV=BV, USE_G=gam is not None, HAS_H0=h0 is not None,
        STORE_HT=output_final_state, PREC=dot_precision(dt, cfg.fp32_dots), FUSE_OUTPUT=q is not None,
        STORE_STATES=store_states, **mean_flags, **_p_flags(p, p_formed), num_warps=warps(cfg.num_warps),
        num_stages=stages,
    )
    return h, u, ht, o


def output_fwd(
    q: torch.Tensor, k: torch.Tensor, u: torch.Tensor, h: torch.Tensor,
    gam: torch.Tensor | None, scale: float, chunk_size: int = CHUNK, mean: RunningMean | None = None,
    p: torch.Tensor | None = None, p_formed: bool = False,
) -> torch.Tensor:
    """O = diag(2^gamma) (scale Q) S_n + (scale Q K^T ⊙ Gamma) U per chunk (+ the running
    mean of `mean`, in fp32 before O is rounded to q's dtype): [B, T, H, V].
    q, k: [B, T, H, K]; u: [B, T, H, V]; h: [B, H, NT, K, V]; gam: [B, T, H] fp32 or None;
    p: None, or a [B, T, H, chunk_size] buffer in q's dtype that receives each chunk's
    P = scale (Q K^T ⊙ Gamma) (as state_fwd's), or with p_formed holds it already and is read."""
    B, T, H, K = q.shape
    V = u.shape[-1]
    NT = triton.cdiv(T, chunk_size)
    o = new_buffer((B, T, H, V), q.dtype, q.device)
    launch = delta_launch(gam is not None)
    cfg = launch.output_fwd
    BV = block_size(V, cfg.BV)
    mv, menter, count, mean_flags = _mean_args(mean, NT, chunk_size, "output_fwd", q)
    heads_first = launch.heads_first_at(NT)
    output_fwd_kernel[utils.chunk_grid((triton.cdiv(V, BV),), NT, B * H, heads_first, "output_fwd")](
        q, k, u, h, gam if gam is not None else q, mv, menter, o, p if p is not None else q, scale, T, NT, H, count,
        K=K, V=V, BT=chunk_size, BK=block_size(K, cfg.BK), BV=BV, USE_G=gam is not None, **mean_flags,
        PREC=dot_precision(q.dtype, cfg.fp32_dots), HEADS_FIRST=heads_first, **_p_flags(p, p_formed),
        num_warps=warps(cfg.warps_for(BV)), num_stages=cfg.num_stages,
    )
    return o
