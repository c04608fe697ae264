"""The NaN cases of issue 19 on a CUDA GPU (tests/nan_cases.py: padded rows under strong gates
and g = -inf, at T = 63, 100, 130, with and without an initial state), in bf16 and fp32 at
head dims of 128.

Every op runs through its public function with backend="triton" (which raises rather than
falls back), each case asserts that the op's Triton entry point ran (tests/gpu/backends.py),
and every buffer the kernels write starts as NaN. The reference is the per-token recurrence in
fp64 on the same GPU, on the inputs the kernels get (q, k, v rounded to the case's dtype) and
with the same cotangents. Outputs, final states and every gradient must be finite and within
the bounds of tests/nan_cases.py: TOL / ROW_TOL (tests/util.py) for bf16 and, for fp32, the
same bounds as on the CPU interpreter. A bf16 worst row over ROW_TOL (its whole tensor within
TOL) passes only as rounding: the same case with fp16 inputs must shrink it as rounding does
(tests/util.py rounding_verdict); an fp32 worst row over ROW_TOL, only where the PyTorch
backend in fp32 errs as much on the case (tests/util.py fp32_peer_verdict). MesaNet's 16-bit
path also rounds where the input dtype does not reach: tf32 dots (10 mantissa bits, as many as
fp16) and fp16 CG operands (MesaLaunch), so its twin runs those at fp32 too (MESA_TWIN), and
every rounding of the bf16 case shrinks in it. MesaNet runs 100 CG steps in fp32 (30 in bf16), enough to converge at K = 128.

Skipped without CUDA, and in a session where TRITON_INTERPRET is set (run tests/gpu in a
pytest session of its own). Errors are printed (-s) and, when GPU_ERRORS_JSON names a file,
written there under each case's label.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from tests.gpu.backends import triton_ran
from tests.nan_cases import (
    GATED,
    LENGTHS,
    OPS,
    UNGATED,
    make_leaves,
    output_dtypes,
    outputs_and_grads,
    over_bounds,
)
from tests.util import GPU_ONLY, fp32_peer_verdict, record_gpu_errors, rounding_verdict

pytestmark = GPU_ONLY

pytest.importorskip("triton")

DEVICE = "cuda"
SHAPE = {"B": 2, "H": 2, "K": 128, "V": 128}
CASES = ([(op, gates) for op in GATED for gates in ("strong", "reset")]
         + [(op, None) for op in UNGATED])
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# MesaNet's internal 16-bit roundings at fp32, for its fp16 twin (module doc)
MESA_TWIN = {"prec": "ieee", "cg_prec": "ieee", "fwd_solve": {"operands": "fp32"}, "bwd_solve": {"operands": "fp32"}}


def measure_case(op: str, gates: str | None, T: int, with_state: bool, dtype: torch.dtype,
                 label: str, backend: str = "triton") -> tuple[dict, dict]:
    """The op on `backend` ("triton" or "torch") and the fp64 recurrence on one case:
    ({name: (rel_err, row_err)}, the quantities over a bound (tests/nan_cases.py over_bounds));
    records the errors under `label`."""
    from kernels.common.triton import utils

    leaves = make_leaves(op, T, gates, with_state, **SHAPE)
    # the reference gets the inputs the kernels get: q, k, v rounded to the case's dtype
    leaves = {n: t.to(dtype).float() if n in ("q", "k", "v") else t for n, t in leaves.items()}
    options = {"cg_steps": 100 if dtype == torch.float32 else 30} if op == "mesa" else {}
    triton = backend == "triton"
    utils.DEBUG.poison = triton
    try:
        with triton_ran(OPS[op][0]) if triton else contextlib.nullcontext():
            ours = outputs_and_grads(op, leaves, dtype, backend, device=DEVICE, **options)
    finally:
        utils.DEBUG.poison = False
    ref = outputs_and_grads(op, leaves, torch.float64, "reference", device=DEVICE,
                            rounded_as=output_dtypes(op, ours))
    errors, bad = over_bounds(op, gates, ours, ref, backend, dtype)
    record_gpu_errors(label, {f"{n} {metric}": e for n, pair in errors.items()
                              for metric, e in zip(("rel", "row"), pair)})
    return errors, bad


def cleared(bad: dict, verdict) -> dict:
    """`bad` (over_bounds') less the quantities whose worst row verdict(name, row_err) clears
    (returns None); a whole tensor over its bound is never cleared. The rest carry the reason."""
    whys = {name: verdict(name, row) if whole < whole_bound else "its whole tensor fails TOL"
            for name, (whole, row, whole_bound, _) in bad.items()}
    return {name: (*bad[name], why) for name, why in whys.items() if why is not None}


def run_case(op: str, gates: str | None, T: int, with_state: bool, dtype: torch.dtype, label: str) -> dict:
    """measure_case, asserting every bound; a bf16 worst row over its bound passes only where
    the fp16 twin shows it to be rounding, an fp32 one only where the PyTorch backend's fp32
    error on the case is as large (tests/util.py fp32_peer_verdict)."""
    from kernels.common.launch import launch_settings

    errors, bad = measure_case(op, gates, T, with_state, dtype, label)
    if bad and dtype == torch.float32:
        peer, _ = measure_case(op, gates, T, with_state, dtype, label + " torch", backend="torch")
        bad = cleared(bad, lambda name, row: fp32_peer_verdict(row, peer[name][1]))
    if bad and dtype == torch.bfloat16:
        with launch_settings(**({"mesa": MESA_TWIN} if op == "mesa" else {})):
            twin, _ = measure_case(op, gates, T, with_state, torch.float16, label + " fp16 twin")
        bad = cleared(bad, lambda name, row: rounding_verdict(row, *twin[name]))
    assert not bad, f"{op} {gates}: (rel_err, row_err, bounds[, why not rounding]) {bad}; all {errors}"
    return errors


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("with_state", [False, True], ids=["no_state", "state"])
@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("op, gates", CASES, ids=[f"{op}-{gates or 'ungated'}" for op, gates in CASES])
def test_matches_reference(op, gates, T, with_state, dtype):
    run_case(op, gates, T, with_state, DTYPES[dtype],
             f"nan {op}/{gates or 'ungated'} T={T} {'state' if with_state else 'no state'} {dtype}")


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("gates", ["strong", "reset"])
@pytest.mark.parametrize("op", ["gla_scalar", "gla_vector"])
def test_fused_forward(op, gates, dtype):
    """The linear / GLA forward in one sequential pass (triton_fused_forward.py), which the GPU runs
    from its launch settings' min_heads sequences of heads on, forced at B * H = 4."""
    from kernels.common.launch import launch_settings
    from tests.launch_util import CHUNK_OPS, each, fused_forward_changes

    with launch_settings(**each(CHUNK_OPS, fused_forward_changes(enabled=True, min_heads=1))):
        for T in (63, 100):
            run_case(op, gates, T, True, DTYPES[dtype], f"nan fused {op}/{gates} T={T} {dtype}")


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("gates", ["strong", "reset"])
def test_gdn_fused_state_output(gates, dtype):
    """The gated delta rule's forward with the output fused into the state pass
    (DeltaLaunch.fused_fwd, on from 256 sequences of heads), forced on."""
    from kernels.common.launch import launch_settings

    with launch_settings(gated_delta_rule={"fused_fwd": {"enabled": True, "min_heads": 1}}):
        for T in (63, 100):
            run_case("gdn", gates, T, True, DTYPES[dtype], f"nan gdn fused/{gates} T={T} {dtype}")
