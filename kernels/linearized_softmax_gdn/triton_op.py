"""Triton backend of the linearized softmax GDN (docs/design.md §7): a Triton running-mean preprocessing
(triton_prep.py) feeding the gated delta rule kernels (kernels/gated_delta_rule/triton_op.py).

At absolute position t = count + 1, count + 2, ... (count = tokens already in the state):
    kbar_t = (k_sum + k_1 + ... + k_t) / t       vbar_t likewise, vbar_0 = 0
    key  u_t = k_t - kbar_t                       value (1 - 1/t) (v_t - vbar_{t-1})
    g_t = log(1 - 1/t)                            beta_t = 1 / (t - 1)
    o_t = GDN(q, u, value, g, beta)_t + vbar_t   (the addition inside GDN's output kernel)

At t = 1 the true gate is log 0 and beta is 1/0, but that step writes nothing and forgets
everything: u_1 = 0 and the value is 0. So there g = 0 and beta = 1 (finite, and harmless as
the key is zero), and a state with count = 0 is treated as empty (its tensors are ignored).
Every division is by t or by max(t - 1, 1), so no value or gradient is ever inf or NaN.
Gradients flow through the preprocessing to q, k, v and to the state's h, k_sum, v_sum.

fp16/bf16/fp32 inputs: LinGDNPrepFunction (Triton, fp32 sums; key/value in the input dtype).
fp64 inputs: the same formulas in torch (running_mean_torch), fp64 sums, key/value in fp32
for the kernels, whose widest type is fp32.

LinGDNPrepFunction runs inside the custom ops lin_gdn_prep_fwd / lin_gdn_prep_bwd
(kernels/common/custom_op.py), and the delta rule through delta_rule_apply, so that
torch.compile traces the Triton path as opaque nodes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.common.custom_op import FunctionContext, op_name, or_placeholder, placeholder, present
from kernels.common.launch import decode, encode
from kernels.gated_delta_rule.triton_op import check_triton_inputs, delta_rule_apply
from kernels.linearized_softmax_gdn.triton_prep import LinGDNPrepFunction, PrepOptions, running_mean_torch


@torch.library.custom_op(op_name("lin_gdn_prep_fwd"), mutates_args=())
def lin_gdn_prep_fwd(
    k: Tensor, v: Tensor, k_sum0: Tensor | None, v_sum0: Tensor | None, count: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """LinGDNPrepFunction's forward as a custom op: k [B, T, H, K], v [B, T, H, V]
    (fp16/bf16/fp32, contiguous), k_sum0 [B, H, K] / v_sum0 [B, H, V] fp32 or None, count
    tokens already seen. Returns (key [B, T, H, K] in k's dtype, value [B, T, H, V] in v's
    dtype, v_bar [B, T, H, V] fp32, k_sum [B, H, K] fp32, v_sum [B, H, V] fp32)."""
    return LinGDNPrepFunction.forward(FunctionContext(), k, v, k_sum0, v_sum0, PrepOptions(count=count))


@lin_gdn_prep_fwd.register_fake
def _lin_gdn_prep_fwd_fake(k, v, k_sum0, v_sum0, count):
    B, T, H, K = k.shape
    V = v.shape[-1]
    f32 = torch.float32
    return (k.new_empty(B, T, H, K), v.new_empty(B, T, H, V), v.new_empty(B, T, H, V, dtype=f32),
            k.new_empty(B, H, K, dtype=f32), v.new_empty(B, H, V, dtype=f32))


@torch.library.custom_op(op_name("lin_gdn_prep_bwd"), mutates_args=())
def lin_gdn_prep_bwd(
    d_key: Tensor | None, d_value: Tensor | None, d_v_bar: Tensor | None, d_k_sum: Tensor | None,
    d_v_sum: Tensor | None, count: int, k_shape: list[int], k_dtype: torch.dtype, v_shape: list[int],
    v_dtype: torch.dtype, device: torch.device, has_k_sum0: bool, has_v_sum0: bool, launch: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """LinGDNPrepFunction's backward as a custom op: from the cotangents of the five outputs
    (each may be None) to (dk, dv, dk_sum0, dv_sum0), the last two fp32 or placeholders
    where the forward had no initial sums. k_shape, k_dtype, v_shape, v_dtype, device: the
    forward's k and v; launch: the forward's launch settings (kernels/common/launch.encode)."""
    ctx = FunctionContext(count=count, has_s0=(has_k_sum0, has_v_sum0),
                          k_meta=(tuple(k_shape), k_dtype, device), v_meta=(tuple(v_shape), v_dtype, device),
                          launch=decode("linearized_softmax_gdn", launch))
    dk, dv, dk_sum0, dv_sum0, _ = LinGDNPrepFunction.backward(ctx, d_key, d_value, d_v_bar, d_k_sum, d_v_sum)
    return dk, dv, or_placeholder(dk_sum0, device), or_placeholder(dv_sum0, device)


@lin_gdn_prep_bwd.register_fake
def _lin_gdn_prep_bwd_fake(d_key, d_value, d_v_bar, d_k_sum, d_v_sum, count, k_shape, k_dtype, v_shape, v_dtype,
                           device, has_k_sum0, has_v_sum0, launch):
    B, _, H, K = k_shape
    V = v_shape[-1]
    f32 = torch.float32
    dk_sum0 = torch.empty(B, H, K, dtype=f32, device=device) if has_k_sum0 else placeholder(device)
    dv_sum0 = torch.empty(B, H, V, dtype=f32, device=device) if has_v_sum0 else placeholder(device)
    return (torch.empty(k_shape, dtype=k_dtype, device=device), torch.empty(v_shape, dtype=v_dtype, device=device),
            dk_sum0, dv_sum0)


def _lin_gdn_prep_setup(ctx, inputs, output):
    k, v, k_sum0, v_sum0, count = inputs
    ctx.count, ctx.has_s0 = count, (k_sum0 is not None, v_sum0 is not None)
    ctx.k_meta = (list(k.shape), k.dtype, k.device)
    ctx.v_meta = (list(v.shape), v.dtype)
    ctx.launch = encode("linearized_softmax_gdn")  # what the forward ran under, for the backward op
    ctx.set_materialize_grads(False)  # unused outputs stay None: no zero tensors to scan


def _lin_gdn_prep_backward(ctx, d_key, d_value, d_v_bar, d_k_sum, d_v_sum):
    (k_shape, k_dtype, device), (v_shape, v_dtype) = ctx.k_meta, ctx.v_meta
    dk, dv, dk_sum0, dv_sum0 = lin_gdn_prep_bwd(d_key, d_value, d_v_bar, d_k_sum, d_v_sum, ctx.count, k_shape,
                                                k_dtype, v_shape, v_dtype, device, *ctx.has_s0, ctx.launch)
    return dk, dv, present(dk_sum0, ctx.has_s0[0]), present(dv_sum0, ctx.has_s0[1]), None


lin_gdn_prep_fwd.register_autograd(_lin_gdn_prep_backward, setup_context=_lin_gdn_prep_setup)


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

    op = "linearized_softmax_gdn"
    check_triton_inputs(op, q, v, chunk_size)
    B, T, H = q.shape[:3]
    dev, out_dtype = q.device, q.dtype
    # float64 inputs: preprocessing in float64, the kernels in float32 (their widest type)
    acc = torch.float64 if out_dtype == torch.float64 else torch.float32
    dt = torch.float32 if out_dtype == torch.float64 else out_dtype
    count = int(initial_state.count) if initial_state is not None else 0
    started = initial_state is not None and count > 0
    k_sum0 = initial_state.k_sum if started else None
    v_sum0 = initial_state.v_sum if started else None
    if out_dtype == torch.float64:
        key, value, v_bar, k_sum, v_sum = running_mean_torch(k, v, k_sum0, v_sum0, count, acc, dt)
    else:
        key, value, v_bar, k_sum, v_sum = lin_gdn_prep_fwd(
            k.contiguous(), v.contiguous(),
            k_sum0.float().contiguous() if started else None,
            v_sum0.float().contiguous() if started else None, count)

    # gates depend on the position only: [T] vectors in fp64, broadcast over batch and heads
    pos = torch.arange(count + 1, count + T + 1, device=dev, dtype=torch.float64)
    first = pos == 1.0
    gate = torch.where(first, 0.0, torch.log1p(-1.0 / pos)).float()
    beta = torch.where(first, 1.0, 1.0 / torch.clamp(pos - 1.0, min=1.0)).float()
    gate = gate[None, :, None].expand(B, T, H).contiguous()
    beta = beta[None, :, None].expand(B, T, H).contiguous()

    h0 = initial_state.h if started else None
    # o_t + vbar_t: inside the output kernel, in fp32 before o's one rounding (no pass over
    # [B, T, H, V] after it); for fp64 inputs in fp64 after it, in place (v_bar is a fresh
    # tensor nobody saved for backward)
    fp64 = out_dtype == torch.float64
    o, ht = delta_rule_apply(q.to(dt).contiguous(), key.contiguous(), value.contiguous(), gate, beta, h0,
                             scale, output_final_state, addend=None if fp64 else v_bar)
    if fp64:
        o = v_bar.add_(o)
    if not output_final_state:
        return o, None
    state = LinGDNState(h=ht.to(acc), k_sum=k_sum, v_sum=v_sum, count=count + T)
    return o, state
