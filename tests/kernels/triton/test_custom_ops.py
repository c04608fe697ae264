"""The Triton backends' torch.library custom ops (kernels/common/custom_op.py) on the CPU
interpreter: torch.library.opcheck (schema, fake shapes, dtypes and strides against the real
outputs, the registered autograd, AOT dispatch with dynamic shapes, gradients included), and
outputs and gradients bit-identical to the autograd.Function each op wraps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.gated_delta_rule.triton_fwd import RunningMean
from kernels.gated_delta_rule.triton_op import (
    ChunkDeltaRuleFunction,
    DeltaOptions,
    delta_rule_apply,
    delta_rule_fwd,
    delta_rule_infer,
)
from kernels.gated_linear_attention.triton_function import ChunkGatedLinearAttentionFunction, ChunkOptions
from kernels.gated_linear_attention.triton_op import gla_fwd
from kernels.linearized_softmax_gdn.triton_op import lin_gdn_fwd, lin_gdn_infer
from kernels.mesa.triton_function import MesaFunction, MesaOptions
from kernels.mesa.triton_op import mesa_fwd

B, T, H, K, V = 1, 70, 2, 16, 16  # 70: a partial last chunk


def _leaves() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=gen)

    t = {"q": r(B, T, H, K), "k": F.normalize(r(B, T, H, K), dim=-1), "v": r(B, T, H, V),
         "g": -0.2 * r(B, T, H).abs(), "g_vector": -0.2 * r(B, T, H, K).abs(),
         "beta": 0.05 + 0.9 * torch.rand(B, T, H, generator=gen), "h0": r(B, H, K, V),
         "lamb": 0.5 + r(H, K).abs(), "k_sum": r(B, H, K), "v_sum": r(B, H, V)}
    h = r(B, H, K, K)
    t["h_kk"] = 0.1 * h @ h.transpose(-1, -2)
    return {name: x.requires_grad_() for name, x in t.items()}


# case -> (custom op, the autograd.Function call it stands for, tensor names, scalar arguments)
CASES = {
    "gated_delta_rule": (delta_rule_fwd, lambda *t: ChunkDeltaRuleFunction.apply(*t, DeltaOptions(0.3, True)),
                         ("q", "k", "v", "g", "beta", "h0"), (0.3, True)),
    "delta_rule": (delta_rule_fwd, lambda q, k, v, beta: ChunkDeltaRuleFunction.apply(
                       q, k, v, None, beta, None, DeltaOptions(0.3, False)),
                   ("q", "k", "v", None, "beta", None), (0.3, False)),
    "gla_scalar": (gla_fwd, lambda *t: ChunkGatedLinearAttentionFunction.apply(*t, ChunkOptions(0.3, 64, True)),
                   ("q", "k", "v", "g", "h0"), (0.3, 64, True, True)),
    "gla_vector": (gla_fwd, lambda *t: ChunkGatedLinearAttentionFunction.apply(*t, ChunkOptions(0.3, 64, True)),
                   ("q", "k", "v", "g_vector", "h0"), (0.3, 64, True, True)),
    "linear": (gla_fwd, lambda q, k, v: ChunkGatedLinearAttentionFunction.apply(
                   q, k, v, None, None, ChunkOptions(0.3, 64, False)),
               ("q", "k", "v", None, None), (0.3, 64, False, True)),
    "mesa": (mesa_fwd, lambda *t: MesaFunction.apply(*t, MesaOptions(0.3, 64, 4, None, True)),
             ("q", "k", "v", "g", "beta", "lamb", "h_kk", "h0"), (0.3, 64, 4, None, True)),
}


def _args(case: str):
    op, function, names, scalars = CASES[case]
    leaves = _leaves()
    tensors = [leaves[n] if n is not None else None for n in names]
    return op, function, tensors, scalars


@pytest.mark.parametrize("case", CASES)
def test_opcheck(case):
    op, _, tensors, scalars = _args(case)
    torch.library.opcheck(op, (*tensors, *scalars))


def _outputs_and_grads(outputs, tensors):
    outputs = [o for o in outputs if o is not None]
    gen = torch.Generator().manual_seed(5)
    cotangents = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outputs]
    leaves = [t for t in tensors if t is not None]
    return [o.detach() for o in outputs], torch.autograd.grad(outputs, leaves, cotangents)


@pytest.mark.parametrize("case", CASES)
def test_the_custom_op_is_bit_identical_to_its_function(case):
    op, function, tensors, scalars = _args(case)
    n_out = {"gated_delta_rule": 2, "delta_rule": 2, "gla_scalar": 2, "gla_vector": 2, "linear": 2,
             "mesa": 3}[case]
    ours = op(*tensors, *scalars)[:n_out]
    # the final states: placeholders when not asked for
    ours = [o if i == 0 or o.numel() else None for i, o in enumerate(ours)]
    theirs = function(*(t for t in tensors if t is not None))
    (o1, g1), (o2, g2) = _outputs_and_grads(ours, tensors), _outputs_and_grads(theirs, tensors)
    assert len(o1) == len(o2)
    assert all(torch.equal(a, b) for a, b in zip(o1, o2))
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))


def test_delta_rule_apply_returns_none_without_a_final_state():
    t = _leaves()
    o, ht = delta_rule_apply(t["q"], t["k"], t["v"], None, t["beta"], None, 0.3, False)
    assert ht is None and o.shape == (B, T, H, V)


@pytest.mark.parametrize("count", [0, 3])
@pytest.mark.parametrize("op", [lin_gdn_fwd, lin_gdn_infer], ids=["fwd", "infer"])
def test_opcheck_lin_gdn(op, count):
    """The linearized softmax GDN's ops (its whole Triton path, which no autograd.Function
    stands for: tests/kernels/triton/test_lin_gdn_triton.py holds it to its recurrence). The
    no-gradient op has no autograd formula: it gets inputs that want none."""
    t = _leaves() if op is lin_gdn_fwd else {n: x.detach() for n, x in _leaves().items()}
    state = (t["h0"], t["k_sum"], t["v_sum"]) if count else (None, None, None)
    torch.library.opcheck(op, (t["q"], t["k"], t["v"], *state, 0.3, count, True))


@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
def test_opcheck_delta_rule_infer(gated):
    """The delta rules' no-gradient forward (no autograd formula: inputs that want none)."""
    t = {n: x.detach() for n, x in _leaves().items()}
    torch.library.opcheck(delta_rule_infer, (t["q"], t["k"], t["v"], t["g"] if gated else None, t["beta"],
                                             t["h0"] if gated else None, 0.3, gated))


def test_the_running_mean_is_added_before_rounding():
    """The delta rule's forward with a RunningMean (lin_gdn's mean of v): o is o without it
    plus (enter + the chunk's cumulative sum) / position, for a state of 5 tokens."""
    t = {n: x.detach() for n, x in _leaves().items()}
    tensors = [t["q"], t["k"], t["v"], t["g"], t["beta"], t["h0"]]
    x = torch.randn(B, T, H, V, generator=torch.Generator().manual_seed(3))
    v_sum0 = torch.randn(B, H, V, generator=torch.Generator().manual_seed(4))
    before = torch.cumsum(x, dim=1) - x + v_sum0[:, None]
    enter = before[:, ::64].permute(0, 2, 1, 3).contiguous()
    o, _ = ChunkDeltaRuleFunction.forward(type("Ctx", (), {"save_for_backward": lambda *a: None})(), *tensors,
                                          DeltaOptions(0.3, False), RunningMean(x, enter, 5))
    plain, _ = ChunkDeltaRuleFunction.apply(*tensors, DeltaOptions(0.3, False))
    pos = torch.arange(6, 6 + T, dtype=torch.float32)[None, :, None, None]
    torch.testing.assert_close(o, plain + (before + x) / pos, rtol=1e-5, atol=1e-5)
