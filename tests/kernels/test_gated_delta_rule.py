"""Gated delta rule: the chunked torch form against the per-token reference (fp64), the
reference against the parallel matrix form of seed 003, states, decoding and bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import delta_rule, gated_delta_rule, gated_delta_rule_step
from kernels.gated_delta_rule.chunked import chunk_gated_delta_rule
from kernels.gated_delta_rule.reference import gated_delta_rule_reference
from tests.util import ROW_TOL, TOL, rel_err, row_err

# (T, K, V, with initial state): every T of docs/design.md §9 and every K, V value at least once.
CASES = [
    (1, 16, 32, True),
    (63, 32, 16, False),
    (64, 60, 100, True),
    (65, 64, 60, False),
    (300, 100, 64, True),
]
NAMES = ("q", "k", "v", "g", "beta", "h0")


def make_inputs(B, T, H, K, V, seed, with_state=True, g_range=(-1.0, 0.0), beta_range=(0.0, 1.0)):
    """fp64 leaves: unit-norm keys, g uniform in g_range, beta uniform in beta_range (beta > 0)."""
    gen = torch.Generator().manual_seed(seed)
    dt = torch.float64
    q = torch.randn(B, T, H, K, generator=gen, dtype=dt)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=dt), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=dt)
    lo, hi = g_range
    g = lo + (hi - lo) * torch.rand(B, T, H, generator=gen, dtype=dt)
    lo, hi = beta_range
    beta = (lo + (hi - lo) * torch.rand(B, T, H, generator=gen, dtype=dt)).clamp(min=1e-6)
    h0 = 0.5 * torch.randn(B, H, K, V, generator=gen, dtype=dt) if with_state else None
    return dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0)


def leaves(inputs, dtype):
    """Copies that require grad: q, k, v, g, beta in `dtype`, the state in fp32 (fp64 for fp64)."""
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    out = {}
    for name, x in inputs.items():
        if x is not None:
            x = x.to(state_dtype if name == "h0" else dtype).detach().requires_grad_()
        out[name] = x
    return out


def run_with_grads(fn, x, do, ds):
    """o, final state and the gradients of every input for cotangents do, ds."""
    o, s = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"])
    ((o.double() * do).sum() + (s.double() * ds).sum()).backward()
    return o, s, {n: x[n].grad for n in NAMES if x[n] is not None}


def compare_chunked_to_reference(T, K, V, with_state, dtype, chunk_size=64, seed=0):
    inputs = make_inputs(2, T, 2, K, V, seed, with_state)
    scale = K**-0.5
    low = leaves(inputs, dtype)
    exact = leaves({n: (x.detach().double() if x is not None else None) for n, x in low.items()}, torch.float64)
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(2, T, 2, V, generator=gen, dtype=torch.float64)
    ds = torch.randn(2, 2, K, V, generator=gen, dtype=torch.float64)

    def chunked(q, k, v, g, beta, h0):
        return chunk_gated_delta_rule(q, k, v, g, beta, scale, h0, True, chunk_size)

    def reference(q, k, v, g, beta, h0):
        return gated_delta_rule_reference(q, k, v, g, beta, scale, h0, True)

    o, s, grads = run_with_grads(chunked, low, do, ds)
    o_ref, s_ref, grads_ref = run_with_grads(reference, exact, do, ds)
    assert o.dtype == dtype and s.dtype == torch.float32
    tol = TOL[dtype]
    assert rel_err(o, o_ref) < tol and row_err(o, o_ref) < ROW_TOL[dtype]  # row_err: no token or head worse
    assert rel_err(s, s_ref) < tol and row_err(s, s_ref) < ROW_TOL[dtype]
    for name in grads:
        assert grads[name].dtype == low[name].dtype
        assert rel_err(grads[name], grads_ref[name]) < tol and row_err(grads[name], grads_ref[name]) < ROW_TOL[dtype], name


@pytest.mark.parametrize("T,K,V,with_state", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_matches_reference(T, K, V, with_state, dtype):
    compare_chunked_to_reference(T, K, V, with_state, dtype)


@pytest.mark.parametrize("chunk_size", [1, 16, 100])
def test_chunk_sizes(chunk_size):
    compare_chunked_to_reference(65, 32, 16, True, torch.float32, chunk_size=chunk_size, seed=3)


def gdn_parallel_form(q, k, v, g, beta, scale, h0):
    """Seed 003's parallel form of Gated DeltaNet, with beta and an initial state, in one dense
    solve over the whole sequence (no chunks, no recurrence). Derivation: with the pseudo-value
    u_t = beta_t (v_t - e^{g_t} h_{t-1}^T k_t) the recurrence reads h_t = e^{g_t} h_{t-1} + k_t u_t^T,
    so h_t = Gamma_t0 S0 + sum_{j<=t} Gamma_tj k_j u_j^T with Gamma_tj = exp(g_{j+1} + ... + g_t).
    Substituting into u_t gives the lower-triangular system
        (I + diag(beta) (K K^T ⊙ Gamma^-)) U = diag(beta) (V - diag(Gamma_.0) K S0),
    Gamma^- the strictly-lower part; beta multiplies rows (it sits left of K K^T and of V), so
    O = diag(Gamma_.0) Q S0 + (Q K^T ⊙ Gamma) (I + diag(beta)(K K^T ⊙ Gamma^-))^{-1} diag(beta)(V - ...),
    which is seed 003's (Q K^T ⊙ Γ)(I + K K^T ⊙ Γ^-)^{-1} V once beta = 1 and S0 = 0.
    Heads-first tensors: q, k [B, H, T, K], v [B, H, T, V], g, beta [B, H, T], h0 [B, H, K, V]."""
    T = q.shape[2]
    cum = g.cumsum(-1)
    lower = torch.ones(T, T, dtype=torch.bool).tril()
    decay = torch.where(lower, (cum.unsqueeze(-1) - cum.unsqueeze(-2)).clamp(max=0).exp(), 0.0)
    decay_from_start = cum.exp().unsqueeze(-1)  # Gamma_t0: [B, H, T, 1]
    system = torch.eye(T, dtype=q.dtype) + beta.unsqueeze(-1) * (k @ k.transpose(-1, -2) * decay).tril(-1)
    rhs = beta.unsqueeze(-1) * (v - decay_from_start * (k @ h0))
    u = torch.linalg.solve(system, rhs)  # dense LU: independent of the triangular solves
    o = decay_from_start * ((q * scale) @ h0) + ((q * scale) @ k.transpose(-1, -2) * decay) @ u
    decay_to_end = decay[..., -1, :].unsqueeze(-1)  # Gamma_Tj: [B, H, T, 1]
    state = cum[..., -1, None, None].exp() * h0 + (k * decay_to_end).transpose(-1, -2) @ u
    return o, state


@pytest.mark.parametrize("T,K,V", [(1, 16, 16), (37, 32, 60), (100, 64, 100)])
def test_reference_matches_parallel_form(T, K, V):
    x = make_inputs(2, T, 3, K, V, seed=T, g_range=(-2.0, 0.0))
    scale = K**-0.5
    o_ref, s_ref = gated_delta_rule_reference(x["q"], x["k"], x["v"], x["g"], x["beta"], scale, x["h0"], True)
    heads_first = {n: t.transpose(1, 2) if n != "h0" else t for n, t in x.items()}
    o_par, s_par = gdn_parallel_form(*(heads_first[n] for n in NAMES[:5]), scale, x["h0"])
    assert rel_err(o_ref, o_par.transpose(1, 2)) < 1e-12
    assert rel_err(s_ref, s_par) < 1e-12


def test_zero_gate_equals_delta_rule():
    x = make_inputs(2, 70, 2, 32, 16, seed=5)
    args = [x[n].float() for n in ("q", "k", "v")]
    beta, h0 = x["beta"].float(), x["h0"].float()
    zero = torch.zeros_like(beta)
    for backend in ("torch", "reference"):
        o_g, s_g = gated_delta_rule(*args, zero, beta, initial_state=h0, output_final_state=True, backend=backend)
        o_d, s_d = delta_rule(*args, beta, initial_state=h0, output_final_state=True, backend=backend)
        assert rel_err(o_g, o_d) < 1e-6 and rel_err(s_g, s_d) < 1e-6


def test_public_op_backends_and_dtypes():
    x = make_inputs(1, 40, 2, 16, 32, seed=6)
    args = [x[n].to(torch.bfloat16) for n in ("q", "k", "v", "g", "beta")]
    o_ref, s_ref = gated_delta_rule(*(a.double() for a in args), output_final_state=True, backend="reference")
    for backend in ("auto", "torch", "reference"):
        o, s = gated_delta_rule(*args, output_final_state=True, backend=backend)
        assert o.dtype == torch.bfloat16 and s.dtype == torch.float32 and o.shape == (1, 40, 2, 32)
        assert rel_err(o, o_ref) < TOL[torch.bfloat16] and rel_err(s, s_ref) < TOL[torch.bfloat16]
    o, s = gated_delta_rule(*args)
    assert s is None


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_continuation_and_decode(backend):
    """Prefill then one call more, and prefill then step-by-step decode, equal one full call."""
    x = make_inputs(2, 90, 2, 32, 16, seed=7)
    f = {n: t.float() for n, t in x.items()}
    o_ref, s_ref = gated_delta_rule_reference(*(x[n] for n in NAMES[:5]), 32**-0.5, x["h0"], True)

    def part(a, b, state):
        sl = slice(a, b)
        return gated_delta_rule(f["q"][:, sl], f["k"][:, sl], f["v"][:, sl], f["g"][:, sl], f["beta"][:, sl],
                                initial_state=state, output_final_state=True, backend=backend)

    o1, s1 = part(0, 50, f["h0"])
    o2, s2 = part(50, 90, s1)
    assert rel_err(torch.cat([o1, o2], 1), o_ref) < TOL[torch.float32] and rel_err(s2, s_ref) < TOL[torch.float32]
    state, outs = s1, []
    for t in range(50, 90):
        token = [f[n][:, t] for n in NAMES[:5]]
        o_t, state = gated_delta_rule_step(*token, state)
        outs.append(o_t)
    assert rel_err(torch.cat([o1, torch.stack(outs, 1)], 1), o_ref) < TOL[torch.float32]
    assert state.dtype == torch.float32 and rel_err(state, s_ref) < TOL[torch.float32]


def test_step_from_empty_state():
    x = make_inputs(2, 1, 2, 16, 16, seed=8, with_state=False)
    f = {n: t.float() for n, t in x.items() if t is not None}
    o, s = gated_delta_rule(f["q"], f["k"], f["v"], f["g"], f["beta"], output_final_state=True, backend="reference")
    o_t, s_t = gated_delta_rule_step(f["q"][:, 0], f["k"][:, 0], f["v"][:, 0], f["g"][:, 0], f["beta"][:, 0], None)
    assert rel_err(o_t, o[:, 0]) < 1e-6 and rel_err(s_t, s) < 1e-6


BETA_RANGES = {"beta near 0": (1e-6, 1e-2), "beta near 1": (0.99, 1.0)}
G_RANGES = {"g near 0": (-1e-4, 0.0), "g very negative": (-60.0, -5.0)}


@settings(max_examples=16, deadline=None)
@given(
    beta_name=st.sampled_from(sorted(BETA_RANGES)),
    g_name=st.sampled_from(sorted(G_RANGES)),
    T=st.integers(1, 90),
    chunk_size=st.sampled_from([16, 64]),
    seed=st.integers(0, 2**16),
)
def test_extreme_gates_property(beta_name, g_name, T, chunk_size, seed):
    x = make_inputs(1, T, 2, 16, 8, seed, g_range=G_RANGES[g_name], beta_range=BETA_RANGES[beta_name])
    scale = 16**-0.5
    low = leaves(x, torch.float32)
    exact = leaves({n: (t.detach().double() if t is not None else None) for n, t in low.items()}, torch.float64)
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(1, T, 2, 8, generator=gen, dtype=torch.float64)
    ds = torch.randn(1, 2, 16, 8, generator=gen, dtype=torch.float64)
    o, s, grads = run_with_grads(
        lambda *a: chunk_gated_delta_rule(*a[:5], scale, a[5], True, chunk_size), low, do, ds)
    o_ref, s_ref, grads_ref = run_with_grads(
        lambda *a: gated_delta_rule_reference(*a[:5], scale, a[5], True), exact, do, ds)
    assert rel_err(o, o_ref) < TOL[torch.float32] and rel_err(s, s_ref) < TOL[torch.float32]
    for name in grads:
        assert rel_err(grads[name], grads_ref[name]) < TOL[torch.float32], name


def _good():
    x = make_inputs(2, 5, 2, 8, 4, seed=9)
    return dict(q=x["q"].float(), k=x["k"].float(), v=x["v"].float(), g=x["g"].float(), beta=x["beta"].float())


BAD_INPUTS = [
    ("q", lambda a: a.update(q=a["q"][0])),
    ("q and k", lambda a: a.update(k=a["k"][:, :, :, :4])),
    ("v", lambda a: a.update(v=a["v"][:1])),
    ("g", lambda a: a.update(g=a["g"].abs() + 0.1)),
    ("g", lambda a: a.update(g=a["g"][..., None])),
    ("beta", lambda a: a.update(beta=a["beta"] + 1.0)),
    ("beta", lambda a: a.update(beta=torch.zeros_like(a["beta"]))),
    ("beta", lambda a: a.update(beta=a["beta"][:, :3])),
    ("initial_state", lambda a: a.update(initial_state=torch.zeros(2, 2, 4, 8))),
    ("backend", lambda a: a.update(backend="cuda_magic")),
    ("chunk_size", lambda a: a.update(chunk_size=0)),
    ("scale", lambda a: a.update(scale=-1.0)),
]


@pytest.mark.parametrize("name,spoil", BAD_INPUTS)
def test_bad_input_names_the_argument(name, spoil):
    args = _good()
    spoil(args)
    with pytest.raises(ValueError, match=name):
        gated_delta_rule(**args)


def test_bad_step_input():
    a = {n: t[:, 0] for n, t in _good().items()}
    with pytest.raises(ValueError, match="q_t"):
        gated_delta_rule_step(a["q"][None], a["k"], a["v"], a["g"], a["beta"], None)
    with pytest.raises(ValueError, match="g_t"):
        gated_delta_rule_step(a["q"], a["k"], a["v"], -a["g"] + 0.1, a["beta"], None)
    with pytest.raises(ValueError, match="beta_t"):
        gated_delta_rule_step(a["q"], a["k"], a["v"], a["g"], a["beta"] + 1.0, None)
    with pytest.raises(ValueError, match="state"):
        gated_delta_rule_step(a["q"], a["k"], a["v"], a["g"], a["beta"], torch.zeros(2, 2, 8, 5))
