"""softmax_attention: reference vs an independent per-query loop, SDPA ("torch") vs the fp64
reference (outputs, caches, gradients of q, k, v and the cache), decoding steps on the KV
cache, bad input. The FlashAttention backends: test_softmax_backends.py (CPU, fake packages)
and tests/gpu/test_softmax_flash_gpu.py."""

import pytest
import torch

from kernels.softmax_attention import KVCache, softmax_attention, softmax_attention_step
from tests.util import TOL, rel_err

B, H = 2, 2


def per_query_loop(q, k, v, scale, cache):
    """Independent fp64 form: query t attends to the S cached keys and new keys 0..t."""
    keys, values = k.double(), v.double()
    if cache is not None:
        keys, values = torch.cat([cache.k.double(), keys], 1), torch.cat([cache.v.double(), values], 1)
    S = keys.shape[1] - q.shape[1]
    outputs = []
    for t in range(q.shape[1]):
        weights = torch.softmax(torch.einsum("bhk,bshk->bhs", q[:, t].double() * scale, keys[:, : S + t + 1]), -1)
        outputs.append(torch.einsum("bhs,bshv->bhv", weights, values[:, : S + t + 1]))
    return torch.stack(outputs, 1), KVCache(keys, values)


def inputs(T, K, V, S, dtype, seed=0):
    """q, k, v for T new tokens and a KVCache of S earlier ones (None when S == 0)."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen).to(dtype)
    cache = KVCache(torch.randn(B, S, H, K, generator=gen).to(dtype), torch.randn(B, S, H, V, generator=gen).to(dtype))
    return q, k, v, (cache if S else None)


def outputs_and_grads(fn, q, k, v, cache, seed=1):
    """fn(q, k, v, cache) -> (o, cache'); returns [o, dq, dk, dv, (d cache.k, d cache.v)] for
    the loss <o, do> with a fixed random cotangent."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, *(cache or ()))]
    o, _ = fn(*leaves[:3], KVCache(*leaves[3:]) if cache is not None else None)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    (o.double() * do).sum().backward()
    return [o] + [t.grad for t in leaves]


def call(backend):
    def fn(q, k, v, cache):
        return softmax_attention(q, k, v, initial_state=cache, output_final_state=True, backend=backend)
    return fn


def as_fp64(q, k, v, cache):
    return q.double(), k.double(), v.double(), (KVCache(cache.k.double(), cache.v.double()) if cache else None)


NAMES = ["o", "dq", "dk", "dv", "dcache_k", "dcache_v"]
CASES = [  # (T, K, V, S cached tokens): each T and head dim of docs/design.md §9 once
    (1, 16, 32, 5),
    (63, 32, 16, 0),
    (64, 60, 64, 17),
    (65, 64, 100, 0),
    (300, 100, 60, 40),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T,K,V,S", CASES)
def test_sdpa_matches_fp64_reference(T, K, V, S, dtype):
    q, k, v, cache = inputs(T, K, V, S, dtype)
    got = outputs_and_grads(call("torch"), q, k, v, cache)
    ref = outputs_and_grads(call("reference"), *as_fp64(q, k, v, cache))
    assert got[0].dtype == dtype
    for name, a, b in zip(NAMES, got, ref):
        assert rel_err(a, b) < TOL[dtype], f"{name}: rel err {rel_err(a, b):.2e}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64], ids=["fp16", "fp64"])
def test_sdpa_other_input_dtypes(dtype):
    q, k, v, cache = inputs(65, 32, 16, 7, dtype, seed=2)
    got = outputs_and_grads(call("torch"), q, k, v, cache)
    ref = outputs_and_grads(call("reference"), *as_fp64(q, k, v, cache))
    assert got[0].dtype == dtype
    for name, a, b in zip(NAMES, got, ref):
        assert rel_err(a, b) < TOL[dtype], f"{name}: rel err {rel_err(a, b):.2e}"


@pytest.mark.parametrize("T,S", [(1, 0), (1, 9), (40, 0), (40, 13)])
def test_reference_matches_per_query_loop(T, S):
    q, k, v, cache = inputs(T, 8, 12, S, torch.float64, seed=3)
    got = outputs_and_grads(call("reference"), q, k, v, cache)
    ref = outputs_and_grads(lambda *a: per_query_loop(*a[:3], 8**-0.5, a[3]), q, k, v, cache)
    for name, a, b in zip(NAMES, got, ref):
        assert rel_err(a, b) < 1e-12, name


def test_final_cache_holds_every_token():
    q, k, v, cache = inputs(7, 8, 4, 3, torch.float32)
    for backend in ("reference", "torch"):
        _, final = softmax_attention(q, k, v, initial_state=cache, output_final_state=True, backend=backend)
        assert torch.equal(final.k, torch.cat([cache.k, k], 1)) and torch.equal(final.v, torch.cat([cache.v, v], 1))
        assert softmax_attention(q, k, v, backend=backend)[1] is None


def test_prefill_then_decode_equals_one_call():
    q, k, v, _ = inputs(70, 32, 16, 0, torch.float32, seed=5)
    o_full, _ = softmax_attention(q, k, v, backend="torch")
    o_pre, cache = softmax_attention(q[:, :50], k[:, :50], v[:, :50], output_final_state=True, backend="torch")
    steps = []
    for t in range(50, 70):
        o_t, cache = softmax_attention_step(q[:, t], k[:, t], v[:, t], cache)
        steps.append(o_t)
    assert rel_err(torch.cat([o_pre, torch.stack(steps, 1)], 1), o_full) < TOL[torch.float32]
    assert cache.k.shape == (B, 70, H, 32)


def test_step_without_cache_returns_its_value():
    q, k, v, _ = inputs(1, 8, 4, 0, torch.float32)
    o_t, cache = softmax_attention_step(q[:, 0], k[:, 0], v[:, 0], None)
    assert torch.allclose(o_t, v[:, 0]) and cache.k.shape == (B, 1, H, 8)


def test_bad_input_names_the_argument(monkeypatch):
    q, k, v, cache = inputs(5, 4, 3, 2, torch.float32)
    cases = [
        (dict(q=q[0]), "q must have 4 dimensions"),
        (dict(k=k[:, :, :, :2]), "q and k"),
        (dict(v=v[:, :4]), "v must be"),
        (dict(initial_state=KVCache(cache.k[..., :2], cache.v)), "initial_state"),
        (dict(initial_state=KVCache(cache.k, cache.v[:, :1])), "initial_state"),
        (dict(initial_state=cache.k), "initial_state"),
        (dict(backend="triton"), "backend='triton'"),
        (dict(backend="cuda"), "backend='cuda'"),
        (dict(scale=0.0), "scale"),
    ]
    for override, message in cases:
        args = dict(q=q, k=k, v=v) | override
        with pytest.raises(ValueError, match=message):
            softmax_attention(**args)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="backend='flash_attn'"):
            softmax_attention(q, k, v, backend="flash_attn")
    with pytest.raises(ValueError, match="v_t"):
        softmax_attention_step(q[:, 0], k[:, 0], v[:, :, 0], None)
    with pytest.raises(ValueError, match="state"):
        softmax_attention_step(q[:, 0], k[:, 0], v[:, 0], KVCache(cache.k[:1], cache.v[:1]))
