"""DeltaNet: the chunked torch form against the per-token reference (fp64), the reference
against seed 003's parallel matrix form, unnormalised keys, states, decoding and bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import delta_rule, delta_rule_step
from kernels.delta_rule.chunked import chunk_delta_rule
from kernels.delta_rule.reference import delta_rule_reference
from kernels.gated_delta_rule.reference import gated_delta_rule_reference
from tests.util import ROW_TOL, TOL, rel_err, row_err

# (T, K, V, with initial state): every T of docs/design.md §9 and every K, V value at least once.
CASES = [
    (1, 100, 16, False),
    (63, 16, 100, True),
    (64, 32, 60, False),
    (65, 60, 32, True),
    (300, 64, 64, True),
]
NAMES = ("q", "k", "v", "beta", "h0")


def make_inputs(B, T, H, K, V, seed, with_state=True, beta_range=(0.0, 1.0), key_norm=None):
    """fp64 tensors: keys of unit norm (or of norm uniform in key_norm), beta uniform in beta_range."""
    gen = torch.Generator().manual_seed(seed)
    dt = torch.float64
    q = torch.randn(B, T, H, K, generator=gen, dtype=dt)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=dt), dim=-1)
    if key_norm is not None:
        lo, hi = key_norm
        k = k * (lo + (hi - lo) * torch.rand(B, T, H, 1, generator=gen, dtype=dt))
    v = torch.randn(B, T, H, V, generator=gen, dtype=dt)
    lo, hi = beta_range
    beta = (lo + (hi - lo) * torch.rand(B, T, H, generator=gen, dtype=dt)).clamp(min=1e-6)
    h0 = 0.5 * torch.randn(B, H, K, V, generator=gen, dtype=dt) if with_state else None
    return dict(q=q, k=k, v=v, beta=beta, h0=h0)


def leaf_pair(inputs, dtype):
    """(low, exact): leaves in `dtype` (state fp32) and fp64 leaves holding the same values."""
    low = {}
    for name, x in inputs.items():
        if x is not None:
            x = x.to(torch.float32 if name == "h0" else dtype).detach().requires_grad_()
        low[name] = x
    exact = {n: (x.detach().double().requires_grad_() if x is not None else None) for n, x in low.items()}
    return low, exact


def run_with_grads(fn, x, do, ds):
    o, s = fn(*(x[n] for n in NAMES))
    ((o.double() * do).sum() + (s.double() * ds).sum()).backward()
    return o, s, {n: x[n].grad for n in NAMES if x[n] is not None}


def check_chunked(inputs, dtype, chunk_size=64, seed=0):
    B, T, H, K = inputs["q"].shape
    V = inputs["v"].shape[-1]
    scale = K**-0.5
    low, exact = leaf_pair(inputs, dtype)
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    ds = torch.randn(B, H, K, V, generator=gen, dtype=torch.float64)
    o, s, grads = run_with_grads(lambda q, k, v, b, h: chunk_delta_rule(q, k, v, b, scale, h, True, chunk_size),
                                 low, do, ds)
    o_ref, s_ref, grads_ref = run_with_grads(lambda q, k, v, b, h: delta_rule_reference(q, k, v, b, scale, h, True),
                                             exact, do, ds)
    tol = TOL[dtype]
    assert o.dtype == dtype and s.dtype == torch.float32
    assert rel_err(o, o_ref) < tol and rel_err(s, s_ref) < tol
    assert row_err(o, o_ref) < ROW_TOL[dtype] and row_err(s, s_ref) < ROW_TOL[dtype]  # no token or head worse than tol
    for name in grads:
        assert rel_err(grads[name], grads_ref[name]) < tol and row_err(grads[name], grads_ref[name]) < ROW_TOL[dtype], name


@pytest.mark.parametrize("T,K,V,with_state", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_matches_reference(T, K, V, with_state, dtype):
    check_chunked(make_inputs(2, T, 2, K, V, seed=T, with_state=with_state), dtype)


def test_unnormalised_keys_within_the_stability_bound():
    """Raw keys of norm up to 1.4 with beta <= 1: beta ||k||^2 <= 1.96 < 2, still a contraction."""
    check_chunked(make_inputs(2, 150, 2, 32, 32, seed=11, key_norm=(0.2, 1.4)), torch.float32, chunk_size=32)


def deltanet_parallel_form(q, k, v, beta, scale, h0):
    """Seed 003's parallel DeltaNet, with beta and an initial state, as one dense solve.

    Where beta goes (derived here, the seed absorbs it into k and v): the pseudo-value
    u_t = beta_t (v_t - h_{t-1}^T k_t) turns the recurrence into h_t = h_{t-1} + k_t u_t^T,
    so h_{t-1} = S0 + sum_{j<t} k_j u_j^T and
        u_t + beta_t sum_{j<t} (k_t . k_j) u_j = beta_t (v_t - S0^T k_t).
    beta scales whole rows: U = (I + diag(beta)(K K^T ⊙ M^-))^{-1} diag(beta) (V - K S0), and
        O = Q S0 + (Q K^T ⊙ M) U,      final state S0 + K^T U.
    With S0 = 0 this is O = (Q K^T ⊙ M)(I + diag(beta)(K K^T ⊙ M^-))^{-1} diag(beta) V.
    Heads-first: q, k [B, H, T, K]; v [B, H, T, V]; beta [B, H, T]; h0 [B, H, K, V]."""
    T = q.shape[2]
    q = q * scale
    system = torch.eye(T, dtype=q.dtype) + beta.unsqueeze(-1) * (k @ k.transpose(-1, -2)).tril(-1)
    u = torch.linalg.solve(system, beta.unsqueeze(-1) * (v - k @ h0))
    o = q @ h0 + (q @ k.transpose(-1, -2)).tril() @ u
    return o, h0 + k.transpose(-1, -2) @ u


@pytest.mark.parametrize("T,K,V", [(1, 16, 16), (50, 32, 60), (120, 64, 100)])
def test_reference_matches_parallel_form(T, K, V):
    x = make_inputs(2, T, 3, K, V, seed=T)
    o_ref, s_ref = delta_rule_reference(*(x[n] for n in NAMES[:4]), K**-0.5, x["h0"], True)
    hf = {n: t.transpose(1, 2) for n, t in x.items() if n != "h0"}
    o_par, s_par = deltanet_parallel_form(hf["q"], hf["k"], hf["v"], hf["beta"], K**-0.5, x["h0"])
    assert rel_err(o_ref, o_par.transpose(1, 2)) < 1e-12 and rel_err(s_ref, s_par) < 1e-12


def test_reference_equals_ungated_gdn_reference():
    x = make_inputs(2, 40, 2, 16, 24, seed=12)
    o, s = delta_rule_reference(*(x[n] for n in NAMES[:4]), 0.3, x["h0"], True)
    for gate in (None, torch.zeros_like(x["beta"])):
        o_g, s_g = gated_delta_rule_reference(x["q"], x["k"], x["v"], gate, x["beta"], 0.3, x["h0"], True)
        assert rel_err(o_g, o) < 1e-13 and rel_err(s_g, s) < 1e-13


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_continuation_and_decode(backend):
    x = make_inputs(2, 80, 2, 16, 32, seed=13)
    f = {n: t.float() for n, t in x.items()}
    o_ref, s_ref = delta_rule_reference(*(x[n] for n in NAMES[:4]), 0.25, x["h0"], True)

    def part(a, b, state):
        return delta_rule(*(f[n][:, a:b] for n in NAMES[:4]), initial_state=state,
                          output_final_state=True, backend=backend)

    o1, s1 = part(0, 33, f["h0"])
    o2, s2 = part(33, 80, s1)
    assert rel_err(torch.cat([o1, o2], 1), o_ref) < TOL[torch.float32] and rel_err(s2, s_ref) < TOL[torch.float32]
    state, outs = s1, []
    for t in range(33, 80):
        o_t, state = delta_rule_step(f["q"][:, t], f["k"][:, t], f["v"][:, t], f["beta"][:, t], state)
        outs.append(o_t)
    assert rel_err(torch.cat([o1, torch.stack(outs, 1)], 1), o_ref) < TOL[torch.float32]
    assert rel_err(state, s_ref) < TOL[torch.float32]


def test_public_op_dtypes():
    x = make_inputs(1, 20, 2, 16, 8, seed=14, with_state=False)
    args = [x[n].half() for n in NAMES[:4]]
    for backend in ("auto", "torch", "reference"):
        o, s = delta_rule(*args, output_final_state=True, backend=backend)
        assert o.dtype == torch.float16 and s.dtype == torch.float32
    o64, s64 = delta_rule(*(x[n] for n in NAMES[:4]), output_final_state=True)
    assert o64.dtype == torch.float64 and s64.dtype == torch.float64


@settings(max_examples=12, deadline=None)
@given(near_one=st.booleans(), T=st.integers(1, 100), seed=st.integers(0, 2**16))
def test_beta_extremes_property(near_one, T, seed):
    beta_range = (0.99, 1.0) if near_one else (1e-6, 1e-2)
    x = make_inputs(1, T, 2, 16, 8, seed, beta_range=beta_range)
    check_chunked(x, torch.float32, chunk_size=32, seed=seed)


def _good():
    x = make_inputs(2, 5, 2, 8, 4, seed=15)
    return {n: x[n].float() for n in NAMES[:4]}


BAD_INPUTS = [
    ("q", lambda a: a.update(q=a["q"][0])),
    ("q and k", lambda a: a.update(k=a["k"][:, :4])),
    ("v", lambda a: a.update(v=a["v"][:, :, :1])),
    ("beta", lambda a: a.update(beta=a["beta"] * 3.0)),
    ("beta", lambda a: a.update(beta=-a["beta"])),
    ("beta", lambda a: a.update(beta=a["beta"][..., None])),
    ("initial_state", lambda a: a.update(initial_state=torch.zeros(2, 2, 8))),
    ("backend", lambda a: a.update(backend="fast")),
    ("chunk_size", lambda a: a.update(chunk_size=2.5)),
]


@pytest.mark.parametrize("name,spoil", BAD_INPUTS)
def test_bad_input_names_the_argument(name, spoil):
    args = _good()
    spoil(args)
    with pytest.raises(ValueError, match=name):
        delta_rule(**args)


def test_bad_step_input():
    a = {n: t[:, 0] for n, t in _good().items()}
    with pytest.raises(ValueError, match="k_t"):
        delta_rule_step(a["q"], a["k"][..., :3], a["v"], a["beta"], None)
    with pytest.raises(ValueError, match="beta_t"):
        delta_rule_step(a["q"], a["k"], a["v"], a["beta"] * 0.0, None)
