"""Softmax attention's FlashAttention backends on a CUDA GPU against the fp64 reference.

Each installed FlashAttention (fa4, fa3, flash_attn) runs through the public op at moderate
and long T, with and without a KV cache (S cached tokens, the bottom-right causal case),
in bf16 and fp16, and SDPA (backend "torch") on the same cases and bounds beside them;
outputs, the returned cache and the gradients of q, k, v and of the cached
keys and values are held to TOL (whole tensor) and ROW_TOL (worst row) against the reference
run in fp64 on the same GPU. Each case watches the backend's entry point in flash.py, so that
a comparison that ran SDPA cannot pass. A backend that is not installed or cannot run on this
GPU is skipped with its BackendStatus reason. "auto" is checked to pick the first usable one,
and a softmax mixer to record it.

Skipped without CUDA. Errors are printed (-s) and, when GPU_ERRORS_JSON names a file, written
there under each case's label.
"""

from __future__ import annotations

import importlib
from unittest import mock

import pytest
import torch

from kernels.common.dispatch import FLASH_BACKENDS, backend_status
from kernels.softmax_attention import KVCache, softmax_attention
from kernels.softmax_attention.spec import SPEC, auto_choice
from tests.util import GPU_ONLY, ROW_TOL, TOL, record_gpu_errors, rel_err, row_err

pytestmark = GPU_ONLY

# kernels.softmax_attention is rebound to the op function by kernels/__init__.py, so the module
# is fetched by its full name rather than by attribute.
flash = importlib.import_module("kernels.softmax_attention.flash")

ENTRIES = {"fa4": "softmax_attention_fa4", "fa3": "softmax_attention_fa3", "flash_attn": "softmax_attention_flash"}


def usable(backend: str) -> None:
    status = backend_status(backend, "cuda")
    if not status.usable:
        pytest.skip(f"{backend}: {status.reason}")


def make_inputs(B, T, S, H, K, V, dtype, seed):
    """q, k, v of T new tokens and a KVCache of S earlier ones (None when S == 0), all
    requiring gradients."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen).to(dtype).requires_grad_()

    q, k, v = randn(B, T, H, K), randn(B, T, H, K), randn(B, T, H, V)
    cache = KVCache(randn(B, S, H, K), randn(B, S, H, V)) if S else None
    return q, k, v, cache


def outputs_and_grads(backend, q, k, v, cache, do):
    """o, the returned cache and the gradients of <o, do> w.r.t. q, k, v and the cache."""
    o, final = softmax_attention(q, k, v, initial_state=cache, output_final_state=True, backend=backend)
    wrt = [q, k, v, *(cache or ())]
    grads = torch.autograd.grad(o, wrt, do)
    return o, final, grads


def fp64(t):
    return t.detach().double().requires_grad_()


CASES = [  # (B, T, S, H, K, V)
    (2, 1000, 0, 4, 64, 64),
    (2, 1000, 300, 4, 64, 64),
    (1, 4096, 0, 8, 128, 128),
    (1, 4096, 1024, 8, 128, 128),
    (3, 129, 7, 2, 128, 128),  # lengths that are no multiple of any tile
    (4, 1, 250, 2, 64, 64),  # one new token over a cache: decode through prefill
]


@pytest.mark.parametrize("backend", [*FLASH_BACKENDS, "torch"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B, T, S, H, K, V", CASES)
def test_flash_attention_matches_the_reference(backend, dtype, B, T, S, H, K, V):
    """Each FlashAttention, and SDPA (the torch backend, which auto takes when none is usable)
    on the same cases and bounds, so that a FlashAttention over a bound is seen beside what
    the established kernel gives there."""
    if backend != "torch":
        usable(backend)
    q, k, v, cache = make_inputs(B, T, S, H, K, V, dtype, seed=T + S)
    do = torch.randn(B, T, H, V, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)).to(dtype)
    # The torch backend's entry is bound in the spec; the SDPA call inside it is watched instead.
    module, entry = (torch.nn.functional, "scaled_dot_product_attention") if backend == "torch" \
        else (flash, ENTRIES[backend])
    with mock.patch.object(module, entry, wraps=getattr(module, entry)) as ran:
        o, final, grads = outputs_and_grads(backend, q, k, v, cache, do)
    assert ran.call_count == 1, f"{backend}: {entry} did not run"
    ref_cache = KVCache(fp64(cache.k), fp64(cache.v)) if cache else None
    o_ref, final_ref, grads_ref = outputs_and_grads("reference", fp64(q), fp64(k), fp64(v), ref_cache, do.double())
    assert o.dtype == dtype and final.k.shape == (B, S + T, H, K)
    assert torch.equal(final.k, final_ref.k.to(dtype)) and torch.equal(final.v, final_ref.v.to(dtype))
    names = ["o", "dq", "dk", "dv", "d_cache_k", "d_cache_v"]
    errors = {}
    for name, out, ref in zip(names, (o, *grads), (o_ref, *grads_ref)):
        errors[name] = rel_err(out, ref)
        errors[name + "_row"] = row_err(out, ref)
    record_gpu_errors(f"softmax {backend} {str(dtype)[6:]} B{B} T{T} S{S} H{H} K{K}", errors)
    for name in names[: len(grads) + 1]:
        assert errors[name] < TOL[dtype], (name, errors)
        assert errors[name + "_row"] < ROW_TOL[dtype], (name, errors)


def test_fa4_takes_unequal_head_dims():
    usable("fa4")
    q, k, v, cache = make_inputs(2, 300, 50, 4, 128, 64, torch.bfloat16, seed=3)
    o, _ = softmax_attention(q, k, v, initial_state=cache, backend="fa4")
    o_ref, _ = softmax_attention(fp64(q), fp64(k), fp64(v), initial_state=KVCache(fp64(cache.k), fp64(cache.v)),
                                 backend="reference")
    assert rel_err(o, o_ref) < TOL[torch.bfloat16]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_auto_runs_the_first_usable_flash_attention_and_the_mixer_records_it(dtype):
    from mixers import build_mixer

    chosen, passed = auto_choice("cuda", dtype)
    for status in passed:
        print(f"auto passed over {status.name}: {status.reason}")
    usable_ones = [b for b in FLASH_BACKENDS if backend_status(b, "cuda").usable]
    expected = (usable_ones[0] if usable_ones else "torch") if dtype != torch.float32 else "torch"
    assert chosen == expected == SPEC.resolve("auto", "cuda", dtype)
    mixer = build_mixer("softmax", 256, {"num_heads": 4}).to(device="cuda", dtype=dtype)
    with mock.patch.object(flash, ENTRIES.get(chosen, "softmax_attention_flash"),
                           wraps=getattr(flash, ENTRIES.get(chosen, "softmax_attention_flash"))) as ran:
        mixer(torch.randn(2, 128, 256, device="cuda", dtype=dtype))
    assert mixer.backend_used == chosen
    assert ran.call_count == (1 if chosen in ENTRIES else 0)


def test_a_gpu_with_flash_attention_4_runs_it_under_auto():
    """The issue's goal on the H200: with flash-attn-4 installed, auto is FA4."""
    usable("fa4")
    assert SPEC.resolve("auto", "cuda", torch.bfloat16) == "fa4"
