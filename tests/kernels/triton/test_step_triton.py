"""The fused Triton decode step (kernels/common/triton/step.py) behind backend="triton" of
the four linear ops' steps, against their PyTorch steps, on the CPU interpreter: outputs
and new states, with and without a state, fp32 and bf16; and the refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import (
    delta_rule_step,
    gated_delta_rule_step,
    gated_linear_attention_step,
    linear_attention_step,
)
from tests.util import TOL, rel_err

B, H, K, V = 2, 3, 20, 24


def step_inputs(op: str, dtype: torch.dtype, seed: int = 12):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, H, K, generator=gen), F.normalize(torch.randn(B, H, K, generator=gen), dim=-1)
    args = {"q_t": q.to(dtype), "k_t": k.to(dtype), "v_t": torch.randn(B, H, V, generator=gen).to(dtype)}
    if op == "gla_vector":
        args["g_t"] = F.logsigmoid(torch.randn(B, H, K, generator=gen))
    elif op in ("gla_scalar", "gdn"):
        args["g_t"] = F.logsigmoid(torch.randn(B, H, generator=gen))
    if op in ("delta", "gdn"):
        args["beta_t"] = torch.sigmoid(torch.randn(B, H, generator=gen))
    return args, torch.randn(B, H, K, V, generator=gen)


STEPS = {
    "linear": linear_attention_step,
    "gla_scalar": gated_linear_attention_step,
    "gla_vector": gated_linear_attention_step,
    "delta": delta_rule_step,
    "gdn": gated_delta_rule_step,
}


@pytest.mark.parametrize("with_state", [True, False], ids=["state", "no_state"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("op", list(STEPS))
def test_fused_step_matches_torch_step(op, dtype, with_state):
    args, state = step_inputs(op, dtype)
    state = state if with_state else None
    o, h = STEPS[op](**args, state=state, scale=0.3, backend="triton")
    # the PyTorch step on the same (rounded) inputs, in fp64: the fused step computes in fp32
    ref_args = {n: t.double() for n, t in args.items()}
    o_ref, h_ref = STEPS[op](**ref_args, state=state.double() if state is not None else None, scale=0.3,
                             backend="torch")
    assert o.dtype == dtype and h.dtype == torch.float32
    assert rel_err(h, h_ref) < TOL[torch.float32]
    assert rel_err(o, o_ref) < TOL[dtype]


def test_auto_is_torch_on_cpu_and_triton_refusals():
    args, state = step_inputs("gdn", torch.float32)
    o_auto, _ = gated_delta_rule_step(**args, state=state)  # CPU: the PyTorch step
    o_torch, _ = gated_delta_rule_step(**args, state=state, backend="torch")
    assert torch.equal(o_auto, o_torch)
    with pytest.raises(ValueError, match="no backward"):
        gated_delta_rule_step(**{**args, "q_t": args["q_t"].requires_grad_(True)}, state=state, backend="triton")
    with pytest.raises(ValueError, match="float64"):
        gated_delta_rule_step(**{n: t.double() for n, t in args.items()}, state=state.double(), backend="triton")
    with pytest.raises(ValueError, match="not valid"):
        gated_delta_rule_step(**args, state=state, backend="cuda")
