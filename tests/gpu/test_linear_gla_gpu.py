"""Triton linear attention and GLA on a CUDA GPU at real shapes (docs/design.md §9).

bf16 at T up to 32k with K = V = 128, fp32 and fp16 at moderate T, gates near zero and
strongly negative; outputs, final states and every gradient (q, k, v, g, initial state)
checked one by one against the chunked PyTorch form run in fp64 on the same GPU (the
per-token loop is too slow at these lengths). The gated backward is checked gradient by
gradient: FLA refuses its own on Triton 3.6 / Hopper for a miscompilation. The ops run
with backend="triton" and each case asserts that the Triton entry point ran; every error is
held to TOL (whole tensor) and ROW_TOL (worst row, tests/util.py), except that a bf16 worst
row over ROW_TOL passes when the same case with fp16 inputs shows it to be rounding
(tests/util.py rounding_verdict), as in the delta rules' GPU tests. A vector gate's cases
log the share of chunks on each intra-chunk path from triton_vector.path_shares (the PyTorch
copy of the kernels' choice, which the CPU tests hold to the census the kernels report): the
kernels run as launched by default, without the census store.

Skipped without CUDA, and in a session where TRITON_INTERPRET is set (run tests/gpu in a
pytest session of its own). Errors are printed (-s) and, when GPU_ERRORS_JSON names a file,
written there under each case's label.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.gpu.backends import triton_ran
from tests.util import (
    GPU_ONLY,
    ROW_TOL,
    TOL,
    TRITON_DECAY_TOL,
    record_gpu_errors,
    rel_err,
    rounding_verdict,
    row_err,
)

pytestmark = GPU_ONLY

pytest.importorskip("triton")


def make_inputs(B, T, H, K, V, dtype, gate, gate_kind, seed):
    """q, k (l2-normalised keys, as models use), v, g and h0 on the GPU.

    gate: "none" | "scalar" | "vector"; gate_kind: "near0" (logsigmoid(N(4, 1)), decays
    around 0.98), "moderate" (logsigmoid(N(-2, 1)), about -2 a token: the vector gate's
    sub-chunk factored path) or "strong" (uniform in [-12, 0] per token: a chunk sums to
    hundreds, the vector gate's exact path for most chunks)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    q = torch.randn(B, T, H, K, device=dev, generator=gen).to(dtype)
    k = F.normalize(torch.randn(B, T, H, K, device=dev, generator=gen), dim=-1).to(dtype)
    v = torch.randn(B, T, H, V, device=dev, generator=gen).to(dtype)
    tensors = {"q": q, "k": k, "v": v}
    if gate != "none":
        shape = (B, T, H, K) if gate == "vector" else (B, T, H)
        if gate_kind == "near0":
            g = F.logsigmoid(torch.randn(shape, device=dev, generator=gen) + 4.0)
        elif gate_kind == "moderate":
            g = F.logsigmoid(torch.randn(shape, device=dev, generator=gen) - 2.0)
        else:
            g = -12.0 * torch.rand(shape, device=dev, generator=gen)
        tensors["g"] = g.float()
    h0 = torch.randn(B, H, K, V, device=dev, generator=gen)
    return tensors, h0


def dtype_name(dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]


def check_against_fp64(tensors, h0, chunk_size=64, label=""):
    """Errors of o, the final state and every gradient of the Triton op against the chunked
    PyTorch form in fp64: rel_err under each name, row_err under "<name> (worst row)";
    recorded under `label`. The caller asserts them (assert_each)."""
    from kernels.common.triton import utils
    from kernels.gated_linear_attention import gated_linear_attention
    from kernels.gated_linear_attention.triton_vector import path_shares
    from kernels.linear_attention import linear_attention

    op, op_name = ((gated_linear_attention, "gated_linear_attention") if "g" in tensors
                   else (linear_attention, "linear_attention"))
    leaves = dict(tensors, initial_state=h0)
    ours = {n: t.detach().clone().requires_grad_(True) for n, t in leaves.items()}
    ref = {n: t.detach().double().requires_grad_(True) for n, t in leaves.items()}
    # poison: every buffer the wrappers allocate starts as NaN
    utils.DEBUG.poison = True
    try:
        with triton_ran(op_name):
            o, ht = op(**ours, output_final_state=True, backend="triton", chunk_size=chunk_size)
        gen = torch.Generator(device="cuda").manual_seed(1234)
        do = torch.randn(o.shape, device="cuda", generator=gen).to(o.dtype)
        dht = torch.randn(ht.shape, device="cuda", generator=gen)
        grads = torch.autograd.grad((o, ht), list(ours.values()), (do, dht))
    finally:
        utils.DEBUG.poison = False
    o_ref, ht_ref = op(**ref, output_final_state=True, backend="torch", chunk_size=chunk_size)
    grads_ref = torch.autograd.grad((o_ref, ht_ref), list(ref.values()), (do.double(), dht.double()))
    pairs = {"o": (o, o_ref), "final_state": (ht, ht_ref)}
    pairs.update({"d" + name: (g, g_ref) for name, g, g_ref in zip(ours, grads, grads_ref)})
    errors = {name: rel_err(a, b) for name, (a, b) in pairs.items()}
    errors.update({f"{name} (worst row)": row_err(a, b) for name, (a, b) in pairs.items()})
    record_gpu_errors(label, errors)
    paths = ""
    if "g" in tensors and tensors["g"].dim() == 4:
        paths = " paths " + str(path_shares(tensors["g"], tensors["q"].dtype, chunk_size))
    # one line the device scripts keep (benchmarks/h200_kernels.sh greps "GPU-ERR")
    print(f"\nGPU-ERR {label}: " + " ".join(f"{n}={e:.2e}" for n, e in errors.items()) + paths)
    return errors


def assert_each(errors, tol, row_tol, fp16_twin=None):
    """Every whole-tensor error under tol, every worst-row error under row_tol; with
    fp16_twin (a bf16 case: the errors of the same case with fp16 inputs, measured on first
    need), a worst row over row_tol passes only when the twin shows it to be rounding
    (tests/util.py rounding_verdict)."""
    twin = None
    for name, err in errors.items():
        is_row = name.endswith("(worst row)")
        bound = row_tol if is_row else tol
        if err < bound:
            continue
        why = "no fp16 twin" if is_row else "a whole tensor has no rounding allowance"
        if is_row and fp16_twin is not None:
            twin = twin if twin is not None else fp16_twin()
            why = rounding_verdict(err, twin[name.removesuffix(" (worst row)")], twin[name])
        assert why is None, f"{name}: {err:.3e} >= {bound:g}, and {why} (all: {errors})"


@pytest.mark.parametrize(
    "gate, gate_kind, T",
    [
        ("none", "-", 32768),
        ("scalar", "near0", 32768),
        ("scalar", "strong", 8192),
        ("vector", "near0", 32768),
        ("vector", "moderate", 32768),
        ("vector", "strong", 8192),
    ],
)
def test_bf16_long_sequences(gate, gate_kind, T):
    def errors_in(dtype):
        tensors, h0 = make_inputs(1, T, 2, 128, 128, dtype, gate, gate_kind, seed=T + len(gate_kind))
        return check_against_fp64(tensors, h0, label=f"{dtype_name(dtype)} T={T} gate={gate}/{gate_kind}")

    assert_each(errors_in(torch.bfloat16), TOL[torch.bfloat16], ROW_TOL[torch.bfloat16], lambda: errors_in(torch.float16))


@pytest.mark.parametrize("gate", ["none", "scalar", "vector"])
@pytest.mark.parametrize("K, V, T", [(128, 128, 1000), (100, 60, 777)])
def test_fp32(gate, K, V, T):
    tensors, h0 = make_inputs(2, T, 3, K, V, torch.float32, gate, "near0", seed=K + T)
    errors = check_against_fp64(tensors, h0, label=f"fp32 T={T} K={K} V={V} gate={gate}")
    assert_each(errors, TOL[torch.float32], ROW_TOL[torch.float32])


@pytest.mark.parametrize("gate_kind", ["moderate", "strong"])
def test_fp32_vector_partial_blocks(gate_kind):
    """fp32 vector gates off the whole-chunk path, K = 100 (the backward's second K-block
    partial) and V = 60, held to TRITON_DECAY_TOL: moderate gates (about -2 nats a token) sum
    to ~130 nats over a chunk and strong ones to hundreds, the regime whose decays inherit the
    rounding of fp32 cumulative gates (tests/util.py). The same case on the CPU interpreter
    halves every error with each halving of the chunk (dg worst row, chunks 64 / 32 / 16:
    3.1e-5 / 1.7e-5 / 9.9e-6 moderate, 1.2e-4 / 5.2e-5 / 2.3e-5 strong; 2026-12-06), as that
    rounding does, and the H100 measured 3.7e-5 and 1.6e-4 at chunks of 64, its fp32 scan
    adding the rounding of partial sums. With the cumulative gates summed in fp64 and rounded
    once (kernels/common/triton/cumsum.py) the interpreter measures 2.2e-5 and 7.2e-5, and a
    GPU's gammas are the same fp64 sums, rounded once."""
    tensors, h0 = make_inputs(2, 777, 3, 100, 60, torch.float32, "vector", gate_kind, seed=5)
    errors = check_against_fp64(tensors, h0, label=f"fp32 T=777 K=100 V=60 vector/{gate_kind}")
    assert_each(errors, TRITON_DECAY_TOL, TRITON_DECAY_TOL)


@pytest.mark.parametrize("shape", [(2, 32767, 32), (8, 8192, 16), (1, 8191, 16, 128)],
                         ids=["scalar_32_heads", "scalar_16_heads", "vector"])
def test_chunk_local_cumsum_rounds_once(shape):
    """The chunk-local cumulative log2-gates at the benchmark's shapes (several heads' columns a
    program, a partial last chunk): each within one fp32 ulp of the chunk's exact fp64 sum,
    on strong gates with some -inf (raised to the floor)."""
    from kernels.common.triton.cumsum import chunk_local_cumsum
    from kernels.common.triton.gates import GATE_FLOOR_LOG2, LOG2E

    gen = torch.Generator(device="cuda").manual_seed(sum(shape))
    g = -2.0 - 7.0 * torch.rand(shape, device="cuda", generator=gen)
    g[:, 5] = float("-inf")
    ours = chunk_local_cumsum(g, 64, LOG2E)
    T, pad = shape[1], -shape[1] % 64
    r = torch.clamp(g.double() * LOG2E, min=GATE_FLOOR_LOG2)
    r = F.pad(r.movedim(1, -1), (0, pad)).unflatten(-1, (-1, 64)).cumsum(-1).flatten(-2)[..., :T].movedim(-1, 1)
    ulp = torch.finfo(torch.float32).eps * r.abs().clamp(min=1.0)
    assert ours.dtype == torch.float32 and torch.isfinite(ours).all()
    assert ((ours.double() - r).abs() / ulp).max().item() <= 1.0


@pytest.mark.parametrize("segments", [0, 1024], ids=["one_segment", "segmented"])
@pytest.mark.parametrize("gate", ["none", "scalar", "vector"])
def test_bf16_fused_forward(monkeypatch, gate, segments):
    """The fused forward (kernels/gated_linear_attention/triton_fused_forward.py), which the benchmark shapes
    use from B * H = 64 on, forced here at B * H = 2; "segmented" also cuts the sequence into
    segments run in parallel (segment_programs = 1024: 128 chunks into 128 segments here)."""
    from kernels.common.launch import launch_settings
    from tests.launch_util import CHUNK_OPS, each, fused_forward_changes

    # segments run below min_heads only
    fused = fused_forward_changes(min_heads=10**6 if segments else 1, segment_programs=segments)
    def errors_in(dtype):
        tensors, h0 = make_inputs(1, 8192, 2, 128, 128, dtype, gate, "near0", seed=77)
        return check_against_fp64(tensors, h0, label=f"{dtype_name(dtype)} fused/{segments} T=8192 gate={gate}")

    with launch_settings(**each(CHUNK_OPS, fused)):
        assert_each(errors_in(torch.bfloat16), TOL[torch.bfloat16], ROW_TOL[torch.bfloat16], lambda: errors_in(torch.float16))


@pytest.mark.parametrize("segments", [0, 1024], ids=["one_segment", "segmented"])
@pytest.mark.parametrize("gate_kind", ["near0", "strong"])
def test_bf16_scalar_decay_on_values(gate_kind, segments):
    """The scalar gate's decay into the state on the value rows (FusedForwardLaunch.decay_on_v),
    in the fused forward and the segments' local states, forced on at B * H = 2, T = 8,192."""
    from kernels.common.launch import launch_settings
    from tests.launch_util import CHUNK_OPS, each, fused_forward_changes

    fused = fused_forward_changes(min_heads=10**6 if segments else 1, segment_programs=segments, decay_on_v=True)

    def errors_in(dtype):
        tensors, h0 = make_inputs(1, 8192, 2, 128, 128, dtype, "scalar", gate_kind, seed=78)
        return check_against_fp64(tensors, h0, label=f"{dtype_name(dtype)} decay on v/{segments} T=8192 "
                                                       f"gate=scalar/{gate_kind}")

    with launch_settings(**each(CHUNK_OPS, fused)):
        assert_each(errors_in(torch.bfloat16), TOL[torch.bfloat16], ROW_TOL[torch.bfloat16], lambda: errors_in(torch.float16))


@pytest.mark.parametrize("K", [64, 128])
@pytest.mark.parametrize("gate", ["none", "scalar"])
def test_bf16_unnarrowed_sequential_passes(gate, K):
    """The fused forward and the backward state pass at 64-column V-blocks where a few sequences
    of heads would narrow them (min_waves 1 keeps 64 at 256 sequences on an H100), forced at
    B * H = 2 by min_BV 64: the blocks the benchmark's T = 8k shapes now run."""
    from kernels.common.launch import launch_settings
    from tests.launch_util import CHUNK_OPS, each, fused_forward_changes

    changes = {**fused_forward_changes(min_heads=1, min_BV=64), "bwd_states": {"min_BV": 64}}

    def errors_in(dtype):
        tensors, h0 = make_inputs(1, 8192, 2, K, 128, dtype, gate, "near0", seed=65)
        return check_against_fp64(tensors, h0, label=f"{dtype_name(dtype)} BV 64 passes T=8192 K={K} gate={gate}")

    with launch_settings(**each(CHUNK_OPS, changes)):
        assert_each(errors_in(torch.bfloat16), TOL[torch.bfloat16], ROW_TOL[torch.bfloat16], lambda: errors_in(torch.float16))


@pytest.mark.parametrize("gate", ["none", "scalar"])
def test_bf16_fused_forward_three_stages_at_k64(gate):
    """The fused forward at three pipeline stages at K = 64 (FusedForwardLaunch.narrow_num_stages,
    the form timed faster there: records 20261207T054910), forced on at B * H = 4."""
    from kernels.common.launch import launch_settings
    from tests.launch_util import CHUNK_OPS, each, fused_forward_changes

    def errors_in(dtype):
        tensors, h0 = make_inputs(2, 8192, 2, 64, 128, dtype, gate, "near0", seed=64)
        return check_against_fp64(tensors, h0, label=f"{dtype_name(dtype)} fused 3 stages T=8192 K=64 gate={gate}")

    with launch_settings(**each(CHUNK_OPS, fused_forward_changes(min_heads=1, narrow_num_stages=3))):
        assert_each(errors_in(torch.bfloat16), TOL[torch.bfloat16], ROW_TOL[torch.bfloat16], lambda: errors_in(torch.float16))


@pytest.mark.parametrize("gate", ["scalar", "vector"])
def test_fp16_and_large_head_dims(gate):
    tensors, h0 = make_inputs(1, 1500, 2, 256, 256, torch.float16, gate, "near0", seed=3)
    errors = check_against_fp64(tensors, h0, label=f"fp16 K=V=256 gate={gate}")
    assert_each(errors, TOL[torch.float16], ROW_TOL[torch.float16])


@pytest.mark.parametrize("gate_kind", ["near0", "moderate", "strong"])
def test_bf16_vector_one_launch_16_rows(gate_kind):
    """Vector-gate settings off by default: the backward's paths in one launch, sub-chunks of
    16 rows in the forward and backward."""
    from kernels.common.launch import launch_settings

    def errors_in(dtype):
        tensors, h0 = make_inputs(1, 8192, 2, 128, 128, dtype, "vector", gate_kind, seed=91)
        return check_against_fp64(tensors, h0, label=f"{dtype_name(dtype)} one launch, 16 rows T=8192 gate=vector/{gate_kind}")

    with launch_settings(gated_linear_attention={"bwd_dqkg": {"split_paths": False, "sub_chunk": 16},
                                                 "intra_A": {"sub_chunk": 16}}):
        assert_each(errors_in(torch.bfloat16), TOL[torch.bfloat16], ROW_TOL[torch.bfloat16], lambda: errors_in(torch.float16))


@pytest.mark.parametrize("K, BK, warps", [(64, 64, 4), (64, 128, 8), (128, 128, 8)])
@pytest.mark.parametrize("gate, gate_kind", [("none", "-"), ("scalar", "near0"), ("scalar", "strong")])
def test_bf16_dv_fused_into_dqk(monkeypatch, gate, gate_kind, K, BK, warps):
    """dv formed in the dq/dk kernel (ChunkLaunch.bwd_dqk.fuse_dv, one key block of BK spanning
    K; the candidates' warps): chunk_bwd_dv must not run, and every gradient holds its bounds at
    T = 8,192, bf16."""
    from kernels.common.launch import launch_settings
    from kernels.gated_linear_attention import triton_function
    from tests.launch_util import CHUNK_OPS, calls_of, each

    calls = calls_of(monkeypatch, triton_function, "chunk_bwd_dv")

    def errors_in(dtype):
        tensors, h0 = make_inputs(2, 8192, 2, K, 128, dtype, gate, gate_kind, seed=K + len(gate_kind))
        return check_against_fp64(tensors, h0, label=f"{dtype_name(dtype)} dv fused T=8192 K={K} gate={gate}/{gate_kind}")

    with launch_settings(**each(CHUNK_OPS, {"bwd_dqk": {"fuse_dv": True, "BK": BK, "num_warps": warps}})):
        assert_each(errors_in(torch.bfloat16), TOL[torch.bfloat16], ROW_TOL[torch.bfloat16], lambda: errors_in(torch.float16))
    assert calls == []
