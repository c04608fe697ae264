"""Triton linearized softmax GDN (DESIGN §7) against its per-token recurrence in fp64, on the
CPU interpreter (conftest: TRITON_INTERPRET=1, NaN-poisoned buffers).

Fresh start (count = 0, where t = 1 must write nothing and produce no inf/NaN in values or
gradients) and a continued state (count > 0); outputs, the final LinGDNState and the
gradients of q, k, v and of the state's h, k_sum, v_sum."""

from __future__ import annotations

import pytest
import torch

from tests.util import TOL, rel_err

lin = pytest.importorskip("kernels.linearized_softmax_gdn")
if not hasattr(lin, "LinGDNState"):
    pytest.skip("kernels.linearized_softmax_gdn (LinGDNState) is not written yet", allow_module_level=True)

from kernels.linearized_softmax_gdn.triton_op import linearized_softmax_gdn_triton  # noqa: E402

LinGDNState = lin.LinGDNState


def recurrence(q, k, v, scale, state):
    """DESIGN §7 one token at a time, in the inputs' dtype (fp64 here)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    if state is None or state.count == 0:
        h, k_sum, v_sum, count = q.new_zeros(B, H, K, V), q.new_zeros(B, H, K), q.new_zeros(B, H, V), 0
    else:
        h, k_sum, v_sum, count = state
    outs = []
    for i in range(T):
        t = count + i + 1
        v_bar_prev = v_sum / (t - 1) if t > 1 else torch.zeros_like(v_sum)
        k_sum, v_sum = k_sum + k[:, i], v_sum + v[:, i]
        u, w = k[:, i] - k_sum / t, v[:, i] - v_bar_prev
        uh = torch.einsum("bhk,bhkv->bhv", u, h)
        h = (1 - 1 / t) * h + (1 / t) * u[..., None] * (w - uh)[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, i] * scale, h) + v_sum / t)
    return torch.stack(outs, 1), LinGDNState(h, k_sum, v_sum, count + T)


def run_case(B, T, H, K, V, count, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = 0.4 * torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, H, V, generator=gen)
    leaves = [q.to(dtype), k.to(dtype), v.to(dtype)]
    if count:
        leaves += [0.1 * torch.randn(B, H, K, V, generator=gen), 0.4 * count**0.5 * torch.randn(B, H, K, generator=gen),
                   count**0.5 * torch.randn(B, H, V, generator=gen)]
    ours = [x.clone().requires_grad_(True) for x in leaves]
    ref = [x.double().requires_grad_(True) for x in leaves]
    st = LinGDNState(*ours[3:], count) if count else None
    st_ref = LinGDNState(*ref[3:], count) if count else None
    o, s = linearized_softmax_gdn_triton(*ours[:3], scale=K**-0.5, initial_state=st, output_final_state=True)
    o_ref, s_ref = recurrence(*ref[:3], K**-0.5, st_ref)
    assert o.dtype == dtype and s.count == count + T and s.h.dtype == torch.float32
    gen_out = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(o.shape, generator=gen_out).to(dtype)
    dh = torch.randn(s.h.shape, generator=gen_out)
    grads = torch.autograd.grad((o, s.h, s.k_sum.sum() + s.v_sum.sum()), ours, (do, dh, torch.tensor(1.0)))
    grads_ref = torch.autograd.grad((o_ref, s_ref.h, s_ref.k_sum.sum() + s_ref.v_sum.sum()), ref,
                                    (do.double(), dh.double(), torch.tensor(1.0, dtype=torch.float64)))
    errors = {"o": rel_err(o, o_ref), "h": rel_err(s.h, s_ref.h), "k_sum": rel_err(s.k_sum, s_ref.k_sum),
              "v_sum": rel_err(s.v_sum, s_ref.v_sum)}
    for name, a, b in zip(("dq", "dk", "dv", "dh", "dk_sum", "dv_sum"), grads, grads_ref):
        errors[name] = rel_err(a, b)  # inf for any NaN/inf entry
    tol = TOL[dtype]
    bad = {n: e for n, e in errors.items() if not e < tol}
    assert not bad, f"errors over {tol:g}: {bad} (all: {errors})"


@pytest.mark.parametrize("T", [1, 100])
def test_fresh_start_fp32(T):
    run_case(1, T, 2, 16, 16, 0, torch.float32, seed=T)


def test_continued_state_fp32():
    run_case(1, 63, 1, 32, 16, 5, torch.float32, seed=3)


def test_fresh_start_fp16():
    run_case(1, 64, 1, 16, 32, 0, torch.float16, seed=4)


@pytest.mark.parametrize("count", [0, 9])
def test_public_op_triton_matches_reference(count):
    """Through the public op: backend="triton" against backend="reference" on fp64 copies."""
    gen = torch.Generator().manual_seed(20 + count)
    B, T, H, K, V = 1, 70, 1, 16, 16
    leaves = [torch.randn(B, T, H, K, generator=gen), 0.4 * torch.randn(B, T, H, K, generator=gen),
              torch.randn(B, T, H, V, generator=gen)]
    if count:
        leaves += [0.1 * torch.randn(B, H, K, V, generator=gen), 0.4 * count**0.5 * torch.randn(B, H, K, generator=gen),
                   count**0.5 * torch.randn(B, H, V, generator=gen)]
    ours = [x.clone().requires_grad_(True) for x in leaves]
    ref = [x.double().requires_grad_(True) for x in leaves]
    st = LinGDNState(*ours[3:], count) if count else None
    st_ref = LinGDNState(*ref[3:], count) if count else None
    o, s = lin.linearized_softmax_gdn(*ours[:3], initial_state=st, output_final_state=True, backend="triton")
    o_ref, s_ref = lin.linearized_softmax_gdn(*ref[:3], initial_state=st_ref, output_final_state=True,
                                              backend="reference")
    do = torch.randn(o.shape, generator=gen)
    dh = torch.randn(s.h.shape, generator=gen)
    grads = torch.autograd.grad((o, s.h), ours, (do, dh))
    grads_ref = torch.autograd.grad((o_ref, s_ref.h), ref, (do.double(), dh.double()))
    errors = {"o": rel_err(o, o_ref), "h": rel_err(s.h, s_ref.h)}
    errors.update({f"d{i}": rel_err(a, b) for i, (a, b) in enumerate(zip(grads, grads_ref))})
    bad = {n: e for n, e in errors.items() if not e < TOL[torch.float32]}
    assert s.count == s_ref.count == count + T
    assert not bad, f"errors over {TOL[torch.float32]:g}: {bad} (all: {errors})"
