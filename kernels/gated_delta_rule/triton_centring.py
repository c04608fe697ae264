"""Keys and values centred on their running means inside the delta rule's kernels (the
linearized softmax GDN's preprocessing, docs/design.md §7): the WY kernel centres the rows
of k and v it loads, so no separate pass writes the centred tensors and reads them back.

At 0-based token i of a sequence, in chunk n = i // 64, with x_i a key or value row:
    centred_i = x_i - (enter[n] + x_{64 n} + ... + x_i) / (count + i + 1)
where enter[n] is the sum of every row before the chunk plus the state's own sum (count
tokens). The chunk's own cumulative sum is formed in the kernel (tl.cumsum, fp32) from the
tile it loads anyway; rows past T are zero, as the materialised tensor would load them.
`running_mean` is the arithmetic both this centring and the output's running mean of v
(triton_fwd.RunningMean) use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.common.launch import WyFwdLaunch


@dataclass(frozen=True)
class Centring:
    """k_enter [B, H, cdiv(T, 64), K], v_enter [B, H, cdiv(T, 64), V] fp32 contiguous: the
    sums entering each 64-token chunk; count: tokens before the first (the state's); launch:
    the WY kernel's settings while it centres (its fp32 tiles want narrower blocks)."""

    k_enter: torch.Tensor
    v_enter: torch.Tensor
    count: int
    launch: WyFwdLaunch

    def check(self, NT: int, K: int, V: int, where: str) -> None:
        """A ValueError unless the entering sums match NT chunks of K- and V-wide rows."""
        for name, x, d in (("k_enter", self.k_enter, K), ("v_enter", self.v_enter, V)):
            if x.dim() != 4 or x.shape[2:] != (NT, d) or x.dtype != torch.float32 or not x.is_contiguous():
                raise ValueError(f"{where}: {name} must be [B, H, {NT}, {d}] fp32 contiguous, "
                                 f"got {tuple(x.shape)} {x.dtype}")


@triton.jit
def load_enter(enter, i_bh, i_t, NT, col0, D: tl.constexpr, BC: tl.constexpr):
    """Columns col0 .. col0 + BC - 1 of the sum entering chunk i_t of sequence i_bh: [BC] fp32."""
    o_c = col0 + tl.arange(0, BC)
    return tl.load(enter + (i_bh * NT + i_t).to(tl.int64) * D + o_c, mask=o_c < D, other=0.0)


@triton.jit
def running_mean(b_x, b_before, row0, count, BR: tl.constexpr):
    """b_x: rows row0 .. row0 + BR - 1 of x ([BR, BC] fp32); b_before [BC] fp32: the sum of
    every row before row0. Returns their running means [BR, BC] fp32, row i's
    (b_before + x_row0 + ... + x_i) / (count + i + 1)."""
    b_inv_t = 1.0 / (count + 1 + row0 + tl.arange(0, BR)).to(tl.float32)
    return (tl.cumsum(b_x, axis=0) + b_before[None, :]) * b_inv_t[:, None]


@triton.jit
def centre_rows(b_x, b_carry, row0, T, count, BR: tl.constexpr):
    """b_x: rows row0 .. row0 + BR - 1 of x ([BR, BC]); b_carry [BC] fp32: the sum of every
    row before row0. Returns (the rows centred, fp32, zero past T; b_carry plus their sum)."""
    b_x = b_x.to(tl.float32)
    b_c = b_x - running_mean(b_x, b_carry, row0, count, BR)
    return tl.where((row0 + tl.arange(0, BR) < T)[:, None], b_c, 0.0), b_carry + tl.sum(b_x, axis=0)


def centring_args(centring: Centring | None, stand_in: torch.Tensor, NT: int, K: int, V: int, where: str):
    """(k_enter, v_enter, count) for a kernel launch, checked against NT chunks."""
    if centring is None:  # a stand-in, never read
        return stand_in, stand_in, 0
    centring.check(NT, K, V, where)
    return centring.k_enter, centring.v_enter, centring.count

