"""causal_depthwise_conv (the shift-and-add form ShortConv and BaseConv run) against
torch's depthwise nn.Conv1d on fresh random inputs: values and gradients, widths 1-5,
sequences shorter than the width, with and without bias."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mixers.base import ShortConv, causal_depthwise_conv
from tasks.common.base_conv import BaseConv


def _conv1d_reference(x, weight, bias):
    T, W = x.shape[1], weight.shape[-1]
    return F.conv1d(x.transpose(1, 2), weight, bias, padding=W - 1, groups=x.shape[-1])[..., :T].transpose(1, 2)


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("T", [1, 2, 7, 33])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_conv1d_values_and_grads(width, T, with_bias):
    gen = torch.Generator().manual_seed(1000 * width + 10 * T + with_bias)
    B, D = 3, 6
    x = torch.randn(B, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(D, 1, width, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(D, generator=gen, dtype=torch.float64, requires_grad=True) if with_bias else None
    up = torch.randn(B, T, D, generator=gen, dtype=torch.float64)
    got = causal_depthwise_conv(x, weight, bias)
    want = _conv1d_reference(x, weight, bias)
    assert got.shape == (B, T, D)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    inputs = [x, weight] + ([bias] if with_bias else [])
    g_got = torch.autograd.grad((got * up).sum(), inputs)
    g_want = torch.autograd.grad((want * up).sum(), inputs)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_causal():
    """An input at time s changes no output before s."""
    conv = ShortConv(4, 4).double()
    x = torch.randn(2, 10, 4, dtype=torch.float64)
    y = conv(x)
    x2 = x.clone()
    x2[:, 6] += 1.0
    y2 = conv(x2)
    torch.testing.assert_close(y[:, :6], y2[:, :6], rtol=0, atol=0)
    assert (y[:, 6] - y2[:, 6]).abs().max() > 0


@pytest.mark.parametrize("module", ["short", "base"])
def test_step_continues_forward(module):
    """Token-by-token steps from an empty cache give the whole-sequence forward's outputs."""
    torch.manual_seed(3)
    layer = (ShortConv(5, 3) if module == "short" else BaseConv(5, 3)).double()
    x = torch.randn(2, 9, 5, dtype=torch.float64)
    whole = layer(x)
    cache, outs = None, []
    for t in range(x.shape[1]):
        y_t, cache = layer.step(x[:, t], cache)
        outs.append(y_t)
    torch.testing.assert_close(torch.stack(outs, 1), whole, rtol=1e-12, atol=1e-12)
