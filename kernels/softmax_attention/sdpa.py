"""Softmax attention through torch.nn.functional.scaled_dot_product_attention (backend "torch").

SDPA picks its own fastest kernel for the device and dtype (flash/efficient/cuDNN/math)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.softmax_attention.cache import KVCache, append_to_cache
from kernels.softmax_attention.reference import causal_mask_with_prefix


def softmax_attention_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    initial_state: KVCache | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, KVCache | None]:
    """Causal softmax attention by SDPA. q, k: [B, T, H, K]; v: [B, T, H, V];
    initial_state: KVCache of S earlier tokens or None. Returns (o [B, T, H, V] in q's
    dtype, KVCache of all S + T tokens or None)."""
    cache = append_to_cache(k, v, initial_state)
    T, S = q.shape[1], cache.k.shape[1] - q.shape[1]
    # SDPA wants [B, H, T, D]; its is_causal is aligned top-left, right only without a prefix.
    q_, k_, v_ = q.transpose(1, 2), cache.k.transpose(1, 2), cache.v.transpose(1, 2)
    if S == 0:
        o = F.scaled_dot_product_attention(q_, k_, v_, is_causal=True, scale=scale)
    else:
        mask = causal_mask_with_prefix(T, S, q.device)
        o = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask, scale=scale)
    return o.transpose(1, 2).contiguous(), (cache if output_final_state else None)
