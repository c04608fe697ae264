"""Chunkwise DeltaNet (backend "torch"): the gated delta rule's chunked form with no gate."""

from __future__ import annotations

import torch

from kernels.gated_delta_rule.chunked import chunk_gated_delta_rule


def chunk_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q, k: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H]; initial_state: [B, H, K, V].

    Returns o [B, T, H, V] in q.dtype and the final state (fp32, fp64 for fp64 inputs)
    when output_final_state. Arguments are assumed valid.
    """
    return chunk_gated_delta_rule(
        q, k, v, None, beta, scale, initial_state=initial_state,
        output_final_state=output_final_state, chunk_size=chunk_size,
    )
