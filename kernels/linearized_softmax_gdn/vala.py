"""VaLA, the first-order ("vanilla") linearization of softmax attention (docs/design.md §7), the
baseline of the linearized softmax GDN:

    o_t = vbar_t + ((1/t) sum_{i<=t} k_i v_i^T - kbar_t vbar_t^T)^T q'_t,    q' = scale q

Two forms: `vala_reference` (a loop over tokens, straight from the formula) and `vala_torch`
(all tokens at once, through cumulative sums); the public op `vala_attention` is in the
folder's __init__.py. The torch form uses the identity of seed 000,
    sum_{i<=t} k_i v_i^T - t kbar_t vbar_t^T = sum_{i<=t} (k_i - kbar_i)(v_i - vbar_{i-1})^T,
i.e. causal linear attention on centred keys and values, divided by t. The centred form
avoids the cancellation between the two large uncentred terms.
"""

from __future__ import annotations

import torch

from kernels.common.chunking import merge_chunks, split_chunks
from kernels.gated_delta_rule.chunked import compute_dtype
from kernels.linearized_softmax_gdn.chunked import centre

_CHUNK = 64  # chunk length of the torch form; any value gives the same result


def vala_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Token loop over the definition. q, k: [B, T, H, K]; v: [B, T, H, V] -> o [B, T, H, V]
    (in `dtype` when given, else q.dtype; computed in fp32, or fp64 for fp64 inputs)."""
    B, T, H, K = q.shape
    dt = dtype or (torch.float64 if q.dtype == torch.float64 else torch.float32)
    qs, ks, vs = q.to(dt) * scale, k.to(dt), v.to(dt)
    kv_sum = torch.zeros(B, H, K, v.shape[-1], dtype=dt, device=q.device)
    k_sum = torch.zeros(B, H, K, dtype=dt, device=q.device)
    v_sum = torch.zeros(B, H, v.shape[-1], dtype=dt, device=q.device)
    outs = []
    for i in range(T):
        t = i + 1
        kv_sum = kv_sum + ks[:, i].unsqueeze(-1) * vs[:, i].unsqueeze(-2)
        k_sum, v_sum = k_sum + ks[:, i], v_sum + vs[:, i]
        k_mean, v_mean = k_sum / t, v_sum / t
        a_t = kv_sum / t - k_mean.unsqueeze(-1) * v_mean.unsqueeze(-2)  # [B, H, K, V]
        outs.append(v_mean + torch.einsum("bhk,bhkv->bhv", qs[:, i], a_t))
    return torch.stack(outs, dim=1).to(dtype or q.dtype)


def vala_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """All tokens at once. q, k: [B, T, H, K]; v: [B, T, H, V] -> o [B, T, H, V] in q.dtype."""
    T = q.shape[1]
    dt = compute_dtype(q, k, v)
    c = centre(k, v, None, dt)
    C = min(_CHUNK, T)
    qc = split_chunks(q.to(dt) * scale, C)  # [B, H, N, C, K]
    uc, wc = split_chunks(c.u, C), split_chunks(c.w, C)
    # sum_{i<=t} (q'_t . u_i) w_i: earlier chunks through prefix sums of u^T w, this chunk
    # through the masked score matrix.
    chunk_uw = uc.transpose(-1, -2) @ wc  # [B, H, N, K, V]
    prefix = torch.cat([torch.zeros_like(chunk_uw[:, :, :1]), chunk_uw[:, :, :-1].cumsum(2)], dim=2)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    scores = (qc @ uc.transpose(-1, -2)).masked_fill(~causal, 0.0)
    summed = merge_chunks(qc @ prefix + scores @ wc, T)  # [B, T, H, V]
    t = c.positions.to(dt)[None, :, None, None]
    return (c.v_mean + summed / t).to(q.dtype)
