"""Softmax attention, explicit masked softmax in fp32/fp64 (the ground truth of every test).

    o_t = sum_{i <= S + t} softmax_i(scale q_t . k_i) v_i      (S cached keys come first)
"""

from __future__ import annotations

import torch

from kernels.linear_attention.reference import accumulation_dtype
from kernels.softmax_attention.cache import KVCache, append_to_cache


def causal_mask_with_prefix(T: int, S: int, device: torch.device) -> torch.Tensor:
    """Boolean [T, S + T] mask, True where query t may attend key i: all S cached keys and
    the new keys up to itself (the causal mask aligned to the bottom-right corner)."""
    query = torch.arange(T, device=device)[:, None]
    key = torch.arange(S + T, device=device)[None, :]
    return key <= query + S


def softmax_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    initial_state: KVCache | None = None,
    output_final_state: bool = False,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, KVCache | None]:
    """Causal softmax attention, differentiable by autograd.

    q, k: [B, T, H, K]; v: [B, T, H, V]; initial_state: a KVCache of S earlier tokens or
    None. Computes in fp32, or fp64 for fp64 inputs / dtype=torch.float64. Returns o:
    [B, T, H, V] in q's dtype (fp64 when dtype=torch.float64) and, if output_final_state,
    the KVCache of all S + T tokens.
    """
    acc = accumulation_dtype(q, dtype)
    out_dtype = acc if dtype == torch.float64 else q.dtype
    cache = append_to_cache(k, v, initial_state)
    T, S = q.shape[1], cache.k.shape[1] - q.shape[1]
    scores = torch.einsum("bthk,bshk->bhts", q.to(acc) * scale, cache.k.to(acc))
    scores = scores.masked_fill(~causal_mask_with_prefix(T, S, q.device), float("-inf"))
    o = torch.einsum("bhts,bshv->bthv", torch.softmax(scores, dim=-1), cache.v.to(acc))
    return o.to(out_dtype), (cache if output_final_state else None)
