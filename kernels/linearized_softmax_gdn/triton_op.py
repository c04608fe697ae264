"""Triton backend of the linearized softmax GDN (docs/design.md §7): a Triton running-mean
preprocessing (triton_prep.py) feeding the gated delta rule kernels (kernels/gated_delta_rule).

At absolute position t = count + 1, count + 2, ... (count = tokens already in the state):
    kbar_t = (k_sum + k_1 + ... + k_t) / t       vbar_t likewise, vbar_0 = 0
    key  u_t = k_t - kbar_t                       value (1 - 1/t) (v_t - vbar_{t-1})
    g_t = log(1 - 1/t)                            beta_t = 1 / (t - 1)
    o_t = GDN(q, u, value, g, beta)_t + vbar_t

At t = 1 the true gate is log 0 and beta is 1/0, but that step writes nothing and forgets
everything: u_1 = 0 and the value is 0. So there g = 0 and beta = 1 (finite, and harmless as
the key is zero), and a state with count = 0 is treated as empty (its tensors are ignored).
Every division is by t or by max(t - 1, 1), so no value or gradient is ever inf or NaN.

fp16/bf16/fp32 inputs: one pair of custom ops, lin_gdn_fwd / lin_gdn_bwd (so that
torch.compile traces the Triton path as opaque nodes), holds the whole op. The forward runs
the running-mean scans (keys, values, and the sums of v entering each 64-token chunk) and the
gated delta rule's forward, whose output kernel adds vbar_t formed from v and those sums: the
running mean is never stored whole. The backward runs the delta rule's backward (no gate or
beta gradient: they come from positions) and the scans' adjoint, which reads o's cotangent in
its own dtype as vbar's. With no gradient wanted, lin_gdn_infer stores nothing for a backward.
fp64 inputs: the same formulas in torch (running_mean_torch), fp64 sums, key/value in fp32
for the kernels, whose widest type is fp32, and vbar added after them in fp64.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor

from kernels.common.custom_op import FunctionContext, op_name, or_placeholder, placeholder, present
from kernels.common.launch import LinGdnLaunch, decode, encode, launch_settings, note_launch
from kernels.gated_delta_rule.triton_fwd import RunningMean
from kernels.gated_delta_rule.triton_op import (
    ChunkDeltaRuleFunction,
    DeltaOptions,
    check_triton_inputs,
    delta_rule_apply,
    delta_rule_forward_only,
    stores_p,
    wants_grad,
)
from kernels.gated_delta_rule.triton_wy import CHUNK
from kernels.linearized_softmax_gdn.triton_prep import prep_bwd, prep_fwd, running_mean_torch

OP = "linearized_softmax_gdn"
DELTA_OP = "gated_delta_rule"  # the launch settings its delta rule runs under


def positional_gates(count: int, B: int, T: int, H: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(g, beta) [B, T, H] fp32 contiguous at positions count + 1 ... count + T (module
    docstring), computed in fp64."""
    pos = torch.arange(count + 1, count + T + 1, device=device, dtype=torch.float64)
    first = pos == 1.0
    gate = torch.where(first, 0.0, torch.log1p(-1.0 / pos)).float()
    beta = torch.where(first, 1.0, 1.0 / torch.clamp(pos - 1.0, min=1.0)).float()
    return gate[None, :, None].expand(B, T, H).contiguous(), beta[None, :, None].expand(B, T, H).contiguous()


def _prepare(k: Tensor, v: Tensor, k_sum0: Tensor | None, v_sum0: Tensor | None, count: int, cfg: LinGdnLaunch):
    """The running-mean scans (triton_prep.py) under cfg.prep: (key and value, the delta
    rule's k and v; the RunningMean its output adds, from v and the entering sums or, under
    mean_form "stored", written whole by the scan; k_sum_T, v_sum_T)."""
    stored = cfg.mean_form == "stored"
    key, value, v_enter, k_sum, v_sum = prep_fwd(k, v, k_sum0, v_sum0, count, cfg.prep, store_mean=stored)
    if stored:  # v_enter is the running mean itself
        return key, value, RunningMean(v_enter, None, count, "stored"), k_sum, v_sum
    return key, value, RunningMean(v, v_enter, count, cfg.mean_form, cfg.mean_in_acc), k_sum, v_sum


def _training_delta_settings(cfg: LinGdnLaunch, K: int) -> AbstractContextManager:
    """The launch settings the training forward's delta rule runs under at head dim K:
    gated_delta_rule's, with its fused training pass off unless cfg.fuses_training(K)."""
    if cfg.fuses_training(K):
        return nullcontext()
    return launch_settings(**{DELTA_OP: {"fused_fwd": {"enabled": False}}})


@torch.library.custom_op(op_name("lin_gdn_fwd"), mutates_args=())
def lin_gdn_fwd(
    q: Tensor, k: Tensor, v: Tensor, h0: Tensor | None, k_sum0: Tensor | None, v_sum0: Tensor | None,
    scale: float, count: int, output_final_state: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The forward with its backward to come. q, k: [B, T, H, K], v: [B, T, H, V] (fp16,
    bf16 or fp32, one dtype, contiguous); h0 [B, H, K, V], k_sum0 [B, H, K], v_sum0 [B, H, V]
    fp32 or None (an empty state: count = 0). Returns o [B, T, H, V], the final h fp32 (a
    placeholder unless output_final_state), k_sum [B, H, K] and v_sum [B, H, V] fp32 after
    the last token, then what the backward reads: key, value, and the delta rule's gamma,
    Tm, W, U, per-chunk states and P (delta_rule_fwd's; P a placeholder unless stored)."""
    cfg = note_launch(OP)
    key, value, mean, k_sum, v_sum = _prepare(k, v, k_sum0, v_sum0, count, cfg)
    B, T, H = q.shape[:3]
    gate, beta = positional_gates(count, B, T, H, q.device)
    ctx = FunctionContext()
    with _training_delta_settings(cfg, q.shape[-1]):
        o, ht = ChunkDeltaRuleFunction.forward(ctx, q, key, value, gate, beta, h0,
                                               DeltaOptions(scale, output_final_state), mean)
    gam, tm, w, u, h, p = ctx.saved_tensors[4:]
    return o, or_placeholder(ht, q.device), k_sum, v_sum, key, value, gam, tm, w, u, h, or_placeholder(p, q.device)


@lin_gdn_fwd.register_fake
def _lin_gdn_fwd_fake(q, k, v, h0, k_sum0, v_sum0, scale, count, output_final_state):
    B, T, H, K = q.shape
    V = v.shape[-1]
    f32 = torch.float32
    NT = (T + CHUNK - 1) // CHUNK
    ht = q.new_empty(B, H, K, V, dtype=f32) if output_final_state else placeholder(q.device)
    return (q.new_empty(B, T, H, V), ht, q.new_empty(B, H, K, dtype=f32), q.new_empty(B, H, V, dtype=f32),
            q.new_empty(B, T, H, K), q.new_empty(B, T, H, V), q.new_empty(B, T, H, dtype=f32),
            q.new_empty(B, T, H, CHUNK), q.new_empty(B, T, H, K), q.new_empty(B, T, H, V), q.new_empty(B, H, NT, K, V),
            q.new_empty(B, T, H, CHUNK) if stores_p(True, K) else placeholder(q.device))


@torch.library.custom_op(op_name("lin_gdn_bwd"), mutates_args=())
def lin_gdn_bwd(
    do: Tensor, dht: Tensor | None, d_k_sum: Tensor | None, d_v_sum: Tensor | None, q: Tensor, key: Tensor,
    value: Tensor, gam: Tensor, tm: Tensor, w: Tensor, u: Tensor, h: Tensor, p: Tensor, scale: float, count: int,
    h0_dtype: torch.dtype | None, has_k_sum0: bool, has_v_sum0: bool, launch_delta: str, launch_prep: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """lin_gdn_fwd's backward: from the cotangents of o, the final h, k_sum and v_sum (the last
    three may be None) to (dq, dk, dv, dh0, dk_sum0, dv_sum0); dh0 (in h0_dtype), dk_sum0 and
    dv_sum0 (fp32) are placeholders where the forward had none. launch_delta, launch_prep:
    the forward's launch settings of the delta rule and of the scans (launch.encode)."""
    B, T, H = q.shape[:3]
    _, beta = positional_gates(count, B, T, H, q.device)
    forward_launch = decode(DELTA_OP, launch_delta)
    ctx = FunctionContext((q, key, value, beta, gam, tm, w, u, h,
                           present(p, forward_launch.keeps_p(q.shape[-1]))),
                          opts=DeltaOptions(scale, dht is not None), g_dtype=torch.float32, h0_dtype=h0_dtype,
                          need_dg=False, launch=forward_launch)
    dq, d_key, d_value, _, _, dh0, _, _ = ChunkDeltaRuleFunction.backward(ctx, do, dht)
    meta = (tuple(key.shape), key.dtype, key.device), (tuple(value.shape), value.dtype, value.device)
    # o = GDN(...) + vbar: vbar's cotangent is o's, read by the scan in its own dtype
    dk, dv, dk_sum0, dv_sum0 = prep_bwd(d_key, d_value, do, d_k_sum, d_v_sum, count, *meta,
                                        (has_k_sum0, has_v_sum0), decode(OP, launch_prep).prep)
    return (dq, dk, dv, or_placeholder(dh0, q.device), or_placeholder(dk_sum0, q.device),
            or_placeholder(dv_sum0, q.device))


@lin_gdn_bwd.register_fake
def _lin_gdn_bwd_fake(do, dht, d_k_sum, d_v_sum, q, key, value, gam, tm, w, u, h, p, scale, count, h0_dtype,
                      has_k_sum0, has_v_sum0, launch_delta, launch_prep):
    B, _, H, K = q.shape
    V = value.shape[-1]
    f32 = torch.float32
    dh0 = q.new_empty(B, H, K, V, dtype=h0_dtype) if h0_dtype is not None else placeholder(q.device)
    dk_sum0 = q.new_empty(B, H, K, dtype=f32) if has_k_sum0 else placeholder(q.device)
    dv_sum0 = q.new_empty(B, H, V, dtype=f32) if has_v_sum0 else placeholder(q.device)
    return torch.empty_like(q), torch.empty_like(key), torch.empty_like(value), dh0, dk_sum0, dv_sum0


def _lin_gdn_setup(ctx, inputs, output):
    q, k, v, h0, k_sum0, v_sum0, scale, count, output_final_state = inputs
    ctx.save_for_backward(q, *output[4:])
    ctx.scale, ctx.count, ctx.output_final_state = scale, count, output_final_state
    ctx.h0_dtype = h0.dtype if h0 is not None else None
    ctx.has_sums = (k_sum0 is not None, v_sum0 is not None)
    # what the forward ran under, for the backward op
    ctx.launch = (encode(DELTA_OP), encode(OP))
    ctx.set_materialize_grads(False)  # unused outputs stay None: no zero tensors to scan


def _lin_gdn_backward(ctx, do, dht, d_k_sum, d_v_sum, *residual_grads):
    q, key, value, gam, tm, w, u, h, p = ctx.saved_tensors
    do = do if do is not None else torch.zeros(q.shape[:-1] + (value.shape[-1],), dtype=q.dtype, device=q.device)
    dht = dht if ctx.output_final_state else None
    dq, dk, dv, dh0, dk_sum0, dv_sum0 = lin_gdn_bwd(
        do, dht, d_k_sum, d_v_sum, q, key, value, gam, tm, w, u, h, p, ctx.scale, ctx.count, ctx.h0_dtype,
        *ctx.has_sums, *ctx.launch,
    )
    return (dq, dk, dv, present(dh0, ctx.h0_dtype is not None), present(dk_sum0, ctx.has_sums[0]),
            present(dv_sum0, ctx.has_sums[1]), None, None, None)


lin_gdn_fwd.register_autograd(_lin_gdn_backward, setup_context=_lin_gdn_setup)


@torch.library.custom_op(op_name("lin_gdn_infer"), mutates_args=())
def lin_gdn_infer(
    q: Tensor, k: Tensor, v: Tensor, h0: Tensor | None, k_sum0: Tensor | None, v_sum0: Tensor | None,
    scale: float, count: int, output_final_state: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """lin_gdn_fwd where no backward follows (same arguments): (o, the final h or a
    placeholder, k_sum, v_sum), keeping nothing for a backward."""
    key, value, mean, k_sum, v_sum = _prepare(k, v, k_sum0, v_sum0, count, note_launch(OP))
    B, T, H = q.shape[:3]
    gate, beta = positional_gates(count, B, T, H, q.device)
    o, ht = delta_rule_forward_only(q, key, value, gate, beta, h0, scale, output_final_state, mean)
    return o, or_placeholder(ht, q.device), k_sum, v_sum


@lin_gdn_infer.register_fake
def _lin_gdn_infer_fake(q, k, v, h0, k_sum0, v_sum0, scale, count, output_final_state):
    B, _, H, K = q.shape
    V = v.shape[-1]
    f32 = torch.float32
    ht = q.new_empty(B, H, K, V, dtype=f32) if output_final_state else placeholder(q.device)
    return q.new_empty(q.shape[:-1] + (V,)), ht, q.new_empty(B, H, K, dtype=f32), q.new_empty(B, H, V, dtype=f32)


def linearized_softmax_gdn_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, initial_state=None,
    output_final_state: bool = False, chunk_size: int = 64,
):
    """Linearized softmax as a gated delta rule, on Triton.

    q, k: [B, T, H, K]; v: [B, T, H, V]; initial_state: LinGDNState(h [B, H, K, V],
    k_sum [B, H, K], v_sum [B, H, V] fp32, count: int) or None. Arguments are already
    validated by kernels.linearized_softmax_gdn. Returns (o [B, T, H, V] in q's dtype,
    LinGDNState after the last token, or None)."""
    from kernels.linearized_softmax_gdn import LinGDNState  # lazy: that package imports this one

    check_triton_inputs(OP, q, v, chunk_size)
    B, T, H = q.shape[:3]
    count = int(initial_state.count) if initial_state is not None else 0
    started = initial_state is not None and count > 0
    h0 = initial_state.h if started else None
    k_sum0 = initial_state.k_sum if started else None
    v_sum0 = initial_state.v_sum if started else None
    if q.dtype == torch.float64:
        return _fp64(q, k, v, scale, h0, k_sum0, v_sum0, count, output_final_state)
    args = (q.contiguous(), k.contiguous(), v.contiguous(), h0,
            k_sum0.float().contiguous() if started else None, v_sum0.float().contiguous() if started else None,
            float(scale), count, bool(output_final_state))
    if wants_grad(*args[:6]):
        o, ht, k_sum, v_sum, *_ = lin_gdn_fwd(*args)
    else:
        o, ht, k_sum, v_sum = lin_gdn_infer(*args)
    if not output_final_state:
        return o, None
    return o, LinGDNState(h=ht, k_sum=k_sum, v_sum=v_sum, count=count + T)


def _fp64(q, k, v, scale, h0, k_sum0, v_sum0, count: int, output_final_state: bool):
    """fp64 inputs: preprocessing in fp64 (torch), the delta rule's kernels in fp32 (their
    widest type), vbar added in fp64 after them."""
    from kernels.linearized_softmax_gdn import LinGDNState

    B, T, H = q.shape[:3]
    key, value, v_bar, k_sum, v_sum = running_mean_torch(k, v, k_sum0, v_sum0, count, torch.float64, torch.float32)
    gate, beta = positional_gates(count, B, T, H, q.device)
    o, ht = delta_rule_apply(q.float().contiguous(), key.contiguous(), value.contiguous(), gate, beta, h0, scale,
                             output_final_state)
    o = v_bar + o  # fp64
    if not output_final_state:
        return o, None
    return o, LinGDNState(h=ht.double(), k_sum=k_sum, v_sum=v_sum, count=count + T)
