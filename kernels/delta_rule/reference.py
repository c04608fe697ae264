"""DeltaNet, one token at a time (docs/design.md §3): the ground truth for tests.

    h_t = (I - beta_t k_t k_t^T) h_{t-1} + beta_t k_t v_t^T,    o_t = h_t^T (scale q_t)

Written on its own (not through the gated reference) so the two check each other.
"""

from __future__ import annotations

import torch


def delta_rule_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token delta rule; differentiable; arguments assumed valid.

    q, k: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H]; initial_state: [B, H, K, V].
    Computes in `dtype` (default: fp64 for fp64 inputs, else fp32). Returns o [B, T, H, V]
    (in `dtype` when given, else q.dtype) and, if asked, the final state [B, H, K, V] in
    the compute dtype.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    dt = dtype or (torch.float64 if q.dtype == torch.float64 else torch.float32)
    qs, ks, vs, bs = q.to(dt) * scale, k.to(dt), v.to(dt), beta.to(dt)
    h = torch.zeros(B, H, K, V, dtype=dt, device=q.device) if initial_state is None else initial_state.to(dt)
    outs = []
    for t in range(T):
        k_t = ks[:, t]
        error = vs[:, t] - torch.einsum("bhk,bhkv->bhv", k_t, h)  # new value minus h's recall of k_t
        h = h + bs[:, t, :, None, None] * k_t.unsqueeze(-1) * error.unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", qs[:, t], h))
    o = torch.stack(outs, dim=1).to(dtype or q.dtype)
    return o, (h if output_final_state else None)
