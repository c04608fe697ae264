"""The alternative forms benchmarks/mqar_step_variants.py weighs compute what the harness's
own forms do: the block-doubling inverse against the identity and against the triangular
solve of kernels.gated_delta_rule.chunked (fresh random matrices of awkward sizes, fp32 and
fp64, batched leading dims, gradients; the diagonal and upper part are not read), the
nn.Conv1d form against causal_depthwise_conv, and a model under each variant against the
model as it is."""

from __future__ import annotations

import pytest
import torch

import mixers.base as mixers_base
from benchmarks.mqar_step_variants import conv1d_causal, inverse_solve, unit_lower_inverse, variant
from harness.config import resolve_config
from kernels.gated_delta_rule.chunked import solve_unit_lower
from mixers.base import causal_depthwise_conv
from tasks.common.model import MixerLM
from tasks.mqar import MQAR


def _unit_lower(a):
    C = a.shape[-1]
    return torch.eye(C, dtype=a.dtype) + a.tril(-1)


@pytest.mark.parametrize("C", [1, 2, 3, 7, 16, 33, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_inverse_times_matrix_is_identity(C, dtype):
    gen = torch.Generator().manual_seed(C)
    a = torch.randn(2, 3, C, C, generator=gen, dtype=torch.float64) * 0.5
    inverse = unit_lower_inverse(a.to(dtype)).double()
    eye = torch.eye(C, dtype=torch.float64)
    # The inverse's size sets the error scale of fp32: judge the residual relative to it.
    tol = (1e-12 if dtype == torch.float64 else 2e-6) * max(1.0, inverse.abs().max().item())
    torch.testing.assert_close(inverse @ _unit_lower(a), eye.expand_as(inverse), rtol=0, atol=tol)
    assert torch.equal(inverse.triu(1), torch.zeros_like(inverse))


def test_reads_only_the_strictly_lower_part():
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(4, 20, 20, generator=gen, dtype=torch.float64)
    noisy = a.tril(-1) + torch.randn(4, 20, 20, generator=gen, dtype=torch.float64).triu()
    assert torch.equal(unit_lower_inverse(a), unit_lower_inverse(noisy))


@pytest.mark.parametrize("C", [5, 64])
def test_solve_matches_triangular_solve_with_grads(C):
    gen = torch.Generator().manual_seed(10 + C)
    a = (torch.randn(3, C, C, generator=gen, dtype=torch.float64) * 0.4).requires_grad_()
    rhs = torch.randn(3, C, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    up = torch.randn(3, C, 6, generator=gen, dtype=torch.float64)
    got = inverse_solve(a, rhs)
    want = solve_unit_lower(a, rhs)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    g_got = torch.autograd.grad((got * up).sum(), [a, rhs])
    g_want = torch.autograd.grad((want * up).sum(), [a, rhs])
    for x, y in zip(g_got, g_want):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("with_bias", [False, True])
def test_conv1d_form_matches_shift_and_add(with_bias):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 11, 5, generator=gen, dtype=torch.float64)
    weight = torch.randn(5, 1, 4, generator=gen, dtype=torch.float64)
    bias = torch.randn(5, generator=gen, dtype=torch.float64) if with_bias else None
    torch.testing.assert_close(conv1d_causal(x, weight, bias), causal_depthwise_conv(x, weight, bias),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mixer", ["gdn", "mesa"])
def test_every_variant_computes_the_same_model(mixer):
    """The patches reach the layers (ShortConv, BaseConv, the chunkwise solve) and change no output."""
    cfg = resolve_config(MQAR, "zoology", None, ["model.d_model=32", "model.mixer.backend=torch"])
    torch.manual_seed(0)
    model = MixerLM(mixer, cfg.vocab_size, cfg.model, max_positions=100).double().eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, 100))
    want = model(tokens)
    for conv, solve in [("conv1d", "trsm"), ("shift", "inverse"), ("conv1d", "inverse")]:
        with variant(conv, solve):
            assert (mixers_base.causal_depthwise_conv is conv1d_causal) == (conv == "conv1d")
            got = model(tokens)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
