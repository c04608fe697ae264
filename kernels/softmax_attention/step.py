"""Softmax attention, one decoding step: append to the KV cache and attend over it."""

from __future__ import annotations

import torch

from kernels.common.checks import step_dtype
from kernels.softmax_attention.cache import KVCache, append_to_cache


def softmax_attention_step_unchecked(
    q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, state: KVCache | None, scale: float
) -> tuple[torch.Tensor, KVCache]:
    """q_t, k_t: [B, H, K]; v_t: [B, H, V]; state: KVCache of S tokens or None. Returns
    (o_t [B, H, V] in q_t's dtype, computed in fp32/fp64; the KVCache of S + 1 tokens)."""
    acc = step_dtype(q_t)
    cache = append_to_cache(k_t[:, None], v_t[:, None], state)
    scores = torch.einsum("bhk,bshk->bhs", q_t.to(acc) * scale, cache.k.to(acc))
    o_t = torch.einsum("bhs,bshv->bhv", torch.softmax(scores, dim=-1), cache.v.to(acc))
    return o_t.to(q_t.dtype), cache
