"""The fused Triton decode step of the four linear ops on a GPU at real shapes (B = 4,
H = 8, K = V = 128, bf16 inputs, fp32 state), against the PyTorch step in fp64."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.triton.test_step_triton import STEPS
from tests.util import GPU_ONLY, TOL, rel_err

pytestmark = GPU_ONLY


@pytest.mark.parametrize("op", list(STEPS))
def test_fused_step_on_gpu(op):
    import torch.nn.functional as F

    gen = torch.Generator(device="cuda").manual_seed(5)
    B, H, K, V = 4, 8, 128, 128
    q = torch.randn(B, H, K, device="cuda", generator=gen).bfloat16()
    k = F.normalize(torch.randn(B, H, K, device="cuda", generator=gen), dim=-1).bfloat16()
    args = {"q_t": q, "k_t": k, "v_t": torch.randn(B, H, V, device="cuda", generator=gen).bfloat16()}
    if op == "gla_vector":
        args["g_t"] = F.logsigmoid(torch.randn(B, H, K, device="cuda", generator=gen))
    elif op in ("gla_scalar", "gdn"):
        args["g_t"] = F.logsigmoid(torch.randn(B, H, device="cuda", generator=gen))
    if op in ("delta", "gdn"):
        args["beta_t"] = torch.sigmoid(torch.randn(B, H, device="cuda", generator=gen))
    state = torch.randn(B, H, K, V, device="cuda", generator=gen)
    with torch.no_grad():
        # Forced, not auto: a fallback to the PyTorch step would compare torch with torch.
        o, h = STEPS[op](**args, state=state, backend="triton")
        o_ref, h_ref = STEPS[op](**{n: t.double() for n, t in args.items()}, state=state.double(), backend="torch")
    assert rel_err(h, h_ref) < TOL[torch.float32]
    assert rel_err(o, o_ref) < TOL[torch.bfloat16]
