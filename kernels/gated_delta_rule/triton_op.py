"""Triton backend of the gated delta rule (and, with no gate, of the delta rule).

    gated_delta_rule_triton(q, k, v, g, beta, scale=..., initial_state=None,
                            output_final_state=False, chunk_size=64) -> (o, final_state)

Forward: wy_fwd (triton_wy.py) -> state_fwd -> output_fwd (triton_fwd.py; or state_fwd writing
the output too, DeltaLaunch.fused_fwd).
Forward with no gradient wanted (delta_rule_forward_only, as the custom op delta_rule_infer):
the same kernels storing nothing for a backward (no Tm; with DeltaLaunch.infer_fused, one state
pass writing only O, no h or U).
Where DeltaLaunch.keeps_p holds for the head dim, the training forward keeps each chunk's P =
scale (Q K^T ⊙ Gamma): formed by wy_fwd and read by the output pass (p_in_wy, GDN's default
above K = 64), or stored by the output pass (store_p); the backward's dU_local reads it instead
of forming it again.
Backward: du_local -> state_bwd (triton_bwd.py; or state_bwd alone, StateBwdLaunch.local_du)
-> dqkw (triton_bwd_grad.py) -> wy_bwd (triton_wy_bwd.py; or the two as one kernel,
triton_bwd_fused.py, DqkwLaunch.fuse_wy_bwd), reusing the forward's Tm, W, U and
per-chunk states.

Why store the per-chunk states instead of recomputing them in the backward (as
flash-linear-attention does): recomputation re-runs W/U0 and the sequential state pass (two
launches, one sequential over chunks, ~25% of a forward), while storing costs
NT * K * V values per head, i.e. 2 * K * V / 64 bytes per token and head in 16-bit (512 B at
K = V = 128, twice the size of q). The memory task (`harness run --task memory`) measures
what the stored states cost a mixer's training step.

Keys need not be unit norm: the transition I - beta k k^T is a contraction, and the
chunk's (I + A)^{-1} well conditioned, while beta ||k||^2 <= 2.

ChunkDeltaRuleFunction runs inside the custom ops delta_rule_fwd / delta_rule_bwd
(kernels/common/custom_op.py) so that torch.compile traces the Triton path as opaque nodes;
`delta_rule_apply` is the differentiable entry. The forward runs under the launch
settings in effect for its op (kernels/common/launch/: gated_delta_rule with a gate,
delta_rule without) and the backward under the same ones, which the custom ops pass on as a
JSON string (autograd may run the backward on another thread).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kernels.common.custom_op import FunctionContext, fake_like, op_name, or_placeholder, placeholder, present
from kernels.common.launch import decode, encode, launch_settings, note_launch
from kernels.common.triton.utils import new_buffer
from kernels.gated_delta_rule.triton_bwd import du_local, local_du_fused, state_bwd
from kernels.gated_delta_rule.triton_bwd_fused import dqkw_wy_bwd, fused_wy_bwd_applies
from kernels.gated_delta_rule.triton_bwd_grad import dqkw
from kernels.gated_delta_rule.triton_fwd import RunningMean, fused_output_applies, output_fwd, state_fwd
from kernels.gated_delta_rule.triton_wy import CHUNK, delta_launch, delta_op, wy_fwd
from kernels.gated_delta_rule.triton_wy_bwd import wy_bwd

TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class DeltaOptions:
    """Non-tensor arguments of one call: the query scale and whether to return the final state."""

    scale: float
    output_final_state: bool


class ChunkDeltaRuleFunction(torch.autograd.Function):
    """(o, final_state) = gated delta rule (+ a running mean added to o before it is rounded,
    or None: kernels/gated_delta_rule/triton_fwd.py, RunningMean; its gradient is the
    caller's); g None means the ungated delta rule."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, opts: DeltaOptions, mean: RunningMean | None = None):
        ctx.launch = note_launch(delta_op(g is not None))
        h0 = initial_state.float().contiguous() if initial_state is not None else None
        K = q.shape[-1]
        p = new_buffer(q.shape[:3] + (CHUNK,), q.dtype, q.device) if ctx.launch.keeps_p(K) else None
        in_wy = ctx.launch.p_in_wy_at(K)  # P formed by wy_fwd, read by the output
        gam, tm, w, u0 = wy_fwd(k, v, beta, g, q=q if in_wy else None, scale=opts.scale, p=p if in_wy else None)
        fused = fused_output_applies(q.shape[0] * q.shape[2], g is not None)
        h, u, ht, o = state_fwd(k, w, u0, gam, h0, opts.output_final_state, q if fused else None, opts.scale,
                                mean=mean if fused else None, p=p if fused else None, p_formed=in_wy)
        del u0
        if not fused:
            o = output_fwd(q, k, u, h, gam, opts.scale, mean=mean, p=p, p_formed=in_wy)
        ctx.save_for_backward(q, k, v, beta, gam, tm, w, u, h, p)
        ctx.opts = opts
        ctx.g_dtype = g.dtype if g is not None else None
        ctx.h0_dtype = initial_state.dtype if initial_state is not None else None
        ctx.need_dg = g is not None
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        with launch_settings(**{delta_op(ctx.g_dtype is not None): ctx.launch}):
            return ChunkDeltaRuleFunction._backward(ctx, do, dht)

    @staticmethod
    def _backward(ctx, do, dht):
        q, k, v, beta, gam, tm, w, u, h, p = ctx.saved_tensors
        opts = ctx.opts
        do = do.to(q.dtype).contiguous()
        dht = dht.float().contiguous() if dht is not None else None
        # dU_local = P^T dO: its own launch, or formed inside the state pass (StateBwdLaunch.local_du),
        # from the forward's P where it kept one (DeltaLaunch.keeps_p)
        local = local_du_fused(q.shape[0] * q.shape[2], q.shape[3], gam is not None)
        du = None if local else du_local(q, k, do, gam, opts.scale, p=p)
        du, dh, dh0 = state_bwd(q, k, w, do, du, gam, dht, opts.scale, ctx.h0_dtype is not None, p=p)
        if fused_wy_bwd_applies(gam is not None, v.shape[-1]):  # DqkwLaunch.fuse_wy_bwd
            dq, dk, dv, dbeta, dg = dqkw_wy_bwd(q, k, v, beta, gam, tm, u, h, dh, do, du, opts.scale, ctx.g_dtype,
                                                ctx.need_dg)
        else:
            dq, dk_part, dw, dgam_part = dqkw(q, k, u, h, dh, do, du, gam, opts.scale, need_dg=ctx.need_dg)
            del dh
            dk, dv, dbeta, dg = wy_bwd(k, v, beta, gam, tm, dw, du, dk_part, dgam_part, ctx.g_dtype, ctx.need_dg)
        if dh0 is not None:
            dh0 = dh0.to(ctx.h0_dtype)
        return dq, dk, dv, dg, dbeta, dh0, None, None


def stores_p(gated: bool, K: int) -> bool:
    """Whether a training forward at head dim K stores P for its backward (DeltaLaunch.store_p
    or p_in_wy, under the launch settings in effect for the op: gated_delta_rule if gated, else
    delta_rule)."""
    return delta_launch(gated).keeps_p(K)


@torch.library.custom_op(op_name("delta_rule_fwd"), mutates_args=())
def delta_rule_fwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, initial_state: Tensor | None,
    scale: float, output_final_state: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """ChunkDeltaRuleFunction's forward as a custom op. q, k: [B, T, H, K], v: [B, T, H, V]
    (one dtype, contiguous); g | None, beta: [B, T, H]; initial_state [B, H, K, V] or None.
    Returns o [B, T, H, V], the final state [B, H, K, V] fp32 (a placeholder unless
    output_final_state) and what the backward reads besides the inputs: gamma [B, T, H] fp32
    (cumulative log2-gates; a placeholder without g), Tm [B, T, H, 64], W [B, T, H, K], U [B, T, H, V], the
    per-chunk states h [B, H, NT, K, V] (in q's dtype) and P [B, T, H, 64] (in q's dtype; a
    placeholder unless stores_p)."""
    ctx = FunctionContext()
    o, ht = ChunkDeltaRuleFunction.forward(ctx, q, k, v, g, beta, initial_state, DeltaOptions(scale, output_final_state))
    gam, tm, w, u, h, p = ctx.saved_tensors[4:]
    return o, or_placeholder(ht, q.device), or_placeholder(gam, q.device), tm, w, u, h, or_placeholder(p, q.device)


@delta_rule_fwd.register_fake
def _delta_rule_fwd_fake(q, k, v, g, beta, initial_state, scale, output_final_state):
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = (T + CHUNK - 1) // CHUNK
    ht = q.new_empty(B, H, K, V, dtype=torch.float32) if output_final_state else placeholder(q.device)
    gam = q.new_empty(B, T, H, dtype=torch.float32) if g is not None else placeholder(q.device)
    p = q.new_empty(B, T, H, CHUNK) if stores_p(g is not None, K) else placeholder(q.device)
    return (q.new_empty(B, T, H, V), ht, gam, q.new_empty(B, T, H, CHUNK), q.new_empty(B, T, H, K),
            q.new_empty(B, T, H, V), q.new_empty(B, H, NT, K, V), p)


@torch.library.custom_op(op_name("delta_rule_bwd"), mutates_args=())
def delta_rule_bwd(
    do: Tensor, dht: Tensor | None, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, gam: Tensor | None,
    tm: Tensor, w: Tensor, u: Tensor, h: Tensor, p: Tensor, scale: float, g_dtype: torch.dtype | None,
    h0_dtype: torch.dtype | None, launch: str, need_dg: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """ChunkDeltaRuleFunction's backward as a custom op: the gradients (dq, dk, dv, dg,
    dbeta, dh0) of delta_rule_fwd's inputs, shaped as those inputs; dg (in g_dtype) is a
    placeholder without a gate or where the gate wants no gradient (need_dg False: its
    kernels then skip it), dh0 (in h0_dtype) without an initial state. launch: the forward's
    launch settings (kernels/common/launch.encode), whose keeps_p at q's head dim says whether
    p is the forward's P or a placeholder."""
    forward_launch = decode(delta_op(g_dtype is not None), launch)
    ctx = FunctionContext((q, k, v, beta, gam, tm, w, u, h,
                           present(p, forward_launch.keeps_p(q.shape[-1]))),
                          opts=DeltaOptions(scale, dht is not None), g_dtype=g_dtype, h0_dtype=h0_dtype,
                          need_dg=need_dg and g_dtype is not None, launch=forward_launch)
    dq, dk, dv, dg, dbeta, dh0, _, _ = ChunkDeltaRuleFunction.backward(ctx, do, dht)
    return dq, dk, dv, or_placeholder(dg, q.device), dbeta, or_placeholder(dh0, q.device)


@delta_rule_bwd.register_fake
def _delta_rule_bwd_fake(do, dht, q, k, v, beta, gam, tm, w, u, h, p, scale, g_dtype, h0_dtype, launch, need_dg=True):
    B, T, H, K = q.shape
    dg = q.new_empty(B, T, H, dtype=g_dtype) if g_dtype is not None and need_dg else placeholder(q.device)
    dh0 = q.new_empty(B, H, K, v.shape[-1], dtype=h0_dtype) if h0_dtype is not None else placeholder(q.device)
    return fake_like(q, q.device), fake_like(k, q.device), fake_like(v, q.device), dg, fake_like(beta, q.device), dh0


def _delta_rule_setup(ctx, inputs, output):
    q, k, v, g, beta, initial_state, scale, output_final_state = inputs
    _, _, gam, tm, w, u, h, p = output
    ctx.save_for_backward(q, k, v, beta, gam, tm, w, u, h, p)
    ctx.scale, ctx.output_final_state = scale, output_final_state
    ctx.g_dtype = g.dtype if g is not None else None
    ctx.h0_dtype = initial_state.dtype if initial_state is not None else None
    ctx.launch = encode(delta_op(g is not None))  # what the forward ran under, for the backward op
    # no zero gradients for the residual outputs, which nothing downstream uses
    ctx.set_materialize_grads(False)


def _delta_rule_backward(ctx, do, dht, *residual_grads):
    q, k, v, beta, gam, tm, w, u, h, p = ctx.saved_tensors
    has_g, has_h0 = ctx.g_dtype is not None, ctx.h0_dtype is not None
    need_dg = has_g and ctx.needs_input_grad[3]
    do = do if do is not None else torch.zeros_like(v)
    dht = dht if ctx.output_final_state else None
    dq, dk, dv, dg, dbeta, dh0 = delta_rule_bwd(
        do, dht, q, k, v, beta, present(gam, has_g), tm, w, u, h, p, ctx.scale, ctx.g_dtype, ctx.h0_dtype, ctx.launch,
        need_dg,
    )
    return dq, dk, dv, present(dg, need_dg), dbeta, present(dh0, has_h0), None, None


delta_rule_fwd.register_autograd(_delta_rule_backward, setup_context=_delta_rule_setup)


def delta_rule_forward_only(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, initial_state: Tensor | None, scale: float,
    output_final_state: bool, mean: RunningMean | None = None,
) -> tuple[Tensor, Tensor | None]:
    """ChunkDeltaRuleFunction's forward where no backward follows: it keeps nothing for one
    (no Tm; under DeltaLaunch.infer_fused no per-chunk states or U either). initial_state:
    [B, H, K, V] or None; mean: as ChunkDeltaRuleFunction's. Returns (o, final state fp32 or
    None)."""
    note_launch(delta_op(g is not None))
    h0 = initial_state.float().contiguous() if initial_state is not None else None
    gam, _, w, u0 = wy_fwd(k, v, beta, g, store_tm=False)
    if fused_output_applies(q.shape[0] * q.shape[2], g is not None, inference=True):
        _, _, ht, o = state_fwd(k, w, u0, gam, h0, output_final_state, q, scale, store_states=False, mean=mean)
    else:
        h, u, ht, _ = state_fwd(k, w, u0, gam, h0, output_final_state)
        del u0
        o = output_fwd(q, k, u, h, gam, scale, mean=mean)
    return o, ht


@torch.library.custom_op(op_name("delta_rule_infer"), mutates_args=())
def delta_rule_infer(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, initial_state: Tensor | None,
    scale: float, output_final_state: bool,
) -> tuple[Tensor, Tensor]:
    """delta_rule_forward_only as a custom op (arguments as delta_rule_fwd's). Returns (o
    [B, T, H, V], the final state [B, H, K, V] fp32 or a placeholder unless output_final_state)."""
    o, ht = delta_rule_forward_only(q, k, v, g, beta, initial_state, scale, output_final_state)
    return o, or_placeholder(ht, q.device)


@delta_rule_infer.register_fake
def _delta_rule_infer_fake(q, k, v, g, beta, initial_state, scale, output_final_state):
    B, _, H, K = q.shape
    ht = q.new_empty(B, H, K, v.shape[-1], dtype=torch.float32) if output_final_state else placeholder(q.device)
    return q.new_empty(q.shape[:-1] + (v.shape[-1],)), ht


def wants_grad(*tensors: Tensor | None) -> bool:
    """Whether autograd would record an op on these tensors."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def delta_rule_apply(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, initial_state: Tensor | None,
    scale: float, output_final_state: bool,
) -> tuple[Tensor, Tensor | None]:
    """The differentiable Triton gated delta rule (g None: the delta rule) on prepared inputs
    (as delta_rule_fwd takes them). Returns (o [B, T, H, V], final state [B, H, K, V] fp32 or
    None); gradients flow to q, k, v, g, beta and initial_state. Where none of them wants a
    gradient, the forward stores nothing for a backward (delta_rule_infer)."""
    if not wants_grad(q, k, v, g, beta, initial_state):
        o, ht = delta_rule_infer(q, k, v, g, beta, initial_state, float(scale), bool(output_final_state))
        return o, present(ht, output_final_state)
    o, ht, *_ = delta_rule_fwd(q, k, v, g, beta, initial_state, float(scale), bool(output_final_state))
    return o, present(ht, output_final_state)


def check_triton_inputs(op: str, q: torch.Tensor, v: torch.Tensor, chunk_size: int) -> None:
    """What the Triton kernels support beyond the op contract, as ValueErrors."""
    if q.dtype not in TRITON_DTYPES:
        raise ValueError(f"{op}: backend='triton' takes float16, bfloat16, float32 or float64 inputs, got {q.dtype}")
    if chunk_size != CHUNK:
        raise ValueError(f"{op}: backend='triton' needs chunk_size={CHUNK}, got {chunk_size!r}")
    K, V = q.shape[-1], v.shape[-1]
    if K > MAX_HEAD_DIM or V > MAX_HEAD_DIM:
        raise ValueError(
            f"{op}: backend='triton' supports K, V <= {MAX_HEAD_DIM}, got K={K}, V={V}"
        )


def chunk_delta_rule_triton(
    op: str, q, k, v, g, beta, scale: float, initial_state, output_final_state: bool, chunk_size: int,
):
    """Shared entry of delta_rule / gated_delta_rule (g None for the former); inputs validated
    by the public op. Returns (o [B, T, H, V] in q's dtype, final state fp32 or None).
    float64 inputs are computed in float32 (the kernels' widest type) and returned as float64,
    final state included."""
    check_triton_inputs(op, q, v, chunk_size)
    input_dtype = q.dtype
    dt = torch.float32 if q.dtype == torch.float64 else q.dtype
    q, k, v = q.to(dt).contiguous(), k.to(dt).contiguous(), v.to(dt).contiguous()
    beta = beta.contiguous()
    g = g.contiguous() if g is not None else None
    o, ht = delta_rule_apply(q, k, v, g, beta, initial_state, scale, output_final_state)
    if input_dtype == torch.float64:
        o, ht = o.double(), (ht.double() if ht is not None else None)
    return o, (ht if output_final_state else None)


def gated_delta_rule_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    scale: float, initial_state: torch.Tensor | None = None, output_final_state: bool = False,
    chunk_size: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule on Triton. q, k: [B, T, H, K]; v: [B, T, H, V]; g (log decay, <= 0),
    beta: [B, T, H]; initial_state [B, H, K, V] or None. Arguments are already validated by
    kernels.gated_delta_rule.gated_delta_rule. Returns (o [B, T, H, V] in q's dtype,
    final state [B, H, K, V] fp32 or None); differentiable in q, k, v, g, beta, initial_state."""
    return chunk_delta_rule_triton(
        "gated_delta_rule", q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size
    )
