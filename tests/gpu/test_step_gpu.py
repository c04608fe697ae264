"""The fused Triton decode step of the four linear ops on a GPU at real shapes (B = 4,
H = 8, K = V = 128, bf16 inputs, fp32 state), against the PyTorch step in fp64.

The step runs with backend="triton" (which raises rather than falls back), and each case
asserts that the fused Triton step ran; o and the new state are held to TOL (whole tensor)
and ROW_TOL (worst row, tests/util.py). Errors are printed (-s) and, when GPU_ERRORS_JSON
names a file, written there."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.backends import triton_ran
from tests.kernels.triton.test_step_triton import STEPS
from tests.util import GPU_ONLY, ROW_TOL, TOL, record_gpu_errors, rel_err, row_err

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
        # Forced, not auto, and watched: a fallback to the PyTorch step would compare torch with torch.
        with triton_ran("step"):
            o, h = STEPS[op](**args, state=state, backend="triton")
        o_ref, h_ref = STEPS[op](**{n: t.double() for n, t in args.items()}, state=state.double(), backend="torch")
    errors = {"o": rel_err(o, o_ref), "state": rel_err(h, h_ref),
              "o (worst row)": row_err(o, o_ref), "state (worst row)": row_err(h, h_ref)}
    record_gpu_errors(f"step_{op}_bf16", errors)
    assert o.dtype == torch.bfloat16 and h.dtype == torch.float32
    bounds = {"o": TOL[torch.bfloat16], "state": TOL[torch.float32],
              "o (worst row)": ROW_TOL[torch.bfloat16], "state (worst row)": ROW_TOL[torch.float32]}
    bad = {n: e for n, e in errors.items() if not e < bounds[n]}
    assert not bad, f"{op}: errors over their bounds {bounds}: {bad} (all: {errors})"
