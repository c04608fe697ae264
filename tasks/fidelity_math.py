"""The formulas of the fidelity task: the gate-free ops it compares with causal softmax
attention, the "exact RNN" form with a first-order diagonal (seed 000), and the error metric.

Softmax attention for one query q (q' = scale q) is an exact RNN over the keys (seed 000):

    o_j(q) = o_{j-1}(q) + a_jj(q) (v_j - o_{j-1}(q)),   a_jj(q) = exp(q'.k_j) / sum_{i<=j} exp(q'.k_i)

Unrolled, the weight of v_i in o_t is a_ii prod_{j=i+1..t} (1 - a_jj): the off-diagonal
weights are products of diagonal ones. The seed approximates only the diagonal to first
order, a_jj(q) ~ (1/j) (1 + q'.(k_j - kbar_j)) with kbar_j = mean(k_1..k_j), and keeps the
exact q-dependent recursion; products of first-order factors keep cross terms that a
first-order expansion of every weight (VaLA) drops. That form still needs one recursion
per query (quadratic cost); the GDN form of docs/design.md §7 then replaces the leftover q by
q* = k_t - kbar_t to make it linear. `diag_rnn_attention` computes the quadratic form, so
the fidelity task can separate the error of the diagonal expansion from that of q -> q*.

All functions take q, k: [B, T, H, K], v: [B, T, H, V] (the op layout) and compute in fp64.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from kernels import (
    linear_attention,
    linearized_softmax_gdn,
    softmax_attention,
    vala_attention,
)

OpFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "float | None", str], torch.Tensor]


def _heads_first(t: torch.Tensor) -> torch.Tensor:
    """[B, T, H, D] -> fp64 [B, H, T, D]."""
    return t.double().transpose(1, 2)


def _scaled_query(q: torch.Tensor, scale: float | None) -> torch.Tensor:
    """q' = scale q (default scale K ** -0.5) as fp64 [B, H, T, K]."""
    return _heads_first(q) * (q.shape[-1] ** -0.5 if scale is None else scale)


def _centred_keys(kh: torch.Tensor) -> torch.Tensor:
    """k_j - kbar_j with kbar_j = mean(k_1..k_j); kh: [B, H, T, K]."""
    count = torch.arange(1, kh.shape[2] + 1, dtype=kh.dtype, device=kh.device)
    return kh - kh.cumsum(2) / count[:, None]


def first_order_diagonal(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """D[b, h, s, j] = (1/j) (1 + q'_s . (k_j - kbar_j)) for j <= s, 0 above the diagonal.

    q, k: [B, T, H, K] -> D: [B, H, T, T] fp64 (row s: query s, column j: key j, 1-based j)."""
    qs, kh = _scaled_query(q, scale), _heads_first(k)
    T = kh.shape[2]
    count = torch.arange(1, T + 1, dtype=torch.float64, device=kh.device)
    diag = (1.0 + qs @ _centred_keys(kh).transpose(-1, -2)) / count  # [B, H, s, j]
    return diag * torch.ones(T, T, dtype=torch.bool, device=kh.device).tril()


def exact_diagonal(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """D[b, h, s, j] = a_jj(q_s) = exp(q'_s.k_j) / sum_{i<=j} exp(q'_s.k_i) for j <= s, else 0.

    q, k: [B, T, H, K] -> D: [B, H, T, T] fp64."""
    qs, kh = _scaled_query(q, scale), _heads_first(k)
    logits = qs @ kh.transpose(-1, -2)
    diag = torch.exp(logits - torch.logcumsumexp(logits, dim=-1))
    T = kh.shape[2]
    return diag * torch.ones(T, T, dtype=torch.bool, device=kh.device).tril()


def weights_from_diagonal(diag: torch.Tensor) -> torch.Tensor:
    """Attention weights W[s, i] = D[s, i] prod_{j=i+1..s} (1 - D[s, j]) of the RNN
    o_j = o_{j-1} + D[s, j] (v_j - o_{j-1}), o_0 = 0, run for query s up to key s.

    diag: [..., S, T] with zeros above each row's last key -> W: [..., S, T]."""
    # prod_{j>i} (1 - D_j): a reversed exclusive cumulative product (zeros past the row's
    # last key give factors of 1). Products, not log-sums: factors may be <= 0.
    keep = torch.flip(torch.cumprod(torch.flip(1.0 - diag, [-1]), dim=-1), [-1])
    after = torch.cat([keep[..., 1:], torch.ones_like(keep[..., :1])], dim=-1)
    return diag * after


def diag_rnn_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                       row_block: int = 256) -> torch.Tensor:
    """The exact softmax RNN with first-order diagonal weights (seed 000), per query.

    q, k: [B, T, H, K], v: [B, T, H, V] -> o: [B, T, H, V] fp64. Quadratic in T; query rows
    are processed `row_block` at a time so memory stays O(row_block * T)."""
    qs, kh, vh = _scaled_query(q, scale), _heads_first(k), _heads_first(v)
    T = kh.shape[2]
    count = torch.arange(1, T + 1, dtype=torch.float64, device=kh.device)
    centred = _centred_keys(kh)
    out = []
    for start in range(0, T, row_block):
        stop = min(T, start + row_block)
        # keys after the block's last query never count: cut the columns there
        diag = (1.0 + qs[:, :, start:stop] @ centred[:, :, :stop].transpose(-1, -2)) / count[:stop]
        causal = torch.arange(start, stop, device=kh.device)[:, None] >= torch.arange(stop, device=kh.device)
        out.append(weights_from_diagonal(diag * causal) @ vh[:, :, :stop])
    return torch.cat(out, dim=2).transpose(1, 2)


def prefix_rel_err(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """err[t] = ||out[:, :t+1] - ref[:, :t+1]|| / ||ref[:, :t+1]|| over all B, H, V.

    out, ref: [B, T, H, V] -> [T] fp64. For a causal op this is the relative error of the
    whole output at sequence length t + 1, so one run at T_max gives every shorter T."""
    diff = (out.double() - ref.double()).pow(2).sum(dim=(0, 2, 3)).cumsum(0)
    norm = ref.double().pow(2).sum(dim=(0, 2, 3)).cumsum(0)
    return (diff / norm).sqrt()


def gaussian_qkv(batch: int, seq_len: int, heads: int, head_dim: int, logit_std: float,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gaussian q', k, v (fp64, [B, T, H, D]) for use with scale=1.

    q' and k are drawn from one distribution (the seed assumes ||q'|| ~ ||k||), entries
    N(0, logit_std / sqrt(D)), so the logits q'.k have standard deviation logit_std; v ~ N(0, 1)."""
    std = (logit_std / head_dim**0.5) ** 0.5
    shape = (batch, seq_len, heads, head_dim)
    q = torch.randn(shape, generator=generator, dtype=torch.float64) * std
    k = torch.randn(shape, generator=generator, dtype=torch.float64) * std
    v = torch.randn(shape, generator=generator, dtype=torch.float64)
    return q, k, v


# -- the ops compared (each: (q, k, v, scale, backend) -> o [B, T, H, V]) ------------------

def softmax_op(q, k, v, scale, backend):
    """Causal softmax attention: the ground truth."""
    return softmax_attention(q, k, v, scale=scale, backend=backend)[0]


def lin_gdn_op(q, k, v, scale, backend):
    """Linearized softmax as a gated delta rule (docs/design.md §7)."""
    return linearized_softmax_gdn(q, k, v, scale=scale, backend=backend)[0]


def balance_factor(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """c [H] with mean ||c q'|| = mean ||k / c|| over all tokens: c = sqrt(mean||k|| / mean||q'||).

    (q', k) -> (c q', k / c) leaves every logit q'.k, softmax, VaLA and diag_rnn unchanged,
    but not the GDN form, whose decay (1 - 1/t) I - (1/t) u u^T uses ||k - kbar||^2 alone:
    the seed's q* = k_t - kbar_t assumes ||q'|| ~ ||k||, and this rescale makes it hold."""
    q_norm = _scaled_query(q, scale).norm(dim=-1).mean(dim=(0, 2))
    k_norm = _heads_first(k).norm(dim=-1).mean(dim=(0, 2))
    return (k_norm / q_norm.clamp_min(1e-30)).sqrt()


def lin_gdn_balanced_op(q, k, v, scale, backend, factor: torch.Tensor | None = None):
    """The GDN form on (c q, k / c), c = balance_factor(q, k) per head unless given."""
    c = (balance_factor(q, k, scale) if factor is None else factor).view(1, 1, -1, 1).to(q.dtype)
    return lin_gdn_op(q * c, k / c, v, scale, backend)


def vala_op(q, k, v, scale, backend):
    """First-order ("vanilla") linearisation of every softmax weight (docs/design.md §7)."""
    return vala_attention(q, k, v, scale=scale, backend=backend)[0]


def diag_rnn_op(q, k, v, scale, backend):
    """The quadratic reference form: exact recursion, first-order diagonal (no backends)."""
    return diag_rnn_attention(q, k, v, scale)


def linear_elu1_op(q, k, v, scale, backend):
    """Normalised linear attention with phi = elu + 1 on the raw q, k (the `linear` mixer's
    default); the normaliser phi(q).sum(phi(k)) comes from a ones column appended to v, and
    the scale cancels in the ratio."""
    phi_q, phi_k = F.elu(q) + 1.0, F.elu(k) + 1.0
    ones = torch.ones_like(v[..., :1])
    o = linear_attention(phi_q, phi_k, torch.cat([v, ones], dim=-1), scale=1.0, backend=backend)[0]
    return o[..., :-1] / o[..., -1:]


def linear_raw_op(q, k, v, scale, backend):
    """Unnormalised linear attention, identity feature map: o_t = sum_{i<=t} (q'_t.k_i) v_i."""
    return linear_attention(q, k, v, scale=scale, backend=backend)[0]


OPS: dict[str, OpFn] = {
    "lin_gdn": lin_gdn_op,
    "vala": vala_op,
    "diag_rnn": diag_rnn_op,
    "lin_gdn_bal": lin_gdn_balanced_op,
    "linear_elu1": linear_elu1_op,
    "linear_raw": linear_raw_op,
}
