"""Chunkwise-parallel gated delta rule in plain PyTorch (docs/design.md §10): backend "torch".

Per chunk of C tokens, with gamma the in-chunk cumulative log-gate, Gamma_ij =
exp(gamma_i - gamma_j) for i >= j (else 0) and S the state entering the chunk:

    A  = strictly-lower part of diag(beta) (K K^T ⊙ Gamma)
    U0 = (I + A)^{-1} diag(beta) V            W = (I + A)^{-1} diag(beta e^gamma) K
    U  = U0 - W S                              (pseudo-values)
    O  = diag(e^gamma) Q S + (Q K^T ⊙ Gamma) U
    S' = e^{gamma_C} S + (K ⊙ e^{gamma_C - gamma})^T U

Everything except S depends on its chunk alone, so it is computed for all chunks at once.
Expanding U in O and S' gives
    O  = (Gamma_QK U0) + (diag(e^gamma) Q - Gamma_QK W) S
    S' = (e^{gamma_C} I - Kd^T W) S + Kd^T U0,      Kd = K ⊙ e^{gamma_C - gamma},
so the only sequential work is one K x K by K x V product per chunk (the chunk's
transition applied to the state); the outputs of all chunks are then one batched product.
Gamma is built from segment sums of g (see `segment_sums`), and with g <= 0 no exponent is
ever positive, so nothing overflows.
"""

from __future__ import annotations

import torch

from kernels.common.chunking import merge_chunks, split_chunks


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """fp64 when any input is fp64, else fp32 (fp16/bf16 inputs accumulate in fp32)."""
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def segment_sums(g: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
    """log Gamma: [..., C] -> [..., C, C], entry (i, j) = g_{j+1} + ... + g_i for i >= j, -inf above.

    Summed segment by segment rather than as gamma_i - gamma_j: a difference of cumulative
    sums would cost precision when gates are very negative, and its gradient would be a
    difference of O(1) terms standing for a gate gradient of size e^g, which rounds to
    garbage. Here every gradient term carries its own decay factor.
    """
    C = g.shape[-1]
    below = causal.tril(-1)
    per_row = g.unsqueeze(-1).expand(*g.shape, C).masked_fill(~below, 0.0)  # (i, j) -> g_i if i > j
    # -inf above the diagonal, so exp gives 0 there without ever forming exp(positive).
    return per_row.cumsum(-2).masked_fill(~causal, float("-inf"))


def solve_unit_lower(a_mat: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """(I + strictly_lower(a_mat))^{-1} rhs by forward substitution: a_mat [..., C, C],
    rhs [..., C, R] -> [..., C, R]; the diagonal and upper part of a_mat are not read.

    An explicit inverse by block doubling (two batched products per level) takes 1 % off a
    compiled H200 training step, compiles slower and runs slower on the CPU
    (results/findings/mqar_step_variants_h200.json): the solve stays a substitution."""
    return torch.linalg.solve_triangular(a_mat, rhs, upper=False, unitriangular=True)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule, chunkwise; arguments are assumed valid (the public op checks them).

    q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H] log-gates or None (DeltaNet);
    beta: [B, T, H]; initial_state: [B, H, K, V] or None.
    Returns o: [B, T, H, V] in `out_dtype` (default q.dtype) and, if asked, the final
    state [B, H, K, V] in the accumulation dtype (fp32, or fp64 for fp64 inputs).
    Keys need not be unit norm; the recurrence is stable when 0 <= beta ||k||^2 <= 2.
    Nothing is checked here: linearized_softmax_gdn calls this directly with its
    position-dependent gates and takes the output in the accumulation dtype (out_dtype).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    dt = compute_dtype(q, k, v, g, beta, initial_state)
    C = min(chunk_size, T)  # a short sequence needs no padding to a full chunk
    dev = q.device

    qc = split_chunks(q.to(dt) * scale, C)  # [B, H, N, C, K]
    kc = split_chunks(k.to(dt), C)
    vc = split_chunks(v.to(dt), C)  # [B, H, N, C, V]
    bc = split_chunks(beta.to(dt), C)  # [B, H, N, C]; padded tokens get beta = 0: they write nothing
    causal = torch.ones(C, C, dtype=torch.bool, device=dev).tril()
    if g is None:
        gamma = None
        decay_mat = causal.to(dt)  # Gamma without gates: the causal mask
    else:
        gc = split_chunks(g.to(dt), C)  # [B, H, N, C]; padded tokens get g = 0: state passes unchanged
        gamma = gc.cumsum(-1)
        decay_mat = segment_sums(gc, causal).exp()  # Gamma: [B, H, N, C, C]

    kb = kc * bc.unsqueeze(-1)  # diag(beta) K
    # A = diag(beta) (K K^T ⊙ Gamma); the solve below reads only its strictly-lower part
    # (it takes the diagonal as ones), so no tril or identity is needed.
    a_mat = (kb @ kc.transpose(-1, -2)) * decay_mat
    decay_in = None if gamma is None else gamma.exp()  # e^{gamma_i}: chunk start -> token i
    kw = kb if decay_in is None else kb * decay_in.unsqueeze(-1)
    rhs = torch.cat([vc * bc.unsqueeze(-1), kw], dim=-1)
    # The unit lower-triangular I + A solved for the V and K columns at once.
    solved = solve_unit_lower(a_mat, rhs)
    # solved = [U0 | W]: U0 = (I + A)^{-1} diag(beta) V, W = (I + A)^{-1} diag(beta e^gamma) K

    attn = (qc @ kc.transpose(-1, -2)) * decay_mat  # Q K^T ⊙ Gamma, diagonal included
    attn_solved = attn @ solved  # [Gamma_QK U0 | Gamma_QK W] in one product
    out_intra = attn_solved[..., :V]  # [.., C, V]
    q_in = qc if decay_in is None else qc * decay_in.unsqueeze(-1)
    q_state = q_in - attn_solved[..., V:]  # what multiplies S in O: [.., C, K]
    if gamma is None:
        k_decayed_t = kc.transpose(-1, -2)
    else:
        # K ⊙ e^{gamma_C - gamma}: the decay from token j to the chunk end is Gamma's last row.
        k_decayed_t = (kc * decay_mat[..., -1, :].unsqueeze(-1)).transpose(-1, -2)
    k_solved = k_decayed_t @ solved  # [Kd^T U0 | Kd^T W]: [B, H, N, K, V + K]
    write = k_solved[..., :V]
    # The chunk's transition e^{gamma_C} I - Kd^T W: the product of its per-token maps.
    eye_k = torch.eye(K, dtype=dt, device=dev)
    carry = eye_k if gamma is None else gamma[..., -1:].exp().unsqueeze(-1) * eye_k
    transition = carry - k_solved[..., V:]  # [B, H, N, K, K]

    if initial_state is None:
        state = torch.zeros(B, H, K, V, dtype=dt, device=dev)
    else:
        state = initial_state.to(dt)
    entering = []
    for n in range(qc.shape[2]):
        entering.append(state)
        state = torch.baddbmm(
            write[:, :, n].reshape(B * H, K, V),
            transition[:, :, n].reshape(B * H, K, K),
            state.reshape(B * H, K, V),
        ).view(B, H, K, V)
    states = torch.stack(entering, dim=2)  # [B, H, N, K, V]: the state entering each chunk

    o = out_intra + q_state @ states
    o = merge_chunks(o, T).to(out_dtype or q.dtype)
    return o, (state if output_final_state else None)
