"""The per-token linear systems of a MesaNet chunk, applied without building them (docs/design.md §10).

Inside a chunk of C tokens with cumulative log-gate gamma_i = g_1 + ... + g_i, the matrix
that token i must invert is

    M_i = e^{gamma_i} H0 + sum_{j <= i} Gamma_ij beta_j k_j k_j^T + diag(lamb),
    Gamma_ij = exp(gamma_i - gamma_j) for i >= j, else 0,

with H0 the H_kk entering the chunk. Materialising every M_i costs C K^2 memory per chunk;
instead one mat-vec for all tokens of a chunk at once (one vector per token, as rows of P) is

    P -> diag(e^gamma) P H0 + ((P K^T) ⊙ Gamma diag(beta)) K + P diag(lamb),

two C x C x K matmuls and one C x K x K matmul.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.mesa.state import MesaState


def intra_chunk_decay(g: torch.Tensor) -> torch.Tensor:
    """Gamma [..., C, C] from per-token log-gates g [..., C]: exp(g_{j+1} + ... + g_i) on and
    below the diagonal, 0 above.

    The exponent is summed over the segment itself rather than formed as gamma_i - gamma_j:
    the difference of two large cumulative sums loses digits (|gamma| ~ 100 leaves fp32
    ~1e-5 absolute), and through it every diagonal entry (= 1) would send equal and
    opposite gradients to g that cancel only up to rounding. Masking before exp keeps
    exponents <= 0 (no overflow).
    """
    C = g.shape[-1]
    ones = torch.ones(C, C, dtype=torch.bool, device=g.device)
    terms = g[..., :, None].expand(*g.shape, C)  # terms[..., s, j] = g_s
    terms = terms.masked_fill(~ones.tril(-1), 0.0)  # keep s > j
    segment = terms.cumsum(-2)  # segment[..., i, j] = sum_{j < s <= i} g_s
    return segment.masked_fill(~ones.tril(), -math.inf).exp()


def decay_to_chunk_end(g: torch.Tensor) -> torch.Tensor:
    """exp(g_{j+1} + ... + g_C) for every token j of a chunk: g [..., C] -> [..., C]
    (a reverse cumulative sum of the later gates, no subtraction)."""
    later = torch.cat([g[..., 1:], torch.zeros_like(g[..., :1])], dim=-1)
    return later.flip(-1).cumsum(-1).flip(-1).exp()


@dataclass(frozen=True)
class ChunkSystem:
    """M_i for every token i of every chunk, held implicitly.

    decay: [B, H, N, C] e^{gamma_i};  h0: [B, H, N, K, K] H_kk entering each chunk;
    keys: [B, H, N, C, K];  gamma_beta: [B, H, N, C, C] Gamma_ij beta_j;  lamb: [H, K].
    """

    decay: torch.Tensor
    h0: torch.Tensor
    keys: torch.Tensor
    gamma_beta: torch.Tensor
    lamb: torch.Tensor

    def matvec(self, p: torch.Tensor) -> torch.Tensor:
        """Rows of p [B, H, N, C, K] -> rows M_i p_i. Uses H0^T so that the gradient of
        y^T M x with respect to H0 is y x^T as for an explicit matrix (H0 is symmetric,
        the values are the same)."""
        from_state = self.decay[..., None] * (p @ self.h0.transpose(-1, -2))
        within_chunk = ((p @ self.keys.transpose(-1, -2)) * self.gamma_beta) @ self.keys
        return from_state + within_chunk + p * self.lamb[:, None, None, :]

    def diagonal(self) -> torch.Tensor:
        """diag(M_i) for every token: [B, H, N, C, K], by the same gated cumulative sum."""
        h0_diag = self.h0.diagonal(dim1=-2, dim2=-1)  # [B, H, N, K]
        return (
            self.decay[..., None] * h0_diag[..., None, :]
            + self.gamma_beta @ (self.keys * self.keys)
            + self.lamb[:, None, None, :]
        )

    def jacobi_start(self, b: torch.Tensor) -> torch.Tensor:
        """The CG starting point b / diag(M) (docs/design.md §8)."""
        return b / self.diagonal()

    def bilinear_grads(self, y: torch.Tensor, x: torch.Tensor, wanted: tuple[bool, ...]) -> list[torch.Tensor | None]:
        """Gradients of s = sum_i y_i^T M_i x_i with respect to (decay, h0, keys, gamma_beta,
        lamb), each one only where `wanted` says so (None otherwise); y, x: [B, H, N, C, K].

        In closed form, so that a backward using it holds no nested autograd call (which
        torch.compile cannot trace). With A = Y K^T and X K^T per chunk:
            ds/d decay_i = y_i^T H0 x_i,      ds/dH0 = sum_i decay_i y_i x_i^T,
            ds/d GammaBeta = A ⊙ (X K^T),     ds/dk_j = sum_i GammaBeta_ij (A_ij x_i + (X K^T)_ij y_i),
            ds/d lamb = sum over batch, chunks and tokens of y ⊙ x.
        """
        want_decay, want_h0, want_keys, want_gb, want_lamb = wanted
        grads: list[torch.Tensor | None] = [None] * 5
        if want_decay:
            grads[0] = ((x @ self.h0.transpose(-1, -2)) * y).sum(-1)
        if want_h0:
            grads[1] = (y * self.decay[..., None]).transpose(-1, -2) @ x
        if want_keys or want_gb:
            y_keys = y @ self.keys.transpose(-1, -2)  # [B, H, N, C, C]
            x_keys = x @ self.keys.transpose(-1, -2)
            if want_gb:
                grads[3] = y_keys * x_keys
            if want_keys:
                grads[2] = ((self.gamma_beta * y_keys).transpose(-1, -2) @ x
                            + (self.gamma_beta * x_keys).transpose(-1, -2) @ y)
        if want_lamb:
            grads[4] = (y * x).sum(dim=(0, 2, 3))
        return grads


def build_system(
    keys: torch.Tensor, beta: torch.Tensor, g: torch.Tensor, lamb: torch.Tensor, h0: torch.Tensor
) -> ChunkSystem:
    """keys [B, H, N, C, K], beta and log-gates g [B, H, N, C], lamb [H, K], h0 [B, H, N, K, K]."""
    gamma_beta = intra_chunk_decay(g) * beta[..., None, :]
    return ChunkSystem(g.cumsum(-1).exp(), h0, keys, gamma_beta, lamb)


def chunk_start_states(
    keys: torch.Tensor,
    values: torch.Tensor | None,
    beta: torch.Tensor,
    g: torch.Tensor,
    initial: MesaState | None,
) -> tuple[torch.Tensor, torch.Tensor | None, MesaState]:
    """H_kk (and H_kv) entering every chunk, and the state after the last one.

    keys [B, H, N, C, K], values [B, H, N, C, V] or None, beta and log-gates g [B, H, N, C];
    initial: MesaState or None for zeros (its h_kv is ignored without values). Returns h_kk [B, H, N, K, K],
    h_kv [B, H, N, K, V] (None without values) and the final MesaState (h_kv None without
    values). The per-chunk contributions are computed for all chunks at once; only the
    K x K (K x V) states pass from chunk to chunk. Differentiable.
    """
    B, H, N, C, K = keys.shape
    weight_to_end = beta * decay_to_chunk_end(g)  # beta_j e^{gamma_C - gamma_j}
    weighted_keys_t = (keys * weight_to_end[..., None]).transpose(-1, -2)  # [B, H, N, K, C]
    add_kk = weighted_keys_t @ keys
    add_kv = weighted_keys_t @ values if values is not None else None
    chunk_decay = g.sum(-1).exp()[..., None, None]  # e^{gamma_C}: [B, H, N, 1, 1]
    if initial is None:
        h_kk = keys.new_zeros(B, H, K, K)
        h_kv = values.new_zeros(B, H, K, values.shape[-1]) if values is not None else None
    else:
        h_kk = initial.h_kk.to(keys.dtype)
        h_kv = initial.h_kv.to(keys.dtype) if values is not None else None
    starts_kk, starts_kv = [], []
    for n in range(N):
        starts_kk.append(h_kk)
        h_kk = chunk_decay[:, :, n] * h_kk + add_kk[:, :, n]
        if add_kv is not None:
            starts_kv.append(h_kv)
            h_kv = chunk_decay[:, :, n] * h_kv + add_kv[:, :, n]
    kv = torch.stack(starts_kv, dim=2) if add_kv is not None else None
    return torch.stack(starts_kk, dim=2), kv, MesaState(h_kk, h_kv if add_kv is not None else None)
