"""The gated delta rule's Triton kernels one at a time on a CUDA GPU (tests/delta_stages.py).

The H200 case gdn_bf16_T1000_K256_V32 of test_delta_gpu.py gets o, the final state, dq and
dh0 right and dv, dbeta (rel_err ~0.95), dk (0.13) and dg (0.07) wrong. The same shape,
with the same tiles, is right under the CPU interpreter in fp32 and fp16
(tests/kernels/triton/test_delta_triton.py::test_wide_keys_narrow_values), so the fault is
in what only a GPU does: the compiled code of a kernel at these tiles in bf16, or programs
running at once. Here each kernel's outputs are held against its formulas evaluated in fp64
on the tensors it read, so a failing item names the kernel (wy_fwd's tm, state_bwd's du,
wy_bwd's dv ...) rather than every gradient downstream of it. The neighbouring shapes say
which dimension matters (K = 256 alone, V = 32 alone, both), fp32 whether bf16 does, and
the launch variants of the failing shape which setting avoids it.

Skipped without CUDA and under TRITON_INTERPRET (run tests/gpu in a session of its own).
"""

from __future__ import annotations

import functools

import pytest
import torch

from tests.delta_stages import OUTPUTS, stage_errors
from tests.util import GPU_ONLY, TOL, record_gpu_errors

pytestmark = GPU_ONLY

pytest.importorskip("triton")

GDN = "gated_delta_rule"
# name: (B, T, H, K, V, dtype, launch_settings changes of gated_delta_rule)
CASES = {
    "bf16_K256_V32": (1, 1000, 2, 256, 32, torch.bfloat16, {}),
    "bf16_K256_V64": (1, 1000, 2, 256, 64, torch.bfloat16, {}),
    "bf16_K128_V32": (1, 1000, 2, 128, 32, torch.bfloat16, {}),
    "bf16_K192_V32": (1, 1000, 2, 192, 32, torch.bfloat16, {}),
    "bf16_K128_V128": (1, 1000, 2, 128, 128, torch.bfloat16, {}),
    "fp32_K256_V32": (1, 1000, 2, 256, 32, torch.float32, {}),
    "bf16_K256_V32_state_bwd_1stage": (1, 1000, 2, 256, 32, torch.bfloat16, {"state_bwd": {"num_stages": 1}}),
    "bf16_K256_V32_bwd_BV16": (1, 1000, 2, 256, 32, torch.bfloat16,
                               {"dqkw": {"BV": 16}, "wy_bwd": {"BV": 16}, "du_local": {"BV": 16}}),
    "bf16_K256_V32_wy_bwd_2warps": (1, 1000, 2, 256, 32, torch.bfloat16, {"wy_bwd": {"num_warps": 2}}),
    "bf16_K256_V32_fp32_solve": (1, 1000, 2, 256, 32, torch.bfloat16, {"wy_fwd": {"tf32_solve": False}}),
}


@functools.lru_cache(maxsize=None)
def errors_of(case: str) -> dict:
    """rel_err of every kernel output of one case (tests/delta_stages.OUTPUTS), on the inputs
    of test_delta_gpu.py's cases (its make_inputs, gates near 0)."""
    from kernels.common.launch import launch_settings
    from kernels.common.triton import utils
    from tests.gpu.test_delta_gpu import make_inputs

    B, T, H, K, V, dtype, changes = CASES[case]
    tensors, h0 = make_inputs(B, T, H, K, V, dtype, "near0")
    gen = torch.Generator(device="cuda").manual_seed(1234)
    do = torch.randn(B, T, H, V, device="cuda", generator=gen).to(dtype)
    dht = torch.randn(B, H, K, V, device="cuda", generator=gen)
    utils.DEBUG.poison = True
    try:
        with launch_settings(**{GDN: changes}):
            errors = stage_errors(tensors["q"], tensors["k"], tensors["v"], tensors["g"], tensors["beta"], h0,
                                  do, dht, K**-0.5)
    finally:
        utils.DEBUG.poison = False
    print(case, {name: f"{err:.2e}" for name, err in errors.items()})
    record_gpu_errors(f"stages_{case}", errors)
    return errors


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("output", OUTPUTS)
def test_kernel_output(case, output):
    errors = errors_of(case)
    dtype = CASES[case][5]
    assert errors[output] < TOL[dtype], f"{case} {output}: {errors[output]:.3e} >= {TOL[dtype]} (all: {errors})"
