"""Triton backend of the linearized softmax GDN (docs/design.md §7): a Triton running-mean preprocessing
(triton_prep.py) feeding the gated delta rule kernels (kernels/gated_delta_rule/triton_op.py).

At absolute position t = count + 1, count + 2, ... (count = tokens already in the state):
    kbar_t = (k_sum + k_1 + ... + k_t) / t       vbar_t likewise, vbar_0 = 0
    key  u_t = k_t - kbar_t                       value (1 - 1/t) (v_t - vbar_{t-1})
    g_t = log(1 - 1/t)                            beta_t = 1 / (t - 1)
    o_t = GDN(q, u, value, g, beta)_t + vbar_t

At t = 1 the true gate is log 0 and beta is 1/0, but that step writes nothing and forgets
everything: u_1 = 0 and the value is 0. So there g = 0 and beta = 1 (finite, and harmless as
the key is zero), and a state with count = 0 is treated as empty (its tensors are ignored).
Every division is by t or by max(t - 1, 1), so no value or gradient is ever inf or NaN.
Gradients flow through the preprocessing to q, k, v and to the state's h, k_sum, v_sum.

fp16/bf16/fp32 inputs: LinGDNPrepFunction (Triton, fp32 sums; key/value in the input dtype).
fp64 inputs: the same formulas in torch (running_mean_torch), fp64 sums, key/value in fp32
for the kernels, whose widest type is fp32.
"""

from __future__ import annotations

import torch

from kernels.gated_delta_rule.triton_op import ChunkDeltaRuleFunction, DeltaOptions, check_triton_inputs
from kernels.linearized_softmax_gdn.triton_prep import LinGDNPrepFunction, PrepOptions, running_mean_torch


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
        key, value, v_bar, k_sum, v_sum = LinGDNPrepFunction.apply(
            k.contiguous(), v.contiguous(),
            k_sum0.float().contiguous() if started else None,
            v_sum0.float().contiguous() if started else None, PrepOptions(count=count))

    # gates depend on the position only: [T] vectors in fp64, broadcast over batch and heads
    pos = torch.arange(count + 1, count + T + 1, device=dev, dtype=torch.float64)
    first = pos == 1.0
    gate = torch.where(first, 0.0, torch.log1p(-1.0 / pos)).float()
    beta = torch.where(first, 1.0, 1.0 / torch.clamp(pos - 1.0, min=1.0)).float()
    gate = gate[None, :, None].expand(B, T, H).contiguous()
    beta = beta[None, :, None].expand(B, T, H).contiguous()

    h0 = initial_state.h if started else None
    opts = DeltaOptions(scale=float(scale), output_final_state=bool(output_final_state))
    o, ht = ChunkDeltaRuleFunction.apply(q.to(dt).contiguous(), key.contiguous(), value.contiguous(),
                                         gate, beta, h0, opts)
    # o_t + vbar_t in fp32 (fp64 for fp64 inputs) and rounded once. In place: v_bar is a fresh
    # tensor nobody saved for backward, so this spares an fp32 [B, T, H, V] temporary
    o = v_bar.add_(o).to(out_dtype)
    if not output_final_state:
        return o, None
    state = LinGDNState(h=ht.to(acc), k_sum=k_sum, v_sum=v_sum, count=count + T)
    return o, state
