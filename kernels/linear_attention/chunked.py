"""Linear attention, chunkwise-parallel PyTorch form (backend "torch"); autograd does the backward.

Per chunk of C tokens with entering state S (docs/design.md §10, all gates zero):
    O = (Q K^T ⊙ M) V + Q S          M: causal mask, diagonal included
    S' = S + K^T V
Without gates the entering states are a prefix sum of the per-chunk increments K^T V, so no
loop over chunks is needed at all.
"""

from __future__ import annotations

import torch

from kernels.common.chunking import merge_chunks, split_chunks


def linear_attention_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked linear attention. q, k: [B, T, H, K]; v: [B, T, H, V]; any T >= 1.

    initial_state: [B, H, K, V] or None. Accumulates in fp32 (fp64 for fp64 inputs).
    Returns o: [B, T, H, V] in q's dtype and the final state [B, H, K, V] (fp32, or fp64
    for fp64 inputs; None unless output_final_state).
    """
    T = q.shape[1]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    C = min(chunk_size, T)  # a short sequence is one chunk, not one padded to 64 tokens
    qc = split_chunks(q.to(acc) * scale, C)  # [B, H, N, C, K]
    kc = split_chunks(k.to(acc), C)
    vc = split_chunks(v.to(acc), C)  # [B, H, N, C, V]

    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    scores = (qc @ kc.transpose(-1, -2)).masked_fill(~causal, 0.0)
    o = scores @ vc

    increments = kc.transpose(-1, -2) @ vc  # [B, H, N, K, V]
    through_chunk = increments.cumsum(dim=2)  # state after chunk n (from a zero start)
    entering = torch.cat([torch.zeros_like(through_chunk[:, :, :1]), through_chunk[:, :, :-1]], dim=2)
    final = through_chunk[:, :, -1]
    if initial_state is not None:
        state0 = initial_state.to(acc)
        entering = entering + state0[:, :, None]
        final = final + state0
    o = o + qc @ entering

    o = merge_chunks(o, T).to(q.dtype)
    return o, (final if output_final_state else None)
