"""row_prefix_sums (kernels/common/triton/prefix.py) on the interpreter: a tile's sums down
its rows, forward and reversed, by tl.cumsum and by products with triangular ones (16-bit
tiles as they are, fp32 tiles in two bf16 parts), against fp64 sums of the same values."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernels.common.triton.prefix import row_prefix_sums


@triton.jit
def _prefix_kernel(x, out, BR: tl.constexpr, BC: tl.constexpr, BY_DOT: tl.constexpr, REVERSE: tl.constexpr):
    o_r, o_c = tl.arange(0, BR), tl.arange(0, BC)
    b_x = tl.load(x + o_r[:, None] * BC + o_c[None, :])
    tl.store(out + o_r[:, None] * BC + o_c[None, :], row_prefix_sums(b_x, BR, BY_DOT, REVERSE))


def prefix_sums(x: torch.Tensor, by_dot: bool, reverse: bool) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=torch.float32)
    _prefix_kernel[(1,)](x, out, BR=x.shape[0], BC=x.shape[1], BY_DOT=by_dot, REVERSE=reverse)
    return out


def exact(x: torch.Tensor, reverse: bool) -> torch.Tensor:
    x = x.double()
    return x.flip(0).cumsum(0).flip(0) if reverse else x.cumsum(0)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("by_dot", [False, True])
def test_fp16_tile(by_dot, reverse):
    """16-bit terms go in exactly either way: only fp32 summation order differs."""
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1)).half()
    err = (prefix_sums(x, by_dot, reverse).double() - exact(x, reverse)).abs().max()
    assert err < 64 * 2**-24 * exact(x.abs(), reverse).max()


@pytest.mark.parametrize("reverse", [False, True])
def test_fp32_tile_in_two_bf16_parts(bf16_dots, reverse):
    """Each fp32 term enters as hi + lo, both bf16, over fp32's range (columns scaled from
    1e-30 to 1e30): within 2^-14 of it, as the interpreter's conversion to bf16 truncates
    (a GPU's rounds to nearest: 2^-17; tests/gpu checks the sums' users there)."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(64, 16, generator=gen) * torch.logspace(-30, 30, 16)[None, :]
    ours = prefix_sums(x, True, reverse).double()
    bound = 2**-14 * exact(x.abs(), reverse) + 64 * 2**-24 * exact(x.abs(), reverse)
    assert ((ours - exact(x, reverse)).abs() <= bound).all()
    # the scan agrees to fp32 rounding: the split is what the bound is about
    assert ((prefix_sums(x, False, reverse).double() - exact(x, reverse)).abs() <= 64 * 2**-24
            * exact(x.abs(), reverse)).all()


def test_bf16_dots_without_the_fixture_are_wrong_on_the_interpreter():
    """Why bf16_dots exists: without it the interpreter's bf16 product is far off."""
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(3))
    err = (prefix_sums(x, True, False).double() - exact(x, False)).abs().max()
    assert not err < 1e-2 * exact(x.abs(), False).max()
