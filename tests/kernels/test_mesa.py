"""MesaNet op: reference vs an explicit-matrix formulation, chunked CG vs reference
(outputs, states, gradients of every input), decode steps, CG convergence, validation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.mesa import MesaState, mesa, mesa_step
from kernels.mesa.cg import cg_residual_curve
from tests.util import TOL, rel_err

F64 = torch.float64


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These shapes are tiny: intra-op threads only spin (10x the CPU time on a shared
    machine). Restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_inputs(B, T, H, K, V, seed, with_state, g_range=(-0.3, -0.01), lamb_range=(0.5, 1.5), beta_range=(0.1, 1.0)):
    """fp64 inputs of the shape MesaNet sees in a model: l2-normalised keys, beta in (0, 1],
    mild decay, lamb ~ 1 (a well-conditioned H_kk + diag(lamb))."""
    gen = torch.Generator().manual_seed(seed)

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=F64)

    q = torch.randn(B, T, H, K, generator=gen, dtype=F64)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=F64), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=F64)
    g = uniform((B, T, H), *g_range)
    beta = uniform((B, T, H), *beta_range)
    lamb = uniform((H, K), *lamb_range)
    state = None
    if with_state:
        a = torch.randn(B, H, K, K, generator=gen, dtype=F64) / K
        state = MesaState(a @ a.transpose(-1, -2), torch.randn(B, H, K, V, generator=gen, dtype=F64) / K)
    return [q, k, v, g, beta, lamb], state


def explicit_mesa(q, k, v, g, beta, lamb, scale, state):
    """Independent fp64 formulation: every H_kk_t, H_kv_t built from products of decays
    (no recurrence, no cumulative sums), then all T systems solved in one batched call."""
    B, T, H, K = q.shape
    a = g.exp().permute(0, 2, 1)  # [B, H, T]
    s_idx = torch.arange(T)
    # factors[t, s] = a_s for s <= t, else 1; tail[t, j] = prod_{s=j}^{t} a_s
    factors = torch.where(s_idx[None, :] <= s_idx[:, None], a[..., None, :], torch.ones_like(a[..., None, :]))
    tail = factors.flip(-1).cumprod(-1).flip(-1)
    tail = torch.cat([tail, torch.ones_like(tail[..., :1])], dim=-1)  # tail[t, t+1] = 1
    decay_from_j = torch.where(s_idx[None, :] <= s_idx[:, None], tail[..., 1:], torch.zeros_like(tail[..., 1:]))
    decay_from_0 = tail[..., 0]  # prod_{s=1}^{t} a_s
    kh, vh, bh = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3), beta.permute(0, 2, 1)
    w = decay_from_j * bh[..., None, :]  # [B, H, T(t), T(j)]
    h_kk = torch.einsum("bhtj,bhjk,bhjl->bhtkl", w, kh, kh)
    h_kv = torch.einsum("bhtj,bhjk,bhjl->bhtkl", w, kh, vh)
    if state is not None:
        h_kk = h_kk + decay_from_0[..., None, None] * state.h_kk[:, :, None]
        h_kv = h_kv + decay_from_0[..., None, None] * state.h_kv[:, :, None]
    m = h_kk + torch.diag_embed(lamb)[None, :, None]
    q_star = torch.linalg.solve(m, scale * q.permute(0, 2, 1, 3)[..., None])
    o = (h_kv.transpose(-1, -2) @ q_star)[..., 0].permute(0, 2, 1, 3)
    return o, MesaState(h_kk[:, :, -1], h_kv[:, :, -1])


def run_with_grads(backend, tensors, state, dtype, cotangents, **kwargs):
    """Run mesa on copies of the fp64 inputs cast to dtype (states stay fp32/fp64) and
    backprop one fixed random functional of o and the final state."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in tensors]
    state_dtype = F64 if dtype == F64 else torch.float32
    state_leaves = None
    if state is not None:
        state_leaves = MesaState(*(s.detach().to(state_dtype).requires_grad_() for s in state))
    o, final = mesa(*leaves, initial_state=state_leaves, output_final_state=True, backend=backend, **kwargs)
    d_o, d_kk, d_kv = cotangents
    loss = (o.double() * d_o).sum() + (final.h_kk.double() * d_kk).sum() + (final.h_kv.double() * d_kv).sum()
    loss.backward()
    results = {"o": o, "h_kk": final.h_kk, "h_kv": final.h_kv}
    for name, leaf in zip(["q", "k", "v", "g", "beta", "lamb"], leaves):
        results["d" + name] = leaf.grad
    if state_leaves is not None:
        results["d_state.h_kk"], results["d_state.h_kv"] = state_leaves.h_kk.grad, state_leaves.h_kv.grad
    return results


def cotangents_for(B, T, H, K, V, seed):
    gen = torch.Generator().manual_seed(seed + 1)
    return (
        torch.randn(B, T, H, V, generator=gen, dtype=F64),
        torch.randn(B, H, K, K, generator=gen, dtype=F64),
        torch.randn(B, H, K, V, generator=gen, dtype=F64),
    )


@pytest.mark.parametrize("T,K,V,with_state", [(1, 16, 32, True), (65, 60, 100, False), (64, 100, 16, True)])
def test_reference_matches_explicit_matrices(T, K, V, with_state):
    tensors, state = make_inputs(2, T, 2, K, V, seed=T + K, with_state=with_state)
    o, final = mesa(*tensors, initial_state=state, output_final_state=True, backend="reference")
    o_ref, final_ref = explicit_mesa(*tensors, K**-0.5, state)
    assert o.dtype == F64
    assert rel_err(o, o_ref) < 1e-10
    assert rel_err(final.h_kk, final_ref.h_kk) < 1e-10
    assert rel_err(final.h_kv, final_ref.h_kv) < 1e-10


# (T, K, V, initial state, chunk_size): every T in {1, 63, 64, 65, 300} and K, V in
# {16, 32, 60, 64, 100}; chunk_size 16 puts several chunks in a short sequence.
CASES = [
    (1, 16, 32, True, 64),
    (63, 32, 60, False, 64),
    (64, 64, 16, True, 64),
    (65, 60, 64, True, 16),
    (300, 100, 100, True, 64),
    (65, 16, 100, False, 64),
]


DTYPE_CASES = [(case, dtype) for dtype in (torch.float32, torch.bfloat16) for case in CASES]
DTYPE_CASES.append(((65, 60, 64, True, 16), torch.float16))


@pytest.mark.parametrize("case,dtype", DTYPE_CASES, ids=lambda x: str(x).replace(" ", ""))
def test_chunked_matches_reference(case, dtype):
    T, K, V, with_state, chunk_size = case
    B, H = 2, 2
    tensors, state = make_inputs(B, T, H, K, V, seed=7 * T + K, with_state=with_state)
    tensors = [t.to(dtype).to(F64) for t in tensors]  # the reference sees the same rounded inputs
    state = None if state is None else MesaState(*(s.float().double() for s in state))
    cot = cotangents_for(B, T, H, K, V, seed=T)
    ref = run_with_grads("reference", tensors, state, F64, cot)
    out = run_with_grads("torch", tensors, state, dtype, cot, chunk_size=chunk_size, cg_steps=60)
    assert out["o"].dtype == dtype and out["h_kk"].dtype == torch.float32
    assert set(out) == set(ref)
    for name in ref:
        assert rel_err(out[name], ref[name]) < TOL[dtype], name


def test_chunked_default_cg_steps_and_tolerance():
    """The defaults (30 CG steps) on well-conditioned inputs, and an early stop by cg_tol."""
    tensors, state = make_inputs(1, 130, 2, 64, 32, seed=3, with_state=True)
    tensors = [t.float().double() for t in tensors]
    cot = cotangents_for(1, 130, 2, 64, 32, seed=3)
    ref = run_with_grads("reference", tensors, state, F64, cot)
    for kwargs in ({}, {"cg_steps": 500, "cg_tol": 1e-6}):
        out = run_with_grads("torch", tensors, state, torch.float32, cot, **kwargs)
        for name in ref:
            assert rel_err(out[name], ref[name]) < TOL[torch.float32], (kwargs, name)


def test_cg_error_decreases_with_iterations():
    tensors, state = make_inputs(2, 100, 2, 32, 8, seed=11, with_state=True, lamb_range=(0.05, 0.5))
    q, k, _, g, beta, lamb = tensors
    counts = [0, 1, 2, 4, 8, 16, 32, 64]
    curve64 = cg_residual_curve(q, k, g, beta, lamb, counts, initial_state=state, chunk_size=32)
    errors = [curve64[n] for n in counts]
    assert list(curve64) == counts
    assert all(later < earlier for earlier, later in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-9
    curve32 = cg_residual_curve(q.float(), k.float(), g.float(), beta.float(), lamb.float(), counts,
                                initial_state=state, chunk_size=32)
    assert curve32[64] < 1e-5 and curve32[4] > curve32[64]


@pytest.mark.parametrize("step_cg_steps", [None, 60])
def test_prefill_then_step_equals_full_call(step_cg_steps):
    B, T, H, K, V, prefill = 2, 70, 2, 32, 16, 50
    tensors, state = make_inputs(B, T, H, K, V, seed=5, with_state=True)
    tensors = [t.float() for t in tensors]
    state = MesaState(*(s.float() for s in state))
    q, k, v, g, beta, lamb = tensors
    o_full, final_full = mesa(*tensors, initial_state=state, output_final_state=True, backend="torch", cg_steps=60)
    o_pre, carried = mesa(q[:, :prefill], k[:, :prefill], v[:, :prefill], g[:, :prefill], beta[:, :prefill], lamb,
                          initial_state=state, output_final_state=True, backend="torch", cg_steps=60)
    decoded = [o_pre]
    for t in range(prefill, T):
        o_t, carried = mesa_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], lamb, carried, cg_steps=step_cg_steps)
        decoded.append(o_t[:, None])
    assert rel_err(torch.cat(decoded, dim=1), o_full) < TOL[torch.float32]
    assert rel_err(carried.h_kk, final_full.h_kk) < 1e-5
    assert rel_err(carried.h_kv, final_full.h_kv) < 1e-5


def test_step_from_no_state_is_one_token_reference():
    tensors, _ = make_inputs(3, 1, 2, 16, 60, seed=2, with_state=False)
    o_ref, final_ref = mesa(*tensors, output_final_state=True, backend="reference")
    q, k, v, g, beta, lamb = tensors
    o_t, new_state = mesa_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], lamb, None)
    assert rel_err(o_t, o_ref[:, 0]) < 1e-12 and rel_err(new_state.h_kk, final_ref.h_kk) < 1e-12


def _bad(**overrides):
    tensors, _ = make_inputs(1, 5, 2, 8, 4, seed=0, with_state=False)
    args = dict(zip(["q", "k", "v", "g", "beta", "lamb"], tensors))
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"lamb": torch.zeros(2, 8, dtype=F64)}, "lamb"),
        ({"lamb": -torch.ones(2, 8, dtype=F64)}, "lamb"),
        ({"lamb": torch.ones(8, dtype=F64)}, "lamb"),
        ({"beta": torch.full((1, 5, 2), 1.5, dtype=F64)}, "beta"),
        ({"beta": torch.zeros(1, 5, 2, dtype=F64)}, "beta"),
        ({"g": torch.full((1, 5, 2), 0.1, dtype=F64)}, "g"),
        ({"g": torch.zeros(1, 5, 2, 8, dtype=F64)}, "g"),
        ({"q": torch.zeros(5, 2, 8, dtype=F64)}, "q"),
        ({"v": torch.zeros(1, 5, 2, dtype=F64)}, "v"),
        ({"initial_state": MesaState(torch.zeros(1, 2, 8, 8), torch.zeros(1, 2, 8, 5))}, "initial_state.h_kv"),
        ({"cg_steps": -1}, "cg_steps"),
        ({"cg_tol": 0.0}, "cg_tol"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"backend": "flash_attn"}, "backend"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(overrides, match):
    with pytest.raises(ValueError, match=match):
        mesa(**_bad(**overrides))


def test_step_bad_arguments():
    tensors, _ = make_inputs(1, 1, 2, 8, 4, seed=0, with_state=False)
    q, k, v, g, beta, lamb = (t[:, 0] if t.dim() > 2 else t for t in tensors)
    with pytest.raises(ValueError, match="lamb"):
        mesa_step(q, k, v, g, beta, -lamb, None)
    with pytest.raises(ValueError, match="g_t"):
        mesa_step(q, k, v, g + 1.0, beta, lamb, None)
    with pytest.raises(ValueError, match="beta_t"):
        mesa_step(q, k, v, g, beta + 1.0, lamb, None)
    with pytest.raises(ValueError, match="k_t"):
        mesa_step(q, k[..., :4], v, g, beta, lamb, None)


EXTREMES = dict(
    lamb_lo=st.sampled_from([1e-4, 1e-2, 1.0]),
    beta_lo=st.sampled_from([1e-6, 1e-3, 0.5, 1.0]),
    g_lo=st.sampled_from([-1e-6, -0.05, -5.0, -50.0]),
    g_hi=st.sampled_from([0.0, -1e-6, -1.0]),
    T=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)


def _extreme_inputs(lamb_lo, beta_lo, g_lo, g_hi, T, seed):
    g_hi = min(g_hi, 0.0)
    g_lo = min(g_lo, g_hi)
    return make_inputs(1, T, 2, 8, 4, seed, with_state=True, g_range=(g_lo, g_hi),
                       lamb_range=(lamb_lo, 2 * lamb_lo), beta_range=(beta_lo, 1.0 if beta_lo == 1.0 else beta_lo * 2))


@settings(max_examples=25, deadline=None)
@given(**EXTREMES)
def test_hypothesis_reference_vs_explicit_at_extremes(lamb_lo, beta_lo, g_lo, g_hi, T, seed):
    tensors, state = _extreme_inputs(lamb_lo, beta_lo, g_lo, g_hi, T, seed)
    o, final = mesa(*tensors, initial_state=state, output_final_state=True, backend="reference")
    o_ref, final_ref = explicit_mesa(*tensors, 8**-0.5, state)
    assert rel_err(o, o_ref) < 1e-8
    assert rel_err(final.h_kk, final_ref.h_kk) < 1e-10


@settings(max_examples=25, deadline=None)
@given(**EXTREMES)
def test_hypothesis_chunked_at_extremes(lamb_lo, beta_lo, g_lo, g_hi, T, seed):
    """fp64 chunked CG (K = 8, 40 steps: CG is exact in K steps up to rounding) agrees with
    the reference however ill-conditioned; fp32 stays finite, gradients included."""
    tensors, state = _extreme_inputs(lamb_lo, beta_lo, g_lo, g_hi, T, seed)
    cot = cotangents_for(1, T, 2, 8, 4, seed)
    ref = run_with_grads("reference", tensors, state, F64, cot)
    out = run_with_grads("torch", tensors, state, F64, cot, chunk_size=16, cg_steps=40)
    for name in ref:
        assert rel_err(out[name], ref[name]) < 1e-6, name
    out32 = run_with_grads("torch", tensors, state, torch.float32, cot, chunk_size=16)
    for name, value in out32.items():
        assert torch.isfinite(value).all(), name


@pytest.mark.parametrize("wanted", [(True,) * 5, (False, True, False, True, False), (True, False, True, False, True)])
def test_bilinear_grads_match_autograd_of_the_matvec(wanted):
    """ChunkSystem.bilinear_grads (the torch backward's closed form) against autograd of
    sum(y * M x) through the mat-vec itself, fp64, a non-symmetric H0 so that a transposed
    term would show; fields not wanted come back None."""
    from kernels.mesa.system import ChunkSystem

    gen = torch.Generator().manual_seed(11)
    B, H, N, C, K = 2, 3, 2, 5, 4
    fields = [torch.rand(B, H, N, C, generator=gen, dtype=F64), torch.randn(B, H, N, K, K, generator=gen, dtype=F64),
              torch.randn(B, H, N, C, K, generator=gen, dtype=F64),
              torch.rand(B, H, N, C, C, generator=gen, dtype=F64).tril(),
              0.5 + torch.rand(H, K, generator=gen, dtype=F64)]
    x, y = (torch.randn(B, H, N, C, K, generator=gen, dtype=F64) for _ in range(2))
    leaves = [f.clone().requires_grad_() for f in fields]
    expected = torch.autograd.grad((y * ChunkSystem(*leaves).matvec(x)).sum(), leaves)
    got = ChunkSystem(*fields).bilinear_grads(y, x, wanted)
    for name, want, g, e in zip(("decay", "h0", "keys", "gamma_beta", "lamb"), wanted, got, expected):
        if want:
            torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")
        else:
            assert g is None, name


def test_chunked_refuses_a_second_derivative():
    """The implicit backward holds the CG solves fixed: its own derivative would be wrong, so
    differentiating it is an error instead of a silent approximation."""
    (q, k, v, g, beta, lamb), _ = make_inputs(1, 20, 1, 8, 8, seed=5, with_state=False)
    q.requires_grad_()
    o, _ = mesa(q, k, v, g, beta, lamb, backend="torch", cg_steps=6)
    (dq,) = torch.autograd.grad(o.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        dq.sum().backward()
