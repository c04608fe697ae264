"""The NaN cases of issue 19 on the CPU interpreter (tests/nan_cases.py: padded rows under
strong gates and g = -inf, at T = 63, 100, 130, with and without an initial state).

Both the Triton and the torch backend run in fp32 against the per-token recurrence in fp64
on the same inputs: outputs, final states and every gradient finite and within the bounds
of tests/nan_cases.py. Every buffer the Triton wrappers allocate starts as NaN (conftest).
The linear / GLA forward runs fused here (conftest lowers its min_heads); the two-kernel
forward, and the gated delta rule's forward with the output fused into the state pass, have
cases of their own.
"""

from __future__ import annotations

import functools

import pytest
import torch
import triton
import triton.language as tl

from kernels.common.triton.tiles import load_gamma_rows
from tests.launch_util import CHUNK_OPS, each, fused_forward_changes
from tests.nan_cases import GATED, LENGTHS, UNGATED, check_case, make_leaves, outputs_and_grads

CASES = ([(op, gates) for op in GATED for gates in ("strong", "reset")]
         + [(op, None) for op in UNGATED])


@functools.lru_cache(maxsize=None)
def reference(op: str, gates: str | None, T: int, with_state: bool) -> dict:
    return outputs_and_grads(op, make_leaves(op, T, gates, with_state), torch.float64, "reference")


@triton.jit
def read_gamma_rows(gamma, out, T, BT: tl.constexpr):
    tl.store(out + tl.arange(0, BT), load_gamma_rows(gamma, 0, T, 1, BT))


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("with_state", [False, True], ids=["no_state", "state"])
@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("op, gates", CASES, ids=[f"{op}-{gates or 'ungated'}" for op, gates in CASES])
def test_matches_reference(op, gates, T, with_state, backend):
    ours = outputs_and_grads(op, make_leaves(op, T, gates, with_state), torch.float32, backend)
    check_case(op, gates, ours, reference(op, gates, T, with_state), backend, torch.float32)


@pytest.mark.parametrize("gates", ["strong", "reset"])
@pytest.mark.parametrize("op", ["gla_scalar", "gla_vector"])
def test_two_kernel_forward(launch, op, gates):
    """The linear / GLA forward as states (states.py) then outputs (output.py)."""
    launch(**each(CHUNK_OPS, fused_forward_changes(enabled=False)))
    for T in (63, 100):
        ours = outputs_and_grads(op, make_leaves(op, T, gates, True), torch.float32, "triton")
        check_case(op, gates, ours, reference(op, gates, T, True), "triton", torch.float32)


@pytest.mark.parametrize("gates", ["strong", "reset"])
def test_gdn_fused_state_output(launch, gates):
    """The gated delta rule's forward with the output fused into the state pass
    (DeltaLaunch.fused_fwd, on from 256 sequences of heads), forced on."""
    launch(gated_delta_rule={"fused_fwd": {"enabled": True, "min_heads": 1}})
    for T in (63, 100):
        ours = outputs_and_grads("gdn", make_leaves("gdn", T, gates, True), torch.float32, "triton")
        check_case("gdn", gates, ours, reference("gdn", gates, T, True), "triton", torch.float32)


def test_padded_gamma_stays_flat():
    """The root of the padded-row NaN: a scalar gate's cumulative log2-gates read past T
    repeat the last real row (tiles.load_gamma_rows), so exp2(gamma_i - gamma_j) <= 1 on the
    padded rows of a chunk whose gates sum past 128 log2-units."""
    gamma = -3.0 * torch.arange(1, 37, dtype=torch.float32)  # 36 tokens, -3 down to -108
    out = torch.full((64,), float("nan"))
    read_gamma_rows[(1,)](gamma, out, 36, BT=64)
    assert torch.equal(out[:36], gamma) and torch.equal(out[36:], gamma[-1].expand(28))


def test_gates_floored_before_the_cumulative_sum():
    """The root of the -inf NaN: the chunk-local cumulative sums take every gate below
    GATE_FLOOR_LOG2 (log2 units) as the floor, so they stay finite and their differences
    are numbers."""
    from kernels.common.triton.cumsum import chunk_local_cumsum
    from kernels.common.triton.gates import GATE_FLOOR_LOG2, LOG2E

    g = -0.1 * torch.rand(1, 100, 2, generator=torch.Generator().manual_seed(3))
    g[0, [0, 30, 64, 99]] = float("-inf")
    g[0, 40] = -100.0  # finite, below the floor too
    gamma = chunk_local_cumsum(g, 64, LOG2E)
    floored = g.double().clamp(min=GATE_FLOOR_LOG2 / LOG2E)
    want = torch.cat([chunk.cumsum(1) for chunk in floored.split(64, dim=1)], dim=1) * LOG2E
    assert torch.isfinite(gamma).all()
    assert (gamma - want).abs().max() < 1e-4  # fp32 sums reaching -200
