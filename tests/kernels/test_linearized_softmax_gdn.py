"""Linearized softmax GDN (docs/design.md §7) and VaLA: the §7 recurrence against its GDN mapping,
the chunked torch form against the reference (fp64), continuation through LinGDNState,
decoding, the t = 1 step, first-order agreement with softmax, and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import LinGDNState, linearized_softmax_gdn, linearized_softmax_gdn_step, vala_attention
from kernels.gated_delta_rule.reference import gated_delta_rule_reference
from kernels.linearized_softmax_gdn.chunked import chunk_linearized_softmax_gdn, gdn_gates
from kernels.linearized_softmax_gdn.reference import linearized_softmax_gdn_reference
from kernels.linearized_softmax_gdn.vala import vala_reference, vala_torch
from tests.util import TOL, rel_err

# (T, K, V, tokens already in the initial state): every T of docs/design.md §9, every K and V value.
CASES = [
    (1, 16, 60, 0),
    (63, 32, 64, 5),
    (64, 60, 16, 0),
    (65, 64, 100, 1),
    (300, 100, 32, 40),
]


def make_inputs(B, T, H, K, V, seed, count=0):
    """fp64 q, k, v (keys of norm about 1, so the recurrence contracts) and a state that has
    seen `count` random tokens (None when count = 0)."""
    gen = torch.Generator().manual_seed(seed)
    dt = torch.float64
    q = torch.randn(B, T, H, K, generator=gen, dtype=dt)
    k = torch.randn(B, T, H, K, generator=gen, dtype=dt) / math.sqrt(K)
    v = torch.randn(B, T, H, V, generator=gen, dtype=dt)
    state = None
    if count:
        state = LinGDNState(
            h=0.3 * torch.randn(B, H, K, V, generator=gen, dtype=dt),
            k_sum=torch.randn(B, H, K, generator=gen, dtype=dt) * math.sqrt(count / K),
            v_sum=torch.randn(B, H, V, generator=gen, dtype=dt) * math.sqrt(count),
            count=count,
        )
    return q, k, v, state


def gdn_mapping(q, k, v, scale, state):
    """§7 through the gated delta rule reference, the mapping written out here: at absolute
    position t, g_t = log(1 - 1/t) (exactly -inf at t = 1: the loop multiplies by exp(-inf) = 0),
    beta_t = 1/(t - 1) (1 at t = 1, where the key is 0), key u_t = k_t - kbar_t, value
    (1 - 1/t)(v_t - vbar_{t-1}); o_t = GDN_t + vbar_t."""
    B, T, H, _ = q.shape
    count = state.count if state is not None else 0
    k_sum = state.k_sum if state is not None else torch.zeros_like(k[:, 0])
    v_sum = state.v_sum if state is not None else torch.zeros_like(v[:, 0])
    t = torch.arange(count + 1, count + T + 1, dtype=q.dtype)
    k_mean = (k_sum.unsqueeze(1) + k.cumsum(1)) / t[:, None, None]
    v_cum = v_sum.unsqueeze(1) + v.cumsum(1)
    v_mean_prev = torch.cat([v_sum.unsqueeze(1), v_cum[:, :-1]], 1) / (t - 1).clamp(min=1)[:, None, None]
    g = torch.log(1 - 1 / t)[None, :, None].expand(B, T, H)
    beta = torch.where(t > 1, 1 / (t - 1).clamp(min=1), 1.0)[None, :, None].expand(B, T, H)
    value = (1 - 1 / t)[:, None, None] * (v - v_mean_prev)
    h0 = state.h if state is not None else None
    o, h = gated_delta_rule_reference(q, k - k_mean, value, g, beta, scale, h0, True)
    return o + v_cum / t[:, None, None], h


@pytest.mark.parametrize("T,count", [(1, 0), (2, 0), (70, 0), (70, 9)])
def test_section7_recurrence_equals_gdn_mapping(T, count):
    q, k, v, state = make_inputs(2, T, 2, 16, 24, seed=T + count, count=count)
    o_ref, s_ref = linearized_softmax_gdn_reference(q, k, v, 0.25, state, True)
    o_map, h_map = gdn_mapping(q, k, v, 0.25, state)
    assert rel_err(o_ref, o_map) < 1e-12 and rel_err(s_ref.h, h_map) < 1e-12
    assert s_ref.count == count + T


def test_gates_telescope():
    """exp(g_{s+1} + ... + g_t) = s / t, and beta_t in (0, 1] from t = 2 on."""
    positions = torch.arange(1, 201, dtype=torch.float64)
    g, beta = gdn_gates(positions, torch.float64)
    decay = torch.exp(g[1:].cumsum(0))  # from s = 1 to t = 2..200
    assert torch.allclose(decay, 1 / positions[1:], rtol=1e-12)
    assert g[0] == 0 and beta[0] == 1 and beta[1] == 1 and (beta[1:] <= 1).all() and (beta > 0).all()


def grads_of(fn, leaves, do, ds):
    o, s = fn(*leaves)
    ((o.double() * do).sum() + (s.h.double() * ds).sum()).backward()
    return o, s, [x.grad for x in leaves]


@pytest.mark.parametrize("T,K,V,count", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_matches_reference(T, K, V, count, dtype):
    q, k, v, state = make_inputs(2, T, 2, K, V, seed=T, count=count)
    scale = K**-0.5
    low = [x.to(dtype).requires_grad_() for x in (q, k, v)]
    if state is not None:
        low += [x.float().requires_grad_() for x in state[:3]]
    exact = [x.detach().double().requires_grad_() for x in low]

    def run(chunked):
        def fn(*xs):
            st_ = LinGDNState(*xs[3:], count=count) if count else None
            if chunked:
                return chunk_linearized_softmax_gdn(*xs[:3], scale, st_, True, 64)
            return linearized_softmax_gdn_reference(*xs[:3], scale, st_, True)
        return fn

    gen = torch.Generator().manual_seed(T)
    do = torch.randn(2, T, 2, V, generator=gen, dtype=torch.float64)
    ds = torch.randn(2, 2, K, V, generator=gen, dtype=torch.float64)
    o, s, grads = grads_of(run(True), low, do, ds)
    o_ref, s_ref, grads_ref = grads_of(run(False), exact, do, ds)
    tol = TOL[dtype]
    assert o.dtype == dtype and s.h.dtype == torch.float32 and s.count == count + T
    assert rel_err(o, o_ref) < tol
    for name in ("h", "k_sum", "v_sum"):
        assert rel_err(getattr(s, name), getattr(s_ref, name)) < tol, name
    for name, g, g_ref in zip(("q", "k", "v", "h", "k_sum", "v_sum"), grads, grads_ref):
        assert torch.isfinite(g).all() and rel_err(g, g_ref) < tol, name


@settings(max_examples=10, deadline=None)
@given(T=st.integers(2, 150), split=st.floats(0.0, 1.0), chunk_size=st.sampled_from([8, 64]),
       seed=st.integers(0, 2**16))
def test_continuation_equals_one_call(T, split, chunk_size, seed):
    q, k, v, _ = make_inputs(1, T, 2, 16, 8, seed)
    f = [x.float() for x in (q, k, v)]
    o_ref, s_ref = linearized_softmax_gdn_reference(q, k, v, 0.25, None, True)
    cut = max(1, min(T - 1, round(split * T)))
    for backend in ("torch", "reference"):
        o1, s1 = linearized_softmax_gdn(*(x[:, :cut] for x in f), scale=0.25, output_final_state=True,
                                        backend=backend, chunk_size=chunk_size)
        o2, s2 = linearized_softmax_gdn(*(x[:, cut:] for x in f), scale=0.25, initial_state=s1,
                                        output_final_state=True, backend=backend, chunk_size=chunk_size)
        assert s1.count == cut and s2.count == T
        assert rel_err(torch.cat([o1, o2], 1), o_ref) < 1e-4 and rel_err(s2.h, s_ref.h) < 1e-4


def test_prefill_then_decode():
    q, k, v, state = make_inputs(2, 90, 2, 32, 16, seed=21, count=7)
    o_ref, s_ref = linearized_softmax_gdn_reference(q, k, v, 32**-0.5, state, True)
    f = [x.float() for x in (q, k, v)]
    st32 = LinGDNState(*(x.float() for x in state[:3]), count=7)
    o1, s = linearized_softmax_gdn(*(x[:, :50] for x in f), initial_state=st32, output_final_state=True)
    outs = []
    for t in range(50, 90):
        o_t, s = linearized_softmax_gdn_step(f[0][:, t], f[1][:, t], f[2][:, t], s)
        outs.append(o_t)
    assert s.count == 97 and s.h.dtype == torch.float32
    assert rel_err(torch.cat([o1, torch.stack(outs, 1)], 1), o_ref) < 1e-4 and rel_err(s.h, s_ref.h) < 1e-4


def test_decode_from_nothing_equals_call():
    q, k, v, _ = make_inputs(1, 6, 2, 16, 8, seed=22)
    o_ref, _ = linearized_softmax_gdn_reference(q, k, v, 0.25)
    s, outs = None, []
    for t in range(6):
        o_t, s = linearized_softmax_gdn_step(q[:, t], k[:, t], v[:, t], s, scale=0.25)
        outs.append(o_t)
    assert rel_err(torch.stack(outs, 1), o_ref) < 1e-12


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_first_token_is_exact_and_finite(backend):
    """At t = 1 softmax attention returns v_1 whatever q is; nothing is inf or NaN, in values
    or gradients, and a state with count 0 is the empty state."""
    q, k, v, _ = make_inputs(2, 3, 2, 16, 8, seed=23)
    leaves = [x.float().requires_grad_() for x in (q, k, v)]
    o, s = linearized_softmax_gdn(*leaves, output_final_state=True, backend=backend)
    assert torch.equal(o[:, 0], leaves[2][:, 0].detach())
    o.square().sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in leaves)
    junk = LinGDNState(torch.randn_like(s.h), torch.randn_like(s.k_sum), torch.randn_like(s.v_sum), count=0)
    o_junk, _ = linearized_softmax_gdn(*(x.detach() for x in leaves), initial_state=junk, backend=backend)
    assert torch.equal(o_junk, o.detach())


def test_first_order_agreement_with_softmax():
    """Both linearizations are exact to first order in the logits: halving q and k (a quarter
    of the logits) must cut their error against softmax attention by well over 2x."""
    gen = torch.Generator().manual_seed(24)
    q0, k0, v = (torch.randn(1, 80, 2, d, generator=gen, dtype=torch.float64) for d in (16, 16, 8))
    errs = {"gdn": [], "vala": []}
    for eps in (0.4, 0.2):
        q, k = q0 * eps, k0 * eps
        soft = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
        errs["gdn"].append(rel_err(linearized_softmax_gdn(q, k, v)[0], soft))
        errs["vala"].append(rel_err(vala_attention(q, k, v)[0], soft))
    for name, (big, small) in errs.items():
        assert small < 0.1 and big / small > 3.0, (name, big, small)


@pytest.mark.parametrize("T,K,V", [(1, 16, 16), (65, 32, 60), (300, 100, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vala_torch_matches_reference(T, K, V, dtype):
    q, k, v, _ = make_inputs(2, T, 2, K, V, seed=T)
    low = [x.to(dtype).requires_grad_() for x in (q, k, v)]
    exact = [x.detach().double().requires_grad_() for x in low]
    do = torch.randn(2, T, 2, V, dtype=torch.float64, generator=torch.Generator().manual_seed(T))
    o = vala_torch(*low, K**-0.5)
    o_ref = vala_reference(*exact, K**-0.5)
    ((o.double() * do).sum()).backward()
    ((o_ref * do).sum()).backward()
    assert o.dtype == dtype and rel_err(o, o_ref) < TOL[dtype]
    for name, a, b in zip("qkv", low, exact):
        assert rel_err(a.grad, b.grad) < TOL[dtype], name


def test_vala_reference_matches_definition():
    """The loop against the formula evaluated with cumulative sums of outer products (fp64)."""
    q, k, v, _ = make_inputs(2, 50, 2, 8, 6, seed=25)
    t = torch.arange(1, 51, dtype=torch.float64)[:, None, None]
    k_mean, v_mean = k.cumsum(1) / t, v.cumsum(1) / t
    moment = torch.einsum("bthk,bthv->bthkv", k, v).cumsum(1) / t[..., None]
    a = moment - k_mean.unsqueeze(-1) * v_mean.unsqueeze(-2)
    o_def = v_mean + torch.einsum("bthk,bthkv->bthv", q * 0.5, a)
    assert rel_err(vala_reference(q, k, v, 0.5), o_def) < 1e-12
    for backend in ("auto", "torch", "reference"):
        o, none = vala_attention(q, k, v, scale=0.5, backend=backend)
        assert none is None and rel_err(o, o_def) < 1e-12


def _good():
    q, k, v, _ = make_inputs(2, 5, 2, 8, 4, seed=26)
    return dict(q=q.float(), k=k.float(), v=v.float())


def _state(**change):
    base = dict(h=torch.zeros(2, 2, 8, 4), k_sum=torch.zeros(2, 2, 8), v_sum=torch.zeros(2, 2, 4), count=3)
    base.update(change)
    return LinGDNState(**base)


BAD_INPUTS = [
    ("q", dict(q=torch.zeros(2, 5, 8))),
    ("v", dict(v=torch.zeros(2, 4, 2, 4))),
    ("initial_state.h", dict(initial_state=_state(h=torch.zeros(2, 2, 4, 8)))),
    ("initial_state.k_sum", dict(initial_state=_state(k_sum=torch.zeros(2, 8)))),
    ("initial_state.v_sum", dict(initial_state=_state(v_sum=torch.zeros(2, 2, 5)))),
    ("initial_state.count", dict(initial_state=_state(count=-1))),
    ("initial_state.count", dict(initial_state=_state(count=2.0))),
    ("initial_state", dict(initial_state=(torch.zeros(2, 2, 8, 4), torch.zeros(2, 2, 8), torch.zeros(2, 2, 4)))),
    ("backend", dict(backend="exact")),
    ("chunk_size", dict(chunk_size=-4)),
]


@pytest.mark.parametrize("name,change", BAD_INPUTS)
def test_bad_input_names_the_argument(name, change):
    args = {**_good(), **change}
    with pytest.raises(ValueError, match=name):
        linearized_softmax_gdn(**args)


def test_bad_vala_and_step_input():
    a = _good()
    with pytest.raises(ValueError, match="backend"):
        vala_attention(**a, backend="triton")
    with pytest.raises(ValueError, match="q and k"):
        vala_attention(a["q"], a["k"][:, :3], a["v"])
    with pytest.raises(ValueError, match="state.h"):
        linearized_softmax_gdn_step(a["q"][:, 0], a["k"][:, 0], a["v"][:, 0], _state(h=torch.zeros(1, 2, 8, 4)))
    with pytest.raises(ValueError, match="v_t"):
        linearized_softmax_gdn_step(a["q"][:, 0], a["k"][:, 0], a["v"][:1, 0], None)
