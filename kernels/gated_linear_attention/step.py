"""Gated linear attention, one decoding step on the state."""

from __future__ import annotations

import torch

from kernels.linear_attention.step import step_dtype


def check_step_gate(op: str, g_t: torch.Tensor, B: int, H: int, K: int) -> None:
    """Check one token's log-gate g_t: [B, H] or [B, H, K], values <= 0."""
    valid = f"[{B}, {H}] or [{B}, {H}, {K}]"
    if not isinstance(g_t, torch.Tensor):
        raise ValueError(f"{op}: g_t must be a torch.Tensor of shape {valid}, got {type(g_t).__name__}")
    if tuple(g_t.shape) not in ((B, H), (B, H, K)):
        raise ValueError(f"{op}: g_t must have shape {valid}, got {list(g_t.shape)}")
    with torch.no_grad():
        gmax = g_t.max().item()
    if not gmax <= 0.0:  # catches NaN too
        raise ValueError(f"{op}: g_t is a log-space decay and must be <= 0 everywhere; got max(g_t) = {gmax}")


def gated_linear_attention_step_unchecked(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    g_t: torch.Tensor,
    state: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = diag(exp(g_t)) state + k_t v_t^T; o_t = h^T (scale q_t).

    q_t, k_t: [B, H, K]; v_t: [B, H, V]; g_t: [B, H] or [B, H, K]; state: [B, H, K, V] or
    None (zeros). Returns (o_t [B, H, V] in q_t's dtype, h [B, H, K, V] fp32/fp64).
    """
    acc = step_dtype(q_t)
    write = k_t.to(acc)[..., :, None] * v_t.to(acc)[..., None, :]
    if state is None:
        h = write
    else:
        decay = torch.exp(g_t.to(acc))
        decay = decay[..., None] if g_t.dim() == 3 else decay[..., None, None]
        h = decay * state.to(acc) + write
    o_t = torch.einsum("bhk,bhkv->bhv", q_t.to(acc) * scale, h)
    return o_t.to(q_t.dtype), h
