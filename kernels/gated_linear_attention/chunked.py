"""Gated linear attention, chunkwise-parallel PyTorch form (backend "torch"); autograd does the
backward.

Per chunk of C tokens with entering state S and chunk-local cumulative log-gates
gamma_i = g_1 + ... + g_i (docs/design.md §10):
    O  = (Q ⊙ e^gamma) S + intra-chunk term
    S' = e^{gamma_C} S + (K ⊙ e^{gamma_C - gamma})^T V
intra-chunk term, o_i = sum_{j<=i} (q_i ⊙ e^{gamma_i - gamma_j}) . k_j  v_j.

Exponents are sums of the gates over the token range they span, or differences of short
within-block sums of bounded size, never differences of two long cumulative sums: strongly
negative gates lose no precision, nothing overflows, and g = -inf gives no NaN.
- scalar gate: the C x C matrix of log-decays E_ij = g_{j+1} + ... + g_i is a cumulative sum
  down the rows of a masked copy of g;
- vector gate: a C x C x K tensor would be too large, and the factorisation
  (Q ⊙ e^gamma)(K ⊙ e^-gamma)^T overflows once a block's gates sum below about -88. So a
  block is factorised around its own midpoint only when its log-decay spread is at most
  SAFE_SPREAD (every factor within e^{±SAFE_SPREAD/2}); otherwise it is halved: the right
  half's attention to the left half goes through the boundary between them (both factors
  <= 1), and each half is handled the same way. Mild gates take one level; g = -20 per
  token recurses down to blocks of 4.
Decays below e^-80 are computed as e^-80 (see LOG_DECAY_FLOOR).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.common.checks import graph_capturing
from kernels.common.chunking import merge_chunks, split_chunks

# Largest within-block log-decay spread factorised directly: factors stay in e^{±30}, so even
# the masked-out (acausal) products, up to e^{60} |q||k|, are far from the fp32 limit e^{88}.
SAFE_SPREAD = 60.0
# Log-decays are clamped here before exp: exp is ~10x slower on very negative arguments, and
# e^-80 (a normal fp32 number) is as good as 0 next to the O(1) terms of every output.
LOG_DECAY_FLOOR = -80.0


def decay_of(log_decay: torch.Tensor) -> torch.Tensor:
    """exp(log_decay) for log_decay <= 0 (-inf allowed), values below e^-80 raised to e^-80."""
    return torch.exp(log_decay.clamp(min=LOG_DECAY_FLOOR))


def reverse_exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    """y_j = sum_{t > j} x_t along dim -2 of x: [..., C, D], built without subtraction
    (exact for -inf entries, no cancellation)."""
    inclusive = x.flip(-2).cumsum(dim=-2).flip(-2)
    return F.pad(inclusive[..., 1:, :], (0, 0, 0, 1))


def pairwise_log_decay(g: torch.Tensor) -> torch.Tensor:
    """Scalar gates g: [..., C] -> E: [..., C, C], E_ij = g_{j+1} + ... + g_i for i > j, else 0."""
    C = g.shape[-1]
    strictly_lower = torch.ones(C, C, dtype=torch.bool, device=g.device).tril(-1)
    gate_of_row = torch.where(strictly_lower, g[..., :, None], 0.0)  # entry (i, j) = g_i if i > j
    return gate_of_row.cumsum(dim=-2)


def _intra_scalar(qc, kc, vc, log_decay):
    """(Q K^T ⊙ Gamma) V for each chunk; log_decay: [..., C, C] from pairwise_log_decay."""
    C = qc.shape[-2]
    causal = torch.ones(C, C, dtype=torch.bool, device=qc.device).tril()
    decay = torch.where(causal, decay_of(log_decay), 0.0)
    return ((qc @ kc.transpose(-1, -2)) * decay) @ vc


def _intra_factorised(q, k, v, within):
    """Causal intra-block term for blocks whose log-decay spread is at most SAFE_SPREAD.

    within: [..., P, K], the cumulative log-gate of each block from its first token (see
    _intra_blocks). Each block is factorised around the midpoint of `within`.
    """
    # The result does not depend on the midpoint, so it needs no gradient.
    mid = (0.5 * within[..., -1:, :]).detach()
    scores = (q * torch.exp(within - mid)) @ (k * torch.exp(mid - within)).transpose(-1, -2)
    P = q.shape[-2]
    causal = torch.ones(P, P, dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~causal, 0.0) @ v


def _intra_blocks(q, k, v, g):
    """Causal intra-block term o_i = sum_{j<=i} (q_i ⊙ e^{gamma_i - gamma_j}) . k_j v_j.

    q, k, g: [..., P, K]; v: [..., P, V]; P a power of two. Returns [..., P, V].
    """
    P = q.shape[-2]
    if P == 1:
        return (q * k).sum(dim=-1, keepdim=True) * v
    # The first token's own gate decays nothing inside its block, so it is left out of the
    # sum: a huge g_1 then cannot eat the precision of the later, small gates.
    first_token = torch.arange(P, device=g.device)[:, None] == 0
    within = g.masked_fill(first_token, 0.0).cumsum(dim=-2)
    # The spread test reads the device; under CUDA-graph capture it cannot, and the split
    # (exact for any spread) serves every block.
    if not graph_capturing(g):
        with torch.no_grad():
            spread = (-within[..., -1, :]).max().item()  # inf (a -inf gate) fails the test below
        if spread <= SAFE_SPREAD:
            return _intra_factorised(q, k, v, within)

    half = P // 2
    lead = q.shape[:-2]
    qh, kh, vh, gh = (x.reshape(*lead, 2, half, x.shape[-1]) for x in (q, k, v, g))
    q_right, k_left, v_left = qh.unbind(-3)[1], kh.unbind(-3)[0], vh.unbind(-3)[0]
    g_left, g_right = gh.unbind(-3)
    # Right half attending to the left half, through the boundary r between them:
    # e^{gamma_i - r} e^{r - gamma_j}, both factors <= 1.
    q_from_boundary = q_right * decay_of(g_right.cumsum(dim=-2))
    k_to_boundary = k_left * decay_of(reverse_exclusive_cumsum(g_left))
    cross = (q_from_boundary @ k_to_boundary.transpose(-1, -2)) @ v_left
    inner_left, inner_right = _intra_blocks(qh, kh, vh, gh).unbind(-3)  # both halves as a batch dim
    return torch.cat([inner_left, inner_right + cross], dim=-2)


def _intra_vector(qc, kc, vc, gc):
    """Intra-chunk term for vector gates; pads the chunk to a power of two (zero q, k, g)."""
    C = qc.shape[-2]
    P = 1 << (C - 1).bit_length()
    if P != C:
        qc, kc, vc, gc = (F.pad(x, (0, 0, 0, P - C)) for x in (qc, kc, vc, gc))
    return _intra_blocks(qc, kc, vc, gc)[..., :C, :]


def _pass_states(chunk_decay, increments, initial_state):
    """States entering each chunk: S_{n+1} = chunk_decay_n ⊙ S_n + increments_n.

    chunk_decay: [B, H, N, K or 1]; increments: [B, H, N, K, V]. Returns the entering states
    [B, H, N, K, V] and the final state [B, H, K, V].
    """
    B, H, N, K, V = increments.shape
    state = increments.new_zeros(B, H, K, V) if initial_state is None else initial_state
    entering = []
    for n in range(N):
        entering.append(state)
        state = chunk_decay[:, :, n, :, None] * state + increments[:, :, n]
    return torch.stack(entering, dim=2), state


def gated_linear_attention_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked gated linear attention; any T >= 1.

    q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H] (scalar gate) or [B, T, H, K] (vector
    gate), log space <= 0; initial_state: [B, H, K, V] or None. Accumulates in fp32 (fp64
    for fp64 inputs). Returns o: [B, T, H, V] in q's dtype and the final state
    [B, H, K, V] (fp32, or fp64 for fp64 inputs; None unless output_final_state).
    """
    T = q.shape[1]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    C = min(chunk_size, T)  # a short sequence is one chunk, not one padded to 64 tokens
    qc = split_chunks(q.to(acc) * scale, C)  # [B, H, N, C, K]
    kc = split_chunks(k.to(acc), C)
    vc = split_chunks(v.to(acc), C)  # [B, H, N, C, V]
    gc = split_chunks(g.to(acc), C)  # [B, H, N, C] or [B, H, N, C, K]; padding g = 0 decays nothing

    # Chunk totals are sums, not the last cumulative entry: no backward through a select.
    if g.dim() == 4:
        o = _intra_vector(qc, kc, vc, gc)
        q_decayed = qc * decay_of(gc.cumsum(dim=-2))  # gamma_i: decay of the entering state
        k_decayed = kc * decay_of(reverse_exclusive_cumsum(gc))  # gamma_C - gamma_j
        chunk_decay = decay_of(gc.sum(dim=-2))  # [B, H, N, K]
    else:
        o = _intra_scalar(qc, kc, vc, pairwise_log_decay(gc))
        q_decayed = qc * decay_of(gc.cumsum(dim=-1))[..., None]
        k_decayed = kc * decay_of(reverse_exclusive_cumsum(gc[..., None]))
        chunk_decay = decay_of(gc.sum(dim=-1, keepdim=True))  # [B, H, N, 1]

    increments = k_decayed.transpose(-1, -2) @ vc  # [B, H, N, K, V]
    state0 = None if initial_state is None else initial_state.to(acc)
    entering, final = _pass_states(chunk_decay, increments, state0)
    o = o + q_decayed @ entering

    o = merge_chunks(o, T).to(q.dtype)
    return o, (final if output_final_state else None)
