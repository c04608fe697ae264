"""The delta rules' forward where no gradient is wanted (delta_rule_infer in
kernels/gated_delta_rule/triton_op.py), on the CPU interpreter: it stores nothing for a
backward, and under DeltaLaunch.infer_fused runs one state pass that writes only the output.

Against the per-token reference in fp64 (outputs and final states), against the forward that
keeps its tensors for a backward (bit for bit where the same kernels run), on the NaN cases
of tests/nan_cases.py, and routed only where nothing wants a gradient."""

from __future__ import annotations

import importlib

import pytest
import torch

from kernels import delta_rule, gated_delta_rule, linearized_softmax_gdn
from kernels.common.launch import launch_settings
from tests.kernels.triton.test_delta_triton import make_inputs
from tests.launch_util import DELTA_OPS, each
from tests.nan_cases import LENGTHS, call, check_case, make_leaves
from tests.util import TOL, rel_err, row_err

# the module, not the op kernels/__init__.py exports under the package's name
triton_op = importlib.import_module("kernels.gated_delta_rule.triton_op")
FUSED = {"infer_fused": {"enabled": True, "min_heads": 1}}
UNFUSED = {"infer_fused": {"enabled": False}}


def _run(op, tensors, h0, backend, requires_grad=False):
    args = {n: t.detach().clone().requires_grad_(requires_grad) for n, t in tensors.items()}
    state = h0.clone() if h0 is not None else None
    return op(**args, initial_state=state, output_final_state=True, backend=backend)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two_kernels"])
@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
@pytest.mark.parametrize("T", [1, 63, 100, 130])
def test_matches_reference_and_training_forward(launch, fused, gated, T):
    launch(**each(DELTA_OPS, FUSED if fused else UNFUSED))
    op = gated_delta_rule if gated else delta_rule
    tensors, h0 = make_inputs(2, T, 2, 32, 16, torch.float32, seed=60 + T, gated=gated, with_state=T != 63)
    o, ht = _run(op, tensors, h0, "triton")
    o_train, ht_train = _run(op, tensors, h0, "triton", requires_grad=True)
    o_ref, ht_ref = _run(op, {n: t.double() for n, t in tensors.items()}, h0.double() if h0 is not None else None,
                         "reference")
    for ours, ref in ((o, o_ref), (ht, ht_ref)):
        assert rel_err(ours, ref) < TOL[torch.float32] and row_err(ours, ref) < TOL[torch.float32]
    if fused:  # the same arithmetic in another summation order
        assert rel_err(o, o_train) < 1e-5 and torch.equal(ht, ht_train)
    else:
        assert torch.equal(o, o_train) and torch.equal(ht, ht_train)


def test_fp16_fused_equals_two_kernels(launch):
    """The fused pass rounds S and U to the input dtype exactly as output_fwd reads them back."""
    tensors, h0 = make_inputs(1, 100, 2, 32, 32, torch.float16, seed=70)
    launch(**each(DELTA_OPS, FUSED))
    o, ht = _run(gated_delta_rule, tensors, h0, "triton")
    launch(**each(DELTA_OPS, UNFUSED))
    o2, ht2 = _run(gated_delta_rule, tensors, h0, "triton")
    assert o.dtype == torch.float16 and torch.equal(ht, ht2) and rel_err(o, o2) < 1e-3


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two_kernels"])
@pytest.mark.parametrize("op, gates", [("gdn", "strong"), ("gdn", "reset"), ("delta", None), ("lin_gdn", None)])
def test_nan_cases(launch, fused, op, gates):
    """Padded rows under strong gates and g = -inf (tests/nan_cases.py), outputs and final
    states only: finite and within the bounds the forward with a backward meets."""
    launch(**each(DELTA_OPS, FUSED if fused else UNFUSED))
    for T in LENGTHS:
        leaves = make_leaves(op, T, gates, with_state=True)
        with torch.no_grad():
            ours = call(op, leaves, "triton")
            ref = call(op, {n: t.double() for n, t in leaves.items()}, "reference")
        names = ("o", "h", "k_sum", "v_sum") if op == "lin_gdn" else ("o", "final_state")
        check_case(op, gates, dict(zip(names, ours)), dict(zip(names, ref)), "triton", torch.float32)


def test_routed_by_gradient(monkeypatch):
    """No input wanting a gradient, or grad mode off: delta_rule_infer; else delta_rule_fwd."""
    tensors, h0 = make_inputs(1, 20, 1, 16, 16, torch.float32, seed=71)
    calls = []
    for name in ("delta_rule_infer", "delta_rule_fwd"):
        real = getattr(triton_op, name)
        monkeypatch.setattr(triton_op, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    _run(gated_delta_rule, tensors, h0, "triton")
    with torch.no_grad():
        _run(gated_delta_rule, tensors, h0, "triton", requires_grad=True)
    assert calls == ["delta_rule_infer", "delta_rule_infer"]
    calls.clear()
    _run(gated_delta_rule, tensors, h0, "triton", requires_grad=True)
    h0_grad = h0.clone().requires_grad_(True)
    gated_delta_rule(**tensors, initial_state=h0_grad, backend="triton")  # only the state wants one
    assert calls == ["delta_rule_fwd", "delta_rule_fwd"]


@pytest.mark.parametrize("mean_form", ["auto", "stored"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two_kernels"])
def test_lin_gdn_inference_equals_training_forward(launch, fused, mean_form):
    """The linearized softmax GDN's no-gradient forward (lin_gdn_infer), its running mean
    added in the fused pass or in output_fwd, formed there or stored whole by the scan
    (mean_form "stored"): the training forward's output (two kernels: bit for bit; fused: up
    to summation order) and final state; and the stored mean's output against the formed one."""
    launch(gated_delta_rule=FUSED if fused else UNFUSED, linearized_softmax_gdn={"mean_form": mean_form})
    gen = torch.Generator().manual_seed(72)
    q, k = torch.randn(2, 2, 100, 2, 16, generator=gen)
    v = torch.randn(2, 100, 2, 16, generator=gen)
    o, state = linearized_softmax_gdn(q, k, v, output_final_state=True, backend="triton")
    if mean_form == "stored":
        with launch_settings(linearized_softmax_gdn={"mean_form": "scan"}):
            o_formed, _ = linearized_softmax_gdn(q, k, v, backend="triton")
        assert rel_err(o, o_formed) < 1e-6
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o2, state2 = linearized_softmax_gdn(*leaves, output_final_state=True, backend="triton")
    assert torch.equal(state.h, state2.h) and torch.equal(state.v_sum, state2.v_sum)
    assert torch.equal(state.k_sum, state2.k_sum)
    assert rel_err(o, o2) < 1e-6 if fused else torch.equal(o, o2)
