"""Triton gated linear attention (scalar gate [B, T, H] and vector gate [B, T, H, K])
against the per-token reference, on the CPU interpreter.

Outputs, final states and the gradients of q, k, v, g and the initial state; fp32 (and
fp16) inputs, awkward T, gates near zero and strongly negative; every buffer the kernels
write starts as NaN (conftest). The vector-gate tests that aim at one intra-chunk path read
which path each program ran from the kernels themselves (triton_vector.record_paths)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.gated_linear_attention import gated_linear_attention, triton_function
from kernels.gated_linear_attention.triton_vector import record_paths
from tests.launch_util import CHUNK_OPS, calls_of, each, fused_forward_changes
from tests.util import TOL, TRITON_DECAY_TOL


def make_inputs(B, T, H, K, V, dtype, vector, gate_scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen).to(dtype)
    k = torch.randn(B, T, H, K, generator=gen).to(dtype)
    v = torch.randn(B, T, H, V, generator=gen).to(dtype)
    gate_shape = (B, T, H, K) if vector else (B, T, H)
    # logsigmoid of a shifted normal: decays mostly close to 1, some much smaller
    g = (F.logsigmoid(torch.randn(gate_shape, generator=gen) + 2.0) * gate_scale).to(dtype)
    h0 = torch.randn(B, H, K, V, generator=gen)
    return {"q": q, "k": k, "v": v, "g": g}, h0


def kernel_census(census: dict, entry: str) -> list[list[int]]:
    """Per chunk of sequence 0, head 0, the path code of each K-block that the `entry`
    kernel ("intra_A" or "bwd_dqkg") reported running, from a record_paths census of one
    Triton call (forward and backward). Every chunk and K-block must have been worked on: a
    -1 left in the census is one that no launch covered."""
    assert len(census[entry]) == 1, f"{entry}: {len(census[entry])} calls recorded, expected one"
    paths = census[entry][0]
    assert (paths >= 0).all(), f"{entry}: chunks no program worked on: {paths.tolist()}"
    return paths[0, 0].tolist()


def three_path_gates(B, T, H, K, seed):
    """Natural-log vector gates for T = 200 (chunks of 64: 0-63, 64-127, 128-191, 192-199):
    mild in chunk 0 (whole-chunk factoring), -1 to -3 a token in chunks 1 and 3 (about
    4 bits a row: 180 across a chunk, under 30 within 8 rows), -10 to -20 in chunk 2
    (over 100 bits within 8 rows: the exact path)."""
    gen = torch.Generator().manual_seed(seed)
    g = F.logsigmoid(torch.randn(B, T, H, K, generator=gen) + 4.0)
    g[:, 64:128] = -1.0 - 2.0 * torch.rand(B, 64, H, K, generator=gen)
    g[:, 128:192] = -10.0 - 10.0 * torch.rand(B, 64, H, K, generator=gen)
    g[:, 192:] = -1.0 - 2.0 * torch.rand(B, T - 192, H, K, generator=gen)
    return g


def outputs_and_grads(tensors: dict) -> list[torch.Tensor]:
    """o and the gradients of q, k, v, g of the Triton op under an all-ones output gradient."""
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in tensors.items()}
    o, _ = gated_linear_attention(**leaves, backend="triton")
    o.backward(torch.ones_like(o))
    return [o.detach()] + [leaves[n].grad for n in ("q", "k", "v", "g")]


SHAPES = [
    (1, 1, 2, 16, 16),
    (1, 63, 2, 16, 32),
    (1, 64, 1, 32, 16),
    (2, 100, 1, 32, 32),
]


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("B, T, H, K, V", SHAPES)
def test_matches_reference_fp32(compare, vector, B, T, H, K, V):
    tensors, h0 = make_inputs(B, T, H, K, V, torch.float32, vector, seed=T + vector)
    compare(gated_linear_attention, tensors, h0, TOL[torch.float32])


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
def test_matches_reference_fp16(compare, vector):
    tensors, h0 = make_inputs(1, 100, 1, 32, 16, torch.float16, vector, seed=9)
    compare(gated_linear_attention, tensors, h0, TOL[torch.float16])


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
def test_strongly_negative_gates(compare, vector):
    """Gates down to about -40 per token: a chunk's cumulative gate reaches -2000, far past
    where e^{-gamma} overflows fp32. Nothing may overflow, and decays that small must still
    give the reference's answer, within the rounding of such cumulative gates
    (TRITON_DECAY_TOL)."""
    tensors, h0 = make_inputs(1, 80, 1, 16, 16, torch.float32, vector, gate_scale=20.0, seed=4)
    compare(gated_linear_attention, tensors, h0, TRITON_DECAY_TOL)


def test_vector_gate_mixed_chunks(compare):
    """Mild gates in the first chunk (whole-chunk factoring in triton_vector.py) and
    strongly negative ones in the second (the exact sub-chunk path), in one call and in one
    K-block: both paths, the hand-over between them, outputs and every gradient."""
    tensors, h0 = make_inputs(1, 100, 1, 16, 16, torch.float32, vector=True, seed=14)
    g = tensors["g"].clone()
    g[:, 64:] = -12.0 - 8.0 * torch.rand(1, 36, 1, 16, generator=torch.Generator().manual_seed(14))
    tensors["g"] = g
    with record_paths() as census:
        compare(gated_linear_attention, tensors, h0, TOL[torch.float32])
    assert kernel_census(census, "intra_A") == [[0], [2]]


@pytest.mark.parametrize("rows", [16, 4, 2])
def test_vector_gate_exact_path_rows(compare, launch, rows):
    """The exact path with sub-chunks of other heights than the default 8 (the launch's sub_chunk
    of the forward and backward kernels): gates of -1 to -3 a token, and -70 (over 64 bits
    in one step) at the second row of each chunk in one channel, so every chunk takes it;
    T = 100 leaves a partial chunk and sub-chunk. A chunk's gates sum to about -130 nats
    a channel: TRITON_DECAY_TOL."""
    from kernels.gated_linear_attention import triton_vector

    launch(gated_linear_attention={entry: {"sub_chunk": rows} for entry in ("intra_A", "bwd_dqkg")})
    assert triton_vector.sub_chunk("intra_A", 64) == rows
    tensors, h0 = make_inputs(1, 100, 1, 16, 16, torch.float32, vector=True, seed=17)
    g = -1.0 - 2.0 * torch.rand(1, 100, 1, 16, generator=torch.Generator().manual_seed(17))
    g[:, 1::64, :, 0] = -70.0
    tensors["g"] = g
    with record_paths() as census:
        compare(gated_linear_attention, tensors, h0, TRITON_DECAY_TOL)
    assert kernel_census(census, "bwd_dqkg") == [[2], [2]]


def test_sub_chunk_must_be_a_power_of_two():
    from kernels.common.launch import launch_settings

    with pytest.raises(ValueError, match="sub_chunk must be one of"):
        with launch_settings(gated_linear_attention={"intra_A": {"sub_chunk": 12}}):
            pass


@pytest.mark.parametrize("split", [1, 0], ids=["two_launches", "one_launch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32_three_paths", "fp16_exact_only"])
def test_vector_gate_split_launches(compare, launch, dtype, split):
    """Chunks on all three paths of triton_vector.py in one call and one K-block (whole
    chunk factored, sub-chunks factored, exact), as the kernels report them; fp16 never
    factors. ChunkLaunch.bwd_dqkg.split_paths: 1 (the default), the backward as one launch
    per path (each program of one does nothing where its chunk takes another path; fp16
    launches the exact one alone); 0, one launch taking every path. Every chunk written
    (buffers start as NaN, the census starts at -1), every gradient right. The PyTorch copy
    of the path choice (chunk_paths, which benchmark records use) agrees with the kernels
    on every chunk and head."""
    from kernels.gated_linear_attention.triton_vector import chunk_paths

    launch(gated_linear_attention={"bwd_dqkg": {"split_paths": split}})
    tensors, h0 = make_inputs(1, 200, 2, 16, 16, dtype, vector=True, seed=16)
    tensors["g"] = three_path_gates(1, 200, 2, 16, seed=16).to(dtype)
    with record_paths() as census:
        compare(gated_linear_attention, tensors, h0, TOL[dtype])
    # chunk 3 has 8 rows: its 7 gate steps stay within 2^64, so it factors whole
    expected = [[0], [1], [2], [0]] if dtype == torch.float32 else [[2]] * 4
    for entry in ("intra_A", "bwd_dqkg"):
        assert kernel_census(census, entry) == expected, entry
        assert torch.equal(chunk_paths(tensors["g"], dtype, 64, entry), census[entry][0].long()), entry


def test_vector_gate_inter_after(compare, launch):
    """inter_after on: the backward's sums over V for the inter-chunk parts after
    the intra-chunk part, on every path's launch."""
    launch(gated_linear_attention={entry: {"inter_after": True} for entry in ("bwd_dqkg", "bwd_dqkg_sub", "bwd_dqkg_exact")})
    tensors, h0 = make_inputs(1, 200, 1, 16, 16, torch.float32, vector=True, seed=20)
    tensors["g"] = three_path_gates(1, 200, 1, 16, seed=20)
    with record_paths() as census:
        compare(gated_linear_attention, tensors, h0, TOL[torch.float32])
    assert kernel_census(census, "bwd_dqkg") == [[0], [1], [2], [0]]


@pytest.mark.parametrize("rows", [16, 4, 1])
def test_vector_gate_sub_path_rows(compare, launch, rows):
    """The sub-chunk factored path with sub-chunks of other heights than the default 8:
    16 rows (15 steps of up to 4.3 bits: still under 2^64), 4, and 1 (which every gate
    satisfies); T = 100 leaves a partial chunk and sub-chunk. A chunk's gates sum to about
    -130 nats a channel: TRITON_DECAY_TOL."""
    launch(gated_linear_attention={entry: {"sub_chunk": rows} for entry in ("intra_A", "bwd_dqkg")})
    tensors, h0 = make_inputs(1, 100, 1, 16, 16, torch.float32, vector=True, seed=18)
    gen = torch.Generator().manual_seed(18)
    tensors["g"] = -1.0 - 2.0 * torch.rand(1, 100, 1, 16, generator=gen)
    with record_paths() as census:
        compare(gated_linear_attention, tensors, h0, TRITON_DECAY_TOL)
    assert kernel_census(census, "intra_A") == [[1], [1]]


def test_vector_gate_sub_path_equals_exact(monkeypatch):
    """The sub-chunk factored path is the exact path's maths in another order: forcing the
    exact path (span -1) on gates that take the sub path changes outputs and gradients
    only by fp32 rounding."""
    from kernels.gated_linear_attention import triton_vector
    from tests.util import rel_err

    tensors, _ = make_inputs(1, 130, 2, 32, 16, torch.float32, vector=True, seed=19)
    gen = torch.Generator().manual_seed(19)
    tensors["g"] = -1.0 - 2.0 * torch.rand(1, 130, 2, 32, generator=gen)

    with record_paths() as census:
        default = outputs_and_grads(tensors)
    assert kernel_census(census, "bwd_dqkg") == [[1], [1], [0]]
    monkeypatch.setattr(triton_vector, "factored_span", lambda dtype: -1.0)
    with record_paths() as census:
        exact = outputs_and_grads(tensors)
    assert kernel_census(census, "bwd_dqkg") == [[2], [2], [2]]
    for name, a, b in zip(("o", "dq", "dk", "dv", "dg"), default, exact):
        assert rel_err(a, b) < 1e-5, name


@pytest.mark.parametrize("span", [-1.0, 1e9], ids=["never_factored", "always_factored"])
def test_vector_gate_paths_agree(monkeypatch, span):
    """Forcing one path everywhere (mild gates, so both are safe) gives the same outputs and
    gradients as the default choice: the fast path is the same maths, not an approximation."""
    from kernels.gated_linear_attention import triton_vector

    tensors, _ = make_inputs(1, 100, 2, 32, 16, torch.float32, vector=True, seed=15)

    default = outputs_and_grads(tensors)
    monkeypatch.setattr(triton_vector, "factored_span", lambda dtype: span)
    forced = outputs_and_grads(tensors)
    from tests.util import rel_err

    for a, b in zip(forced, default):
        assert rel_err(a, b) < 1e-5


def test_gates_near_zero(compare):
    tensors, h0 = make_inputs(1, 70, 1, 16, 16, torch.float32, vector=True, gate_scale=1e-4, seed=6)
    compare(gated_linear_attention, tensors, h0, TOL[torch.float32])


def test_scalar_gate_chunk_32_odd_dims(compare):
    tensors, h0 = make_inputs(1, 75, 1, 20, 24, torch.float32, vector=False, seed=8)
    compare(gated_linear_attention, tensors, h0, TOL[torch.float32], chunk_size=32)


@pytest.mark.parametrize("gate", ["none", "scalar", "vector"])
def test_two_kernel_forward_matches_reference(compare, launch, gate):
    """The forward without the fused kernel (fwd_states + fwd_output, what K > 128 runs)."""
    from kernels.linear_attention import linear_attention

    launch(**each(CHUNK_OPS, fused_forward_changes(enabled=False)))
    tensors, h0 = make_inputs(1, 100, 2, 32, 16, torch.float32, gate == "vector", seed=21)
    if gate == "none":
        del tensors["g"]
    compare(linear_attention if gate == "none" else gated_linear_attention, tensors, h0, TOL[torch.float32])


@pytest.mark.parametrize("gate", ["none", "scalar", "vector"])
def test_fused_forward_equals_two_kernels(gate):
    """Same states (bit for bit) and outputs (up to summation order) as the two kernels."""
    from kernels.common.triton.cumsum import chunk_local_cumsum
    from kernels.common.triton.gates import LOG2E
    from kernels.gated_linear_attention.triton_function import gate_mode
    from kernels.gated_linear_attention.triton_fused_forward import chunk_fwd_fused
    from kernels.gated_linear_attention.triton_output import chunk_fwd_output
    from kernels.gated_linear_attention.triton_states import chunk_fwd_states
    from kernels.gated_linear_attention.triton_vector import gla_intra_A
    from tests.util import rel_err

    # fp16: the interpreter has no bf16 dots (docs/design.md §9)
    tensors, h0 = make_inputs(2, 130, 1, 32, 32, torch.float16, gate == "vector", seed=22)
    q, k, v = (tensors[n].contiguous() for n in ("q", "k", "v"))
    g = None if gate == "none" else tensors["g"].float()
    mode = gate_mode(g)
    gamma = chunk_local_cumsum(g, 64, LOG2E) if g is not None else None
    A = gla_intra_A(q, k, gamma, 0.2, 64) if gate == "vector" else None
    o, h, ht = chunk_fwd_fused(q, k, v, gamma, mode, A, h0, True, 0.2, 64)
    h2, ht2 = chunk_fwd_states(k, v, gamma, mode, h0, True, 64)
    o2 = chunk_fwd_output(q, k, v, h2, gamma, mode, A, 0.2, 64)
    assert torch.equal(h, h2) and torch.equal(ht, ht2)
    assert rel_err(o, o2) < 1e-3  # 16-bit outputs of the same fp32 sums, in another order


@pytest.mark.parametrize("target", [4, 6, 10**6], ids=["2_segments", "3_segments", "1_chunk_each"])
@pytest.mark.parametrize("gate", ["none", "scalar", "vector"])
def test_segmented_fused_forward_matches_reference(compare, monkeypatch, launch, gate, target):
    """The fused forward cut into segments run in parallel (segments.py), from an initial
    state, with the final state and every gradient: T = 300 is 5 chunks, cut into 2 segments
    (3 + 2 chunks), 3 (2 + 2 + 1) or 5; the last segment's local state is never formed."""
    from kernels.gated_linear_attention import triton_fused_forward as fused_forward
    from kernels.linear_attention import linear_attention

    # segments run below min_heads only (conftest lowers it to 1)
    launch(**each(CHUNK_OPS, fused_forward_changes(min_heads=10**6, segment_programs=target)))
    tensors, h0 = make_inputs(1, 300, 2, 16, 16, torch.float32, gate == "vector", seed=31)
    if gate == "none":
        del tensors["g"]
    calls = calls_of(monkeypatch, fused_forward, "segment_entry_states")
    compare(linear_attention if gate == "none" else gated_linear_attention, tensors, h0, TOL[torch.float32])
    assert calls, "the segmented path did not run"


@pytest.mark.parametrize("target", [0, 6], ids=["one_segment", "3_segments"])
def test_decay_on_values_matches_reference(compare, monkeypatch, launch, target):
    """The scalar gate's decay into the state on the value rows (FusedForwardLaunch.decay_on_v),
    in the fused forward and in the segments' local states, from an initial state, with the
    final state and every gradient; the launches say they took it."""
    from kernels.gated_linear_attention import triton_fused_forward as fused_forward
    from kernels.gated_linear_attention import triton_segments
    from tests.launch_util import LaunchSpy

    seen = []
    for module, name in ((fused_forward, "chunk_fwd_fused_kernel"), (triton_segments, "segment_local_states_kernel")):
        monkeypatch.setattr(module, name, LaunchSpy(getattr(module, name), lambda kw: seen.append(kw["DECAY_ON_V"])))
    launch(**each(CHUNK_OPS, fused_forward_changes(min_heads=10**6 if target else 1, segment_programs=target,
                                                   decay_on_v=True, narrow_decay_on_v=True)))
    tensors, h0 = make_inputs(1, 300, 2, 16, 16, torch.float32, False, seed=33)
    compare(gated_linear_attention, tensors, h0, TOL[torch.float32])
    assert seen and all(seen) and len(seen) == (2 if target else 1), seen


@pytest.mark.parametrize("K", [16, 128])
def test_decay_on_values_by_default_above_k64_and_in_the_segments(compare, monkeypatch, launch, K):
    """GLA's defaults: the segments' local states take the decay on the value rows at every head
    dim, the fused pass only above narrow_max_K (64), where it was timed faster; both forms
    give the reference's outputs, final state and gradients."""
    from kernels.common.launch import DEFAULTS
    from kernels.gated_linear_attention import triton_fused_forward as fused_forward
    from kernels.gated_linear_attention import triton_segments
    from tests.launch_util import LaunchSpy

    fused = DEFAULTS["gated_linear_attention"].fwd_fused_scalar
    assert fused.decay_on_v and not fused.narrow_decay_on_v and fused.narrow_max_K == 64
    seen = {}
    for module, name in ((fused_forward, "chunk_fwd_fused_kernel"), (triton_segments, "segment_local_states_kernel")):
        monkeypatch.setattr(module, name, LaunchSpy(getattr(module, name),
                                                    lambda kw, name=name: seen.setdefault(name, kw["DECAY_ON_V"])))
    # segments forced at B * H = 2 (the defaults' other fields kept)
    launch(gated_linear_attention={"fwd_fused_scalar": {"min_heads": 10**6, "segment_programs": 6}})
    tensors, h0 = make_inputs(1, 300, 2, K, 16, torch.float32, False, seed=35)
    compare(gated_linear_attention, tensors, h0, TOL[torch.float32])
    assert seen == {"chunk_fwd_fused_kernel": K > 64, "segment_local_states_kernel": True}, seen


def test_decay_on_values_states_near_the_two_kernels():
    """fp16, strong scalar gates, 130 tokens: the fused forward with the decay on the value rows
    against the two-kernel path, states and outputs equal up to where the scaled values, not
    the scaled keys, round to fp16."""
    from kernels.common.launch import launch_settings
    from kernels.common.triton.cumsum import chunk_local_cumsum
    from kernels.common.triton.gates import GATE_SCALAR, LOG2E
    from kernels.gated_linear_attention.triton_fused_forward import chunk_fwd_fused
    from kernels.gated_linear_attention.triton_output import chunk_fwd_output
    from kernels.gated_linear_attention.triton_states import chunk_fwd_states
    from tests.util import rel_err

    tensors, h0 = make_inputs(2, 130, 1, 32, 32, torch.float16, False, seed=24)
    q, k, v = (tensors[n].contiguous() for n in ("q", "k", "v"))
    gamma = chunk_local_cumsum(8 * tensors["g"].float(), 64, LOG2E)
    with launch_settings(gated_linear_attention={"fwd_fused_scalar": {"decay_on_v": True, "narrow_decay_on_v": True,
                                                                      "min_heads": 1}}):
        o, h, ht = chunk_fwd_fused(q, k, v, gamma, GATE_SCALAR, None, h0, True, 0.2, 64)
    h2, ht2 = chunk_fwd_states(k, v, gamma, GATE_SCALAR, h0, True, 64)
    o2 = chunk_fwd_output(q, k, v, h2, gamma, GATE_SCALAR, None, 0.2, 64)
    assert not torch.equal(ht, ht2)  # the other rounding did run
    for ours, base in ((h, h2), (ht, ht2), (o, o2)):
        assert rel_err(ours.float(), base.float()) < 2e-3


def test_segments_split_the_chunks():
    from kernels.gated_linear_attention.triton_fused_forward import chunks_per_segment

    assert chunks_per_segment(5, 2, 6) == 2  # 3 segments: 2 + 2 + 1 chunks
    assert chunks_per_segment(5, 2, 10**6) == 1
    assert chunks_per_segment(5, 8, 6) == 5  # enough programs already: one segment
    assert chunks_per_segment(512, 128, 1024) == 64  # 8 segments of a 32k sequence
    assert chunks_per_segment(32, 1024, 1056) == 32  # never 2 segments for 3% more programs
    assert chunks_per_segment(512, 64, 1056) == 32  # 16 segments


def test_segments_only_below_min_heads(launch):
    """Segments replace the two-kernel forward only where the one-pass forward has too few
    sequences (B * H < min_heads); from min_heads on, one segment per sequence."""
    from kernels.gated_linear_attention.triton_fused_forward import segment_target

    launch(linear_attention={"fwd_fused": {"min_heads": 64, "segment_programs": 1056}})
    assert segment_target(32, 0) == 1056 and segment_target(64, 0) == 0
    launch(linear_attention={"fwd_fused": {"segment_programs": 0}})
    assert segment_target(32, 0) == 0


@pytest.mark.parametrize("gate", ["none", "scalar", "vector"])
def test_inference_forward_keeps_no_states(monkeypatch, gate):
    """Without a gradient to compute (torch.no_grad, or no input requiring one) the fused
    forward writes no per-chunk states (ChunkOptions.store_states=False); outputs and the
    final state are the same bit for bit."""
    from kernels.gated_linear_attention import triton_fused_forward as fused_forward
    from kernels.linear_attention import linear_attention

    tensors, h0 = make_inputs(1, 150, 2, 16, 16, torch.float32, gate == "vector", seed=23)
    if gate == "none":
        del tensors["g"]
    op = linear_attention if gate == "none" else gated_linear_attention
    stored = []
    real = fused_forward.chunk_fwd_fused

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        stored.append(out[1] is not None)
        return out

    monkeypatch.setattr(triton_function, "chunk_fwd_fused", spy)
    leaves = {n: t.clone().requires_grad_(True) for n, t in tensors.items()}
    o1, ht1 = op(**leaves, initial_state=h0, output_final_state=True, backend="triton")
    with torch.no_grad():
        o2, ht2 = op(**leaves, initial_state=h0, output_final_state=True, backend="triton")
    o3, ht3 = op(**tensors, initial_state=h0, output_final_state=True, backend="triton")
    assert stored == [True, False, False]
    for o, ht in ((o2, ht2), (o3, ht3)):
        assert torch.equal(o, o1.detach()) and torch.equal(ht, ht1.detach())


@pytest.mark.parametrize("op, vector, dtype, shape, BV, gate_scale", [
    ("gla", False, torch.float32, (2, 100, 1, 32, 32), 16, 1.0),   # two V-blocks, a partial chunk
    ("gla", False, torch.float32, (1, 1, 2, 16, 16), 16, 1.0),     # one token
    ("gla", False, torch.float16, (1, 100, 1, 32, 16), 64, 1.0),
    ("gla", False, torch.float32, (1, 80, 1, 16, 16), 16, 20.0),   # gates to -40 a token
    ("linear", False, torch.float32, (1, 130, 2, 20, 24), 16, 1.0),  # K, V not powers of two
    ("linear", False, torch.float16, (1, 100, 2, 32, 16), 64, 1.0),
])
def test_dv_fused_into_the_dqk_kernel(compare, launch, monkeypatch, op, vector, dtype, shape, BV, gate_scale):
    """ChunkLaunch.bwd_dqk.fuse_dv: dv formed in the dq/dk kernel (chunk_bwd_dv not launched),
    against the per-token reference, for the scalar gate and the ungated op."""
    from kernels.linear_attention import linear_attention

    name = "gated_linear_attention" if op == "gla" else "linear_attention"
    launch(**{name: {"bwd_dqk": {"fuse_dv": True, "BK": 64, "BV": BV}}})
    calls = calls_of(monkeypatch, triton_function, "chunk_bwd_dv")
    tensors, h0 = make_inputs(*shape, dtype, vector, gate_scale=gate_scale, seed=sum(shape))
    if op == "linear":
        del tensors["g"]
    tol = TRITON_DECAY_TOL if gate_scale > 1 else TOL[dtype]
    compare(gated_linear_attention if op == "gla" else linear_attention, tensors, h0, tol)
    assert calls == []


def test_dv_not_fused_where_keys_span_several_blocks(compare, launch, monkeypatch):
    """With fuse_dv on but K over the dq/dk kernel's BK (K = 32 in blocks of 16), dv needs every
    key block's share of A: chunk_bwd_dv forms it, once."""
    launch(gated_linear_attention={"bwd_dqk": {"fuse_dv": True, "BK": 16}})
    calls = calls_of(monkeypatch, triton_function, "chunk_bwd_dv")
    tensors, h0 = make_inputs(1, 70, 1, 32, 16, torch.float32, vector=False, seed=5)
    compare(gated_linear_attention, tensors, h0, TOL[torch.float32])
    assert calls == [1]
