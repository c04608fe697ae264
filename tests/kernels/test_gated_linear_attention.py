"""gated_linear_attention (scalar gate [B,T,H] and vector gate [B,T,H,K]): reference vs an
independent parallel form, chunked ("torch") vs the fp64 reference (outputs, final states,
gradients of every input), gates at the edges, decoding steps, bad input."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.gated_linear_attention import gated_linear_attention, gated_linear_attention_step
from tests.util import ROW_TOL, TOL, rel_err, row_err

B, H = 2, 2


def parallel_form(q, k, v, g, scale, state0):
    """Independent fp64 form from the global cumulative log-gate G_t = g_1 + ... + g_t:
    o_i = sum_{j<=i} sum_c q_ic k_jc e^{G_ic - G_jc} v_j + (q_i ⊙ e^{G_i}) S0 and
    S_T = e^{G_T} ⊙ S0 + sum_j (k_j ⊙ e^{G_T - G_j}) v_j^T (one decay matrix per key
    channel; a scalar gate is the same for every channel). Moderate gates only."""
    q, k, v, g = q.double() * scale, k.double(), v.double(), g.double()
    if g.dim() == 3:
        g = g[..., None].expand_as(q)
    G = g.cumsum(dim=1)  # [B, T, H, K]
    T = q.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    decay = torch.exp(G[:, :, None] - G[:, None, :])  # [B, T(i), T(j), H, K]
    decay = decay * causal[None, :, :, None, None]
    scores = torch.einsum("bihc,bjhc,bijhc->bhij", q, k, decay)
    o = torch.einsum("bhij,bjhv->bihv", scores, v)
    final = torch.einsum("bjhc,bjhv->bhcv", k * torch.exp(G[:, -1:] - G), v)
    if state0 is not None:
        o = o + torch.einsum("bihc,bhcv->bihv", q * torch.exp(G), state0.double())
        final = final + torch.exp(G[:, -1])[..., None] * state0.double()
    return o, final


def inputs(T, K, V, vector, with_state, dtype, seed=0, gate_scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen).to(dtype)
    gate_shape = (B, T, H, K) if vector else (B, T, H)
    g = (F.logsigmoid(torch.randn(gate_shape, generator=gen)) * gate_scale).to(dtype)
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32  # states are fp32
    state0 = torch.randn(B, H, K, V, generator=gen).to(state_dtype) if with_state else None
    return q, k, v, g, state0


def outputs_and_grads(fn, q, k, v, g, state0, seed=1):
    """fn(q, k, v, g, state0) -> (o, final); returns [o, final, dq, dk, dv, dg, (d state0)]
    for the loss <o, do> + <final, dstate> with fixed random cotangents."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, g, state0) if t is not None]
    o, final = fn(*leaves[:4], leaves[4] if state0 is not None else None)
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(o.shape, generator=gen, dtype=torch.float64)
    dstate = torch.randn(final.shape, generator=gen, dtype=torch.float64)
    ((o.double() * do).sum() + (final.double() * dstate).sum()).backward()
    return [o, final] + [t.grad for t in leaves]


def call(backend, chunk_size=64):
    def fn(q, k, v, g, state0):
        return gated_linear_attention(q, k, v, g, initial_state=state0, output_final_state=True,
                                      backend=backend, chunk_size=chunk_size)
    return fn


def as_fp64(*tensors):
    return [t.double() if t is not None else None for t in tensors]


NAMES = ["o", "final_state", "dq", "dk", "dv", "dg", "dstate0"]
CASES = [  # (T, K, V, vector gate, with initial state, chunk_size): each T and head dim of docs/design.md §9
    (1, 16, 32, True, True, 64),
    (63, 32, 16, False, False, 64),
    (64, 60, 64, True, False, 64),
    (65, 64, 100, False, True, 16),
    (65, 100, 60, True, True, 24),
    (300, 100, 60, False, True, 64),
    (300, 32, 64, True, False, 64),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T,K,V,vector,with_state,chunk_size", CASES)
def test_chunked_matches_fp64_reference(T, K, V, vector, with_state, chunk_size, dtype):
    q, k, v, g, state0 = inputs(T, K, V, vector, with_state, dtype)
    got = outputs_and_grads(call("torch", chunk_size), q, k, v, g, state0)
    ref = outputs_and_grads(call("reference"), *as_fp64(q, k, v, g, state0))
    assert got[0].dtype == dtype and got[1].dtype == torch.float32
    for name, a, b in zip(NAMES, got, ref):
        assert rel_err(a, b) < TOL[dtype], f"{name}: rel err {rel_err(a, b):.2e}"
        assert row_err(a, b) < ROW_TOL[dtype], f"{name}: worst row {row_err(a, b):.2e}"


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float64], ids=["fp16", "fp64"])
def test_chunked_other_input_dtypes(dtype, vector):
    q, k, v, g, state0 = inputs(65, 32, 16, vector, True, dtype, seed=2)
    got = outputs_and_grads(call("torch", 16), q, k, v, g, state0)
    ref = outputs_and_grads(call("reference"), *as_fp64(q, k, v, g, state0))
    assert got[0].dtype == dtype
    for name, a, b in zip(NAMES, got, ref):
        assert rel_err(a, b) < TOL[dtype], f"{name}: rel err {rel_err(a, b):.2e}"
        assert row_err(a, b) < ROW_TOL[dtype], f"{name}: worst row {row_err(a, b):.2e}"


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("T", [1, 65, 100])
def test_reference_matches_parallel_form(T, vector):
    q, k, v, g, state0 = inputs(T, 8, 12, vector, True, torch.float64, seed=3, gate_scale=0.2)
    got = outputs_and_grads(call("reference"), q, k, v, g, state0)
    ref = outputs_and_grads(lambda *a: parallel_form(*a[:4], 8**-0.5, a[4]), q, k, v, g, state0)
    for name, a, b in zip(NAMES, got, ref):
        assert rel_err(a, b) < 1e-10, name


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
def test_strongly_negative_gates_over_long_chunks(vector):
    """g in [-20, -5] per token on half the channels, near 0 on the rest: the vector form must
    not overflow (no e^{+large}) and must keep the precision of the small gates."""
    q, k, v, _, state0 = inputs(150, 32, 16, vector, True, torch.float32, seed=4)
    gen = torch.Generator().manual_seed(9)
    shape = (B, 150, H, 32) if vector else (B, 150, H)
    strong = -5.0 - 15.0 * torch.rand(shape, generator=gen)
    weak = -1e-3 * torch.rand(shape, generator=gen)
    g = torch.where(torch.rand(shape[-1:] if vector else shape, generator=gen) < 0.5, strong, weak)
    got = outputs_and_grads(call("torch", 64), q, k, v, g, state0)
    ref = outputs_and_grads(call("reference"), *as_fp64(q, k, v, g, state0))
    for name, a, b in zip(NAMES, got, ref):
        assert torch.isfinite(a).all(), name
        assert rel_err(a, b) < TOL[torch.float32], f"{name}: rel err {rel_err(a, b):.2e}"


GATE_MAGNITUDES = [0.0, 1e-7, 1e-3, 1.0, 5.0, 20.0, 200.0]
# With O(1) inputs, a result of norm below this lies under fp32 resolution (every contribution
# decays by e^-57 or more): e.g. d initial_state when the first gate is -200. Its fp64 value
# cannot be matched in relative terms by any fp32 computation, only be negligible as well.
NEGLIGIBLE = 1e-25


def assert_close_or_both_negligible(name, got, ref, tol):
    if ref.double().norm() < NEGLIGIBLE:
        assert torch.isfinite(got).all() and got.double().norm() < NEGLIGIBLE, name
    else:
        assert rel_err(got, ref) < tol, f"{name}: rel err {rel_err(got, ref):.2e}"


@settings(max_examples=30, deadline=None)
@given(
    T=st.integers(1, 70),
    chunk_size=st.sampled_from([4, 16, 64]),
    vector=st.booleans(),
    magnitudes=st.lists(st.sampled_from(GATE_MAGNITUDES), min_size=1, max_size=3),
    minus_inf=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_gates_at_the_edges(T, chunk_size, vector, magnitudes, minus_inf, seed):
    """Gates exactly 0, near 0, very negative (per-token e^-200 underflows fp32) and -inf
    (a full reset), mixed along time: chunked fp32 vs the fp64 reference, outputs, states and
    the gradients of every input."""
    K, V = 8, 4
    q, k, v, _, state0 = inputs(T, K, V, vector, True, torch.float32, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    shape = (B, T, H, K) if vector else (B, T, H)
    pick = torch.randint(len(magnitudes), shape, generator=gen)
    g = -torch.tensor(magnitudes)[pick] * torch.rand(shape, generator=gen)
    if minus_inf:
        g = g.masked_fill(torch.rand(shape, generator=gen) < 0.05, float("-inf"))
    got = outputs_and_grads(call("torch", chunk_size), q, k, v, g, state0)
    ref = outputs_and_grads(call("reference"), *as_fp64(q, k, v, g, state0))
    for name, a, b in zip(NAMES, got, ref):
        assert_close_or_both_negligible(name, a, b, TOL[torch.float32])


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
def test_prefill_then_decode_equals_one_call(vector):
    q, k, v, g, _ = inputs(70, 32, 16, vector, False, torch.float32, seed=5)
    o_full, s_full = gated_linear_attention(q, k, v, g, output_final_state=True, chunk_size=16)
    o_pre, state = gated_linear_attention(q[:, :50], k[:, :50], v[:, :50], g[:, :50],
                                          output_final_state=True, chunk_size=16)
    steps = []
    for t in range(50, 70):
        o_t, state = gated_linear_attention_step(q[:, t], k[:, t], v[:, t], g[:, t], state)
        steps.append(o_t)
    o_cat = torch.cat([o_pre, torch.stack(steps, dim=1)], dim=1)
    assert rel_err(o_cat, o_full) < TOL[torch.float32] and rel_err(state, s_full) < TOL[torch.float32]


def test_two_calls_equal_one_and_no_state_by_default():
    q, k, v, g, state0 = inputs(90, 16, 16, True, True, torch.float32, seed=6)
    o_full, s_full = gated_linear_attention(q, k, v, g, initial_state=state0, output_final_state=True)
    o1, s1 = gated_linear_attention(q[:, :37], k[:, :37], v[:, :37], g[:, :37], initial_state=state0,
                                    output_final_state=True)
    o2, s2 = gated_linear_attention(q[:, 37:], k[:, 37:], v[:, 37:], g[:, 37:], initial_state=s1,
                                    output_final_state=True)
    assert rel_err(torch.cat([o1, o2], 1), o_full) < TOL[torch.float32] and rel_err(s2, s_full) < TOL[torch.float32]
    assert gated_linear_attention(q, k, v, g)[1] is None


def test_bad_input_names_the_argument(monkeypatch):
    q, k, v, g, state0 = inputs(5, 4, 3, False, True, torch.float32)
    cases = [
        (dict(q=q[0]), "q must have 4 dimensions"),
        (dict(k=k[:, :, :, :2]), "q and k"),
        (dict(v=v[:, :4]), "v must be"),
        (dict(g=g[:, :4]), "g must have shape"),
        (dict(g=g.abs() + 0.1), "g is a log-space decay"),
        (dict(initial_state=state0[..., :2]), "initial_state"),
        (dict(backend="cuda"), "backend='cuda'"),
        (dict(chunk_size=-3), "chunk_size"),
    ]
    for override, message in cases:
        args = dict(q=q, k=k, v=v, g=g) | override
        with pytest.raises(ValueError, match=message):
            gated_linear_attention(**args)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="backend='triton'"):
        gated_linear_attention(q, k, v, g, backend="triton")
    with pytest.raises(ValueError, match="g_t"):
        gated_linear_attention_step(q[:, 0], k[:, 0], v[:, 0], torch.ones(B, H), None)
    with pytest.raises(ValueError, match="g_t must have shape"):
        gated_linear_attention_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0, :1], None)
    with pytest.raises(ValueError, match="state"):
        gated_linear_attention_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], state0[:, :1])
