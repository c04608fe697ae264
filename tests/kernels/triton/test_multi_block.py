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
from kernels.gated_linear_attention.triton_vector import record_paths
from tests.kernels.triton import test_delta_triton, test_gla_triton, test_linear_triton
from tests.launch_util import CHUNK_OPS, DELTA_OPS, FUSED_FORWARD_FIELDS, each, small_tiles
from tests.util import TOL, TRITON_DECAY_TOL

B, T, H, K, V, CHUNK = 1, 40, 2, 40, 40, 16


@pytest.fixture(autouse=True)
def small_tiles_everywhere():
    """Every BK / BV cap of the launch settings at 16 (min_BV too), the fused forwards allowed
    from one head, the delta rule's fused state+output pass on and off by test."""
    from kernels.common.launch import launch_settings, settings

    ops = (*CHUNK_OPS, *DELTA_OPS)
    with launch_settings(**{op: small_tiles(settings(op), min_heads=1) for op in ops}):
        yield


FORWARDS = {  # the linear/GLA forward: (enabled, min_heads, segment_programs) of the fused entries
    "fused": (1, 1, None),
    "segmented": (1, 1024, 64),  # fewer heads than min_heads: each sequence cut into segments (3 here)
    "two_kernels": (0, 1, None),
}


def _forward(launch, name: str) -> None:
    from kernels.common.launch import settings

    enabled, min_heads, segments = FORWARDS[name]
    for op in CHUNK_OPS:
        changes = {}
        for entry in FUSED_FORWARD_FIELDS:
            setting = {"enabled": enabled, "min_heads": min_heads}
            if segments is not None and getattr(settings(op), entry).segment_programs:
                setting["segment_programs"] = segments
            changes[entry] = setting
        launch(**{op: changes})


@pytest.mark.parametrize("forward", list(FORWARDS))
def test_linear_attention(compare, launch, forward):
    _forward(launch, forward)
    tensors, h0 = test_linear_triton.make_inputs(B, T, H, K, V, torch.float32, seed=1)
    compare(linear_attention, tensors, h0, TOL[torch.float32], chunk_size=CHUNK)


@pytest.mark.parametrize("forward", list(FORWARDS))
@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
def test_gated_linear_attention(compare, launch, vector, forward):
    _forward(launch, forward)
    tensors, h0 = test_gla_triton.make_inputs(B, T, H, K, V, torch.float32, vector, seed=2)
    compare(gated_linear_attention, tensors, h0, TOL[torch.float32], chunk_size=CHUNK)


def test_gated_linear_attention_vector_gate_every_path(compare):
    """Per-channel gates mild in the first chunk and very negative after it: the whole-chunk,
    sub-chunk and exact paths of the vector-gate kernels, each across K-blocks (their
    reference points and channel masks are per block)."""
    tensors, h0 = test_gla_triton.make_inputs(B, T, H, K, V, torch.float32, True, seed=5)
    g = tensors["g"].clone()
    gen = torch.Generator().manual_seed(5)
    g[:, CHUNK:2 * CHUNK] = -2.0 - 2.0 * torch.rand(B, CHUNK, H, K, generator=gen)
    g[:, 2 * CHUNK:] = -12.0 - 8.0 * torch.rand(B, T - 2 * CHUNK, H, K, generator=gen)
    tensors["g"] = g
    with record_paths() as census:
        compare(gated_linear_attention, tensors, h0, TOL[torch.float32], chunk_size=CHUNK)
    # chunk 0 on the whole-chunk path, 1 on the sub-chunk path, 2 on the exact path, in
    # every K-block, as the kernels report it
    for entry in ("intra_A", "bwd_dqkg"):
        assert test_gla_triton.kernel_census(census, entry) == [[0] * 3, [1] * 3, [2] * 3], entry


@pytest.mark.parametrize("fused", [0, 1], ids=["two_kernels", "fused"])
@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
def test_delta_rules(compare, launch, gated, fused):
    launch(**each(DELTA_OPS, {"fused_fwd": {"enabled": fused}}))
    # the delta-rule kernels take chunks of 64 only: 150 tokens are two and a ragged third
    tensors, h0 = test_delta_triton.make_inputs(B, 150, H, K, V, torch.float32, seed=3, gated=gated)
    compare(gated_delta_rule if gated else delta_rule, tensors, h0, TOL[torch.float32], chunk_size=64)


def test_gated_linear_attention_vector_gate_blocks_unlike(compare):
    """Mild gates on the first K-block's channels, very negative ones on the others: each
    block's reference points (first, last, previous rows of its cumulative gate) must be its
    own, or the exponents of the other blocks overflow."""
    tensors, h0 = test_gla_triton.make_inputs(B, T, H, K, V, torch.float32, True, seed=6)
    gen = torch.Generator().manual_seed(6)
    g = -0.05 * torch.rand(B, T, H, K, generator=gen)
    g[..., 16:] = -10.0 - 10.0 * torch.rand(B, T, H, K - 16, generator=gen)
    tensors["g"] = g
    compare(gated_linear_attention, tensors, h0, TOL[torch.float32], chunk_size=CHUNK)


def test_gated_linear_attention_vector_gate_reference_rows_per_block(compare):
    """Each K-block on its own path with its own reference rows: the first block's channels
    barely decay (the whole-chunk path); the second's forget 55 nats at every chunk's first row
    (80 log2-units, the kernels' per-token gate floor) and 2.5 nats a token after it, 54
    log2-units a chunk (the whole-chunk path too); the third's lose 6.5 nats a token (104 a
    chunk: the exact path). A block that took the first block's first row as its reference
    would scale its keys by 2^134 and overflow fp32; one that chose its path by that row would
    take the sub-chunk path. The chunks' gates sum to about -100 nats: TRITON_DECAY_TOL."""
    tensors, h0 = test_gla_triton.make_inputs(B, T, H, K, V, torch.float32, True, seed=7)
    g = torch.full((B, T, H, K), -0.01)
    g[..., 16:32] = -2.5
    g[:, ::CHUNK, :, 16:32] = -55.0
    g[..., 32:] = -6.5
    tensors["g"] = g
    with record_paths() as census:
        compare(gated_linear_attention, tensors, h0, TRITON_DECAY_TOL, chunk_size=CHUNK)
    # per chunk, the path each K-block's program ran (0: whole chunk, 2: exact), as the
    # kernels report it
    for entry in ("intra_A", "bwd_dqkg"):
        assert test_gla_triton.kernel_census(census, entry) == [[0, 0, 2]] * 3, entry


def test_the_shapes_really_span_blocks_and_segments(launch):
    from kernels.common.launch import settings
    from kernels.common.triton.utils import block_size
    from kernels.gated_linear_attention.triton_fused_forward import chunks_per_segment, segment_target

    assert K > 2 * block_size(K, settings("linear_attention").bwd_dqk.BK) and K % 16 and V % 16 and T % CHUNK
    _forward(launch, "segmented")
    NT, programs = -(-T // CHUNK), B * H * -(-V // 16)
    assert chunks_per_segment(NT, programs, segment_target(B * H, 0)) < NT


def test_mesa(launch):
    """MesaNet: the state passes' blocks and the gradient kernel's key-column block lowered to
    16 over K = 40 (and D = K or V; three column blocks, the last partial), and V = 80 against
    the solve and gradient kernels' fixed 64-wide V-block: two V-blocks, the second partial."""
    from tests.kernels.triton import test_mesa_triton

    launch(mesa={"states": {"max_BK": 16, "max_BD": 16, "min_BD": 16}, "grads": {"BC": 16}})
    leaves = test_mesa_triton.make_inputs(B, T, 1, K, 80, seed=8)
    test_mesa_triton.check(leaves, torch.float32, TOL[torch.float32], chunk_size=CHUNK, cg_steps=K + 16)


@pytest.mark.parametrize("op", ["linear", "gla_vector", "gdn"])
def test_decode_step_across_value_blocks(monkeypatch, op):
    """The fused decode step's V-block is at most 64 wide: V = 80 is two blocks, the second
    partial (K is one block by design)."""
    from tests.kernels.triton import test_step_triton
    from tests.util import rel_err, row_err

    monkeypatch.setattr(test_step_triton, "V", 80)
    args, state = test_step_triton.step_inputs(op, torch.float32)
    assert args["v_t"].shape[-1] == 80
    o, h = test_step_triton.STEPS[op](**args, state=state, scale=0.3, backend="triton")
    ref = {n: t.double() for n, t in args.items()}
    o_ref, h_ref = test_step_triton.STEPS[op](**ref, state=state.double(), scale=0.3, backend="torch")
    for got, want in ((o, o_ref), (h, h_ref)):
        assert rel_err(got, want) < TOL[torch.float32] and row_err(got, want) < TOL[torch.float32]
