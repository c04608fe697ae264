"""linear_attention: reference vs an independent parallel form, chunked ("torch") vs the fp64
reference (outputs, final states, gradients of every input), decoding steps, bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.linear_attention import linear_attention, linear_attention_step
from tests.util import ROW_TOL, TOL, rel_err, row_err

B, H = 2, 2


def parallel_form(q, k, v, scale, state0):
    """Independent fp64 form: O = (Q K^T ⊙ M) V + Q S0, S_T = S0 + K^T V (per batch, head)."""
    q, k, v = q.double() * scale, k.double(), v.double()
    T = q.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = torch.einsum("bthk,bshk->bhts", q, k).masked_fill(~causal, 0.0)
    o = torch.einsum("bhts,bshv->bthv", scores, v)
    final = torch.einsum("bshk,bshv->bhkv", k, v)
    if state0 is not None:
        o = o + torch.einsum("bthk,bhkv->bthv", q, state0.double())
        final = final + state0.double()
    return o, final


def inputs(T, K, V, with_state, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen).to(dtype)
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32  # states are fp32
    state0 = torch.randn(B, H, K, V, generator=gen).to(state_dtype) if with_state else None
    return q, k, v, state0


def outputs_and_grads(fn, q, k, v, state0, seed=1):
    """fn(q, k, v, state0) -> (o, final); returns [o, final, dq, dk, dv, (d state0)] for the
    loss <o, do> + <final, dstate> with fixed random cotangents."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, state0) if t is not None]
    o, final = fn(*leaves[:3], leaves[3] if state0 is not None else None)
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(o.shape, generator=gen, dtype=torch.float64)
    dstate = torch.randn(final.shape, generator=gen, dtype=torch.float64)
    ((o.double() * do).sum() + (final.double() * dstate).sum()).backward()
    return [o, final] + [t.grad for t in leaves]


def call(backend, chunk_size=64):
    def fn(q, k, v, state0):
        return linear_attention(q, k, v, initial_state=state0, output_final_state=True,
                                backend=backend, chunk_size=chunk_size)
    return fn


NAMES = ["o", "final_state", "dq", "dk", "dv", "dstate0"]
CASES = [  # (T, K, V, with initial state, chunk_size): every T and head dim of docs/design.md §9 once
    (1, 16, 32, True, 64),
    (63, 32, 16, False, 64),
    (64, 60, 64, True, 64),
    (65, 64, 100, False, 16),
    (300, 100, 60, True, 64),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T,K,V,with_state,chunk_size", CASES)
def test_chunked_matches_fp64_reference(T, K, V, with_state, chunk_size, dtype):
    q, k, v, state0 = inputs(T, K, V, with_state, dtype)
    got = outputs_and_grads(call("torch", chunk_size), q, k, v, state0)
    ref = outputs_and_grads(call("reference"), *(t.double() if t is not None else None for t in (q, k, v, state0)))
    assert got[0].dtype == dtype and got[1].dtype == torch.float32
    for name, a, b in zip(NAMES, got, ref):
        assert rel_err(a, b) < TOL[dtype], f"{name}: rel err {rel_err(a, b):.2e}"
        assert row_err(a, b) < ROW_TOL[dtype], f"{name}: worst row {row_err(a, b):.2e}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64], ids=["fp16", "fp64"])
def test_chunked_other_input_dtypes(dtype):
    q, k, v, state0 = inputs(65, 32, 16, True, dtype, seed=2)
    got = outputs_and_grads(call("torch", 16), q, k, v, state0)
    ref = outputs_and_grads(call("reference"), *(t.double() for t in (q, k, v, state0)))
    assert got[0].dtype == dtype
    for name, a, b in zip(NAMES, got, ref):
        assert rel_err(a, b) < TOL[dtype], f"{name}: rel err {rel_err(a, b):.2e}"
        assert row_err(a, b) < ROW_TOL[dtype], f"{name}: worst row {row_err(a, b):.2e}"


@pytest.mark.parametrize("T", [1, 65, 130])
def test_reference_matches_parallel_form(T):
    q, k, v, state0 = inputs(T, 16, 24, True, torch.float64, seed=3)
    got = outputs_and_grads(call("reference"), q, k, v, state0)
    ref = outputs_and_grads(lambda *a: parallel_form(*a[:3], 16**-0.5, a[3]), q, k, v, state0)
    for name, a, b in zip(NAMES, got, ref):
        assert rel_err(a, b) < 1e-12, name


@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 80), chunk_size=st.integers(1, 70), K=st.integers(1, 9), V=st.integers(1, 9))
def test_chunked_any_shape(T, chunk_size, K, V):
    q, k, v, state0 = inputs(T, K, V, True, torch.float32, seed=T)
    o, s = linear_attention(q, k, v, initial_state=state0, output_final_state=True, chunk_size=chunk_size)
    o_ref, s_ref = parallel_form(q, k, v, K**-0.5, state0)
    assert rel_err(o, o_ref) < TOL[torch.float32] and rel_err(s, s_ref) < TOL[torch.float32]


def test_prefill_then_decode_equals_one_call():
    q, k, v, _ = inputs(70, 32, 16, False, torch.float32, seed=5)
    o_full, s_full = linear_attention(q, k, v, output_final_state=True, chunk_size=16)
    o_pre, state = linear_attention(q[:, :50], k[:, :50], v[:, :50], output_final_state=True, chunk_size=16)
    steps = []
    for t in range(50, 70):
        o_t, state = linear_attention_step(q[:, t], k[:, t], v[:, t], state)
        steps.append(o_t)
    o_cat = torch.cat([o_pre, torch.stack(steps, dim=1)], dim=1)
    assert rel_err(o_cat, o_full) < TOL[torch.float32] and rel_err(state, s_full) < TOL[torch.float32]


def test_two_calls_equal_one_and_no_state_by_default():
    q, k, v, state0 = inputs(90, 16, 16, True, torch.float32, seed=6)
    o_full, s_full = linear_attention(q, k, v, initial_state=state0, output_final_state=True)
    o1, s1 = linear_attention(q[:, :37], k[:, :37], v[:, :37], initial_state=state0, output_final_state=True)
    o2, s2 = linear_attention(q[:, 37:], k[:, 37:], v[:, 37:], initial_state=s1, output_final_state=True)
    assert rel_err(torch.cat([o1, o2], 1), o_full) < TOL[torch.float32] and rel_err(s2, s_full) < TOL[torch.float32]
    assert linear_attention(q, k, v)[1] is None


def test_step_from_no_state_and_scale():
    q, k, v, _ = inputs(1, 8, 4, False, torch.float32, seed=7)
    o_t, h = linear_attention_step(q[:, 0], k[:, 0], v[:, 0], None, scale=0.5)
    o_ref, h_ref = parallel_form(q, k, v, 0.5, None)
    assert rel_err(o_t, o_ref[:, 0]) < 1e-6 and rel_err(h, h_ref) < 1e-6


def test_bad_input_names_the_argument(monkeypatch):
    q, k, v, state0 = inputs(5, 4, 3, True, torch.float32)
    cases = [
        (dict(q=q[0]), "q must have 4 dimensions"),
        (dict(k=k[:, :, :, :2]), "q and k"),
        (dict(v=v[:, :4]), "v must be"),
        (dict(initial_state=state0[..., :2]), "initial_state"),
        (dict(backend="cuda"), "backend='cuda'"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(scale=-1.0), "scale"),
    ]
    for override, message in cases:
        args = dict(q=q, k=k, v=v, initial_state=None) | override
        with pytest.raises(ValueError, match=message):
            linear_attention(**args)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="backend='triton'"):
        linear_attention(q, k, v, backend="triton")
    with pytest.raises(ValueError, match="q_t"):
        linear_attention_step(q, k[:, 0], v[:, 0], None)
    with pytest.raises(ValueError, match="state"):
        linear_attention_step(q[:, 0], k[:, 0], v[:, 0], state0[:, :1])
