"""Triton linear attention against the per-token reference, on the CPU interpreter.

Outputs, final states and the gradients of q, k, v and the initial state, fp32 (and fp16)
inputs, awkward T; every buffer the kernels write starts as NaN (conftest)."""

from __future__ import annotations

import pytest
import torch

from kernels.linear_attention import linear_attention
from tests.util import TOL, rel_err


def make_inputs(B, T, H, K, V, dtype, seed=0, with_state=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen).to(dtype)
    k = torch.randn(B, T, H, K, generator=gen).to(dtype)
    v = torch.randn(B, T, H, V, generator=gen).to(dtype)
    h0 = torch.randn(B, H, K, V, generator=gen) if with_state else None
    return {"q": q, "k": k, "v": v}, h0


@pytest.mark.parametrize(
    "B, T, H, K, V, with_state",
    [
        (1, 1, 2, 16, 16, True),
        (1, 63, 2, 16, 32, False),
        (1, 64, 1, 32, 16, True),
        (2, 100, 2, 32, 32, True),
    ],
)
def test_matches_reference_fp32(compare, B, T, H, K, V, with_state):
    tensors, h0 = make_inputs(B, T, H, K, V, torch.float32, seed=T, with_state=with_state)
    compare(linear_attention, tensors, h0, TOL[torch.float32])


def test_matches_reference_fp16(compare):
    tensors, h0 = make_inputs(1, 100, 2, 32, 16, torch.float16, seed=7)
    compare(linear_attention, tensors, h0, TOL[torch.float16])


def test_small_chunk_and_odd_dims(compare):
    # chunk 16 over T = 40 (two full chunks and a partial one); K, V not powers of two
    tensors, h0 = make_inputs(1, 40, 1, 20, 24, torch.float32, seed=3)
    compare(linear_attention, tensors, h0, TOL[torch.float32], chunk_size=16)


def test_gradients_through_output_only():
    """With no final state requested, backward gets no state cotangent and no initial
    state: the kernels must run without them."""
    tensors, _ = make_inputs(1, 70, 1, 16, 16, torch.float32, seed=11)
    ours = {n: t.clone().requires_grad_(True) for n, t in tensors.items()}
    ref = {n: t.double().requires_grad_(True) for n, t in tensors.items()}
    o, ht = linear_attention(**ours, backend="triton")
    o_ref, _ = linear_attention(**ref, backend="reference")
    assert ht is None
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(12), dtype=o.dtype)  # seeded: reproducible
    grads = torch.autograd.grad(o, list(ours.values()), do)
    grads_ref = torch.autograd.grad(o_ref, list(ref.values()), do.double())
    assert rel_err(o, o_ref) < TOL[torch.float32]
    for name, g, g_ref in zip(ours, grads, grads_ref):
        assert rel_err(g, g_ref) < TOL[torch.float32], name


def test_fp64_inputs_return_fp64():
    tensors, h0 = make_inputs(1, 20, 1, 16, 16, torch.float64, seed=5)
    o, ht = linear_attention(**tensors, initial_state=h0.double(), output_final_state=True, backend="triton")
    o_ref, ht_ref = linear_attention(**tensors, initial_state=h0.double(), output_final_state=True, backend="reference")
    assert o.dtype == torch.float64 and ht.dtype == torch.float64
    assert rel_err(o, o_ref) < TOL[torch.float32] and rel_err(ht, ht_ref) < TOL[torch.float32]


def test_bad_chunk_size_raises():
    tensors, _ = make_inputs(1, 8, 1, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="chunk_size"):
        linear_attention(**tensors, backend="triton", chunk_size=48)
