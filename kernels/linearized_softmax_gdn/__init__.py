"""Linearized softmax attention as a gated delta rule (docs/design.md §7), and its VaLA baseline:
the public ops; their checks and backends are in spec.py."""

from __future__ import annotations

import torch

from kernels.common.spec import dispatch
from kernels.linearized_softmax_gdn.spec import SPEC, VALA_SPEC
from kernels.linearized_softmax_gdn.state import LinGDNState
from kernels.linearized_softmax_gdn.step import linearized_softmax_gdn_step

__all__ = ["LinGDNState", "linearized_softmax_gdn", "linearized_softmax_gdn_step", "vala_attention"]


def linearized_softmax_gdn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    initial_state: LinGDNState | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
    chunk_size: int = 64,
    check_values: bool = True,
) -> tuple[torch.Tensor, LinGDNState | None]:
    """Softmax attention linearized into a gated delta rule (docs/design.md §7, seed 000):

        kbar_t, vbar_t = running means of k, v (vbar_0 = 0)
        u_t = k_t - kbar_t,  w_t = v_t - vbar_{t-1}
        h_t = ((1 - 1/t) I - (1/t) u_t u_t^T) h_{t-1} + (1/t) u_t w_t^T
        o_t = h_t^T (scale q_t) + vbar_t

    q, k: [B, T, H, K]; v: [B, T, H, V]; scale defaults to K ** -0.5 (it scales q only:
    the keys enter unscaled, as in §7). initial_state: LinGDNState(h, k_sum, v_sum, count)
    continuing a previous call (count = tokens already seen; count 0 means empty).
    Returns o: [B, T, H, V] in the input dtype and, when output_final_state, the
    LinGDNState after the last token (fp32 tensors, fp64 for fp64 inputs), else None.

    No trained gates: a softmax model's q, k, v can be fed as they are. Stability: the
    transition is (1 - 1/t)(I - beta_t u_t u_t^T) with beta_t = 1/(t - 1); it is a
    contraction iff ||k_t - kbar_t||^2 <= 2 (t - 1). Raw keys of norm well above 1 break
    this for the first tokens and the state grows there (a caller may split the logit scale
    symmetrically: q * scale ** 0.5 and k * scale ** 0.5 with scale=1).

    backend: "auto" (triton on CUDA, torch elsewhere), "reference" (the §7 loop), "torch"
    (the chunked gated delta rule after preprocessing) or "triton".

    check_values: accepted so that every op takes it; this op has no values to check (its
    shape, dtype and device checks read no data).
    """
    return dispatch(
        SPEC, backend, check_values, q=q, k=k, v=v, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, chunk_size=chunk_size,
    )


def vala_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, None]:
    """VaLA: o_t = vbar_t + ((1/t) sum_{i<=t} k_i v_i^T - kbar_t vbar_t^T)^T (scale q_t).

    q, k: [B, T, H, K]; v: [B, T, H, V]; scale defaults to K ** -0.5. Returns
    (o [B, T, H, V] in the input dtype, None). backend: "auto" (= "torch", on any device),
    "reference" or "torch"; there is no Triton kernel for it.
    """
    return dispatch(VALA_SPEC, backend, q=q, k=k, v=v, scale=scale)
