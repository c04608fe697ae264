"""Every Triton op on the CPU with several K- and V-blocks and a partial last one.

The launch settings' tile caps are lowered to 16 here, so K = V = 40 runs as blocks of
16, 16 and a masked 8, and T = 40 in chunks of 16 is two full chunks and a ragged one: the
second block's offsets, the masked tail and the sums across blocks run on the CPU, where
otherwise every test shape fits one tile (the delta rules: 150 tokens in chunks of 64).
tests/mutation_check.py relies on these tests. Kernels that keep a whole dimension in one
tile by design (the sequential passes' K) keep it.
"""

from __future__ import annotations

import pytest
import torch

from kernels import delta_rule, gated_delta_rule, gated_linear_attention, linear_attention
from tests.kernels.triton import test_delta_triton, test_gla_triton, test_linear_triton
from tests.util import TOL

B, T, H, K, V, CHUNK = 1, 40, 2, 40, 40, 16


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Every BK / BV cap of the launch tables at 16 (min_BV too), the fused forwards allowed
    from one head, the delta rule's fused state+output pass on and off by test."""
    from kernels.common.triton.launch import LAUNCH
    from kernels.gated_delta_rule.triton_tuning import TUNING

    for table in (LAUNCH, TUNING):
        for name, entry in list(table.items()):
            small = {key: 16 for key in ("BK", "BV", "min_BV") if key in entry}
            if "min_heads" in entry:
                small["min_heads"] = 1
            monkeypatch.setitem(table, name, {**entry, **small})


@pytest.mark.parametrize("fused", [1, 0], ids=["fused", "two_kernels"])
def test_linear_attention(compare, monkeypatch, fused):
    from kernels.common.triton.launch import FUSED_FORWARD_ENTRIES, LAUNCH

    for name in FUSED_FORWARD_ENTRIES:
        monkeypatch.setitem(LAUNCH, name, {**LAUNCH[name], "enabled": fused})
    tensors, h0 = test_linear_triton.make_inputs(B, T, H, K, V, torch.float32, seed=1)
    compare(linear_attention, tensors, h0, TOL[torch.float32], chunk_size=CHUNK)


@pytest.mark.parametrize("fused", [1, 0], ids=["fused", "two_kernels"])
@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
def test_gated_linear_attention(compare, monkeypatch, vector, fused):
    from kernels.common.triton.launch import FUSED_FORWARD_ENTRIES, LAUNCH

    for name in FUSED_FORWARD_ENTRIES:
        monkeypatch.setitem(LAUNCH, name, {**LAUNCH[name], "enabled": fused})
    tensors, h0 = test_gla_triton.make_inputs(B, T, H, K, V, torch.float32, vector, seed=2)
    compare(gated_linear_attention, tensors, h0, TOL[torch.float32], chunk_size=CHUNK)


@pytest.mark.parametrize("fused", [0, 1], ids=["two_kernels", "fused"])
@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
def test_delta_rules(compare, monkeypatch, gated, fused):
    from kernels.gated_delta_rule.triton_tuning import TUNING

    monkeypatch.setitem(TUNING, "fused_fwd", {**TUNING["fused_fwd"], "enabled": fused})
    # the delta-rule kernels take chunks of 64 only: 150 tokens are two and a ragged third
    tensors, h0 = test_delta_triton.make_inputs(B, 150, H, K, V, torch.float32, seed=3, gated=gated)
    compare(gated_delta_rule if gated else delta_rule, tensors, h0, TOL[torch.float32], chunk_size=64)


def test_the_shapes_really_span_blocks():
    from kernels.common.triton.launch import LAUNCH, tile

    assert K > 2 * tile(K, LAUNCH["bwd_dqk"]["BK"]) and K % 16 and V % 16 and T % CHUNK
