"""Splitting a sequence into chunks for the chunkwise-parallel forms (docs/design.md §10).

    split_chunks(x, chunk_size)   [B, T, H, *D] -> [B, H, N, C, *D]   (T zero-padded to N * C)
    merge_chunks(x, T)            [B, H, N, C, *D] -> [B, T, H, *D]   (padding dropped)
    num_chunks(T, chunk_size)     N = ceil(T / C)
    check_chunk_size(op, chunk_size)   ValueError unless a positive int

Zero padding is neutral for every op of the contract when applied to all per-token inputs
at once: a padded token has k = 0 and beta = 0 (it writes nothing), g = 0 (it decays
nothing), and its output rows are dropped by `merge_chunks`. So the state after the last
chunk equals the state after token T.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def num_chunks(T: int, chunk_size: int) -> int:
    """Number of chunks of `chunk_size` tokens covering T tokens (the last one padded)."""
    return -(-T // chunk_size)


def split_chunks(x: torch.Tensor, chunk_size: int, pad_value: float = 0.0) -> torch.Tensor:
    """Reshape per-token x: [B, T, H, *D] into chunks [B, H, N, C, *D], N = ceil(T / C).

    The tail is filled with `pad_value` (zero by default). The result is contiguous with
    heads before time, the layout the batched matmuls of the chunked forms want.
    """
    B, T, H = x.shape[:3]
    feature_dims = tuple(x.shape[3:])
    n = num_chunks(T, chunk_size)
    pad = n * chunk_size - T
    if pad:
        # F.pad counts from the last dim: zero pads for the feature dims, then pad T at the end.
        x = F.pad(x, (0, 0) * len(feature_dims) + (0, 0, 0, pad), value=pad_value)
    x = x.reshape(B, n, chunk_size, H, *feature_dims)
    return x.movedim(3, 1).contiguous()


def merge_chunks(x: torch.Tensor, T: int) -> torch.Tensor:
    """Inverse of `split_chunks`: [B, H, N, C, *D] -> [B, T, H, *D] (contiguous), first T tokens."""
    B, H, n, chunk_size = x.shape[:4]
    feature_dims = tuple(x.shape[4:])
    x = x.movedim(1, 3).reshape(B, n * chunk_size, H, *feature_dims)
    return x[:, :T].contiguous()


def check_chunk_size(op: str, chunk_size: int) -> int:
    """Validate the chunk_size argument of a chunked op: a positive int; return it."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{op}: chunk_size must be a positive int, got {chunk_size!r}")
    return chunk_size
