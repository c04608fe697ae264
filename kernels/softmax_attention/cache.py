"""The decoding state of softmax attention: the keys and values seen so far."""

from __future__ import annotations

from typing import NamedTuple

import torch


class KVCache(NamedTuple):
    """Cached keys k: [B, S, H, K] and values v: [B, S, H, V], in the dtype of the inputs
    that produced them (the cache stores them as given; it accumulates nothing)."""

    k: torch.Tensor
    v: torch.Tensor


def check_kv_cache(op: str, name: str, cache: KVCache | None, B: int, H: int, K: int, V: int) -> None:
    """Check an optional KV cache against batch B, heads H and head dims K, V."""
    if cache is None:
        return
    if not (isinstance(cache, tuple) and len(cache) == 2 and all(isinstance(t, torch.Tensor) for t in cache)):
        raise ValueError(
            f"{op}: {name} must be a KVCache(k: [B, S, H, K], v: [B, S, H, V]) or None, got {type(cache).__name__}"
        )
    ck, cv = cache
    expected = f"k: [{B}, S, {H}, {K}], v: [{B}, S, {H}, {V}]"
    if ck.dim() != 4 or cv.dim() != 4 or (ck.shape[0], ck.shape[2], ck.shape[3]) != (B, H, K) \
            or tuple(cv.shape) != (B, ck.shape[1], H, V):
        raise ValueError(f"{op}: {name} must be a KVCache with {expected}, got k {list(ck.shape)}, v {list(cv.shape)}")


def append_to_cache(k: torch.Tensor, v: torch.Tensor, cache: KVCache | None) -> KVCache:
    """The cache extended by the new keys k: [B, T, H, K] and values v: [B, T, H, V] (dim 1)."""
    if cache is None:
        return KVCache(k, v)
    return KVCache(torch.cat([cache.k.to(k.dtype), k], dim=1), torch.cat([cache.v.to(v.dtype), v], dim=1))
