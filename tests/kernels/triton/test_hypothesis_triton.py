"""Hypothesis property tests of every Triton op under the interpreter, against the per-token
reference in fp64 (conftest: TRITON_INTERPRET=1, NaN-poisoned buffers).

Each example draws small shapes (B and H of 1 or 2; T as whole chunks plus a ragged tail;
K and V up to 40), the tile caps (the launch defaults, or every cap lowered to 16 so that a
K or V above 16 spans several blocks with a partial last one), the gate strength (mild,
strong, or a mix along time and channels with -inf resets), beta's range, an initial state
or none and the dtype (fp32; fp16 where the op's other tests take it, with mild gates), then
checks the public op with backend="triton" against backend="reference" on fp64 copies of the
same inputs: o, every final-state tensor and the gradient of every input under cotangents
drawn from a seeded generator, each by rel_err (under TOL) and row_err (under ROW_TOL), or
under TRITON_DECAY_TOL where the gates are strong (tests/util.py says why).

The examples are derandomized (the same ones every run, no example database) and few per op,
so that the file stays within its CI budget (about 90 s on two cores); shrinking is off, as
one example costs seconds, and a failure prints the example that failed.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from kernels import (
    LinGDNState,
    MesaState,
    delta_rule,
    gated_delta_rule,
    gated_linear_attention,
    linear_attention,
    linearized_softmax_gdn,
    mesa,
)
from tests.launch_util import CHUNK_OPS, DELTA_OPS, small_tiles
from tests.util import ROW_TOL, TOL, TRITON_DECAY_TOL, rel_err, row_err

F64 = torch.float64


def triton_settings(examples: int):
    """Few derandomized examples, no deadline (the interpreter is slow), no database."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    phases=(Phase.explicit, Phase.generate), suppress_health_check=[HealthCheck.too_slow])


# -- drawing the cases ------------------------------------------------------------------------


@st.composite
def shapes(draw, chunk_sizes=(16, 32, 64), max_chunks=3, min_K=1):
    """(B, T, H, K, V, chunk_size): T is some whole chunks and a tail (ragged unless it is 0,
    T >= 1); B * H * T stays small, as the interpreter runs every program in Python."""
    B, H = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    chunk = draw(st.sampled_from(chunk_sizes))
    full = draw(st.integers(0, max(0, max_chunks - B * H + 1)))
    tail = draw(st.integers(0 if full else 1, chunk - 1))
    K, V = draw(st.integers(min_K, 40)), draw(st.integers(1, 40))
    return B, full * chunk + tail, H, K, V, chunk


@contextlib.contextmanager
def tile_caps(small: bool):
    """small: every BK / BV cap of the linear/GLA and delta-rule launch tables at 16 (min_BV
    too) and MesaNet's state blocks at 16, as in test_multi_block.py; else the defaults."""
    from kernels.common import launch

    with contextlib.ExitStack() as stack:
        if small:
            ops = (*CHUNK_OPS, *DELTA_OPS, "mesa")
            stack.enter_context(launch.launch_settings(**{op: small_tiles(launch.settings(op)) for op in ops}))
        yield


# Log-space gate magnitudes per token: a mixed gate picks one per element, times U(0, 1).
# -20 per token stays the strongest finite one: its decay e^-20 keeps every gradient (that of
# the initial state through the first token included) far above fp32's smallest normal, which
# a relative comparison with fp64 needs. RESETS of the mixed elements are -inf (decay 0: the
# contract takes any g <= 0).
MIXED_MAGNITUDES = (0.0, 1e-3, 1.0, 5.0, 20.0)
RESETS = 0.05


def gates(kind: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Log-space gates <= 0: "mild" (decay mostly near 1: logsigmoid of N(3, 1)), "strong"
    (-5 to -20 a token: the state forgets within a few tokens) or "mixed" (each element from
    MIXED_MAGNITUDES, a share RESETS of them -inf, so mild, strong and resetting tokens and
    channels sit in one chunk)."""
    if kind == "mild":
        return F.logsigmoid(torch.randn(shape, generator=gen) + 3.0)
    if kind == "strong":
        return -5.0 - 15.0 * torch.rand(shape, generator=gen)
    pick = torch.randint(len(MIXED_MAGNITUDES), shape, generator=gen)
    g = -torch.tensor(MIXED_MAGNITUDES)[pick] * torch.rand(shape, generator=gen)
    return g.masked_fill(torch.rand(shape, generator=gen) < RESETS, float("-inf"))


BETA_RANGES = {"uniform": (0.1, 1.0), "small": (1e-4, 1e-2), "one": (1.0, 1.0)}


def betas(kind: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    lo, hi = BETA_RANGES[kind]
    return lo + (hi - lo) * torch.rand(shape, generator=gen)


# -- running and comparing ---------------------------------------------------------------------


def state_tensors(state) -> list[torch.Tensor]:
    """The tensors of a state: itself, or the tensor fields of a MesaState / LinGDNState."""
    if state is None:
        return []
    if isinstance(state, torch.Tensor):
        return [state]
    return [t for t in state if isinstance(t, torch.Tensor)]


def with_tensors(state, tensors: list[torch.Tensor]):
    """`state` with its tensors replaced by `tensors`, in state_tensors' order."""
    if state is None or isinstance(state, torch.Tensor):
        return tensors[0] if tensors else None
    it = iter(tensors)
    return type(state)(*[next(it) if isinstance(t, torch.Tensor) else t for t in state])


def run(op, inputs: dict[str, torch.Tensor], state, dtype: torch.dtype, backend: str, seed: int, **options):
    """o, the final state's tensors and the gradients of every input and initial-state tensor,
    the inputs cast to `dtype` (gates, betas and lamb to fp32 unless fp64); cotangents of o and
    of the final state from a generator seeded with `seed`, drawn in fp64 and cast."""
    side = dtype if dtype == F64 else torch.float32
    leaves = {name: t.detach().to(side if name in ("g", "beta", "lamb") else dtype).requires_grad_(True)
              for name, t in inputs.items()}
    state_leaves = [t.detach().to(side).requires_grad_(True) for t in state_tensors(state)]
    o, final = op(**leaves, initial_state=with_tensors(state, state_leaves), output_final_state=True,
                  backend=backend, **options)
    outputs = [o, *state_tensors(final)]
    gen = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(t.shape, generator=gen, dtype=F64).to(t.dtype) for t in outputs]
    wrt = [*leaves.values(), *state_leaves]
    grads = torch.autograd.grad(outputs, wrt, cotangents)
    for leaf, grad in zip(wrt, grads):
        assert grad.dtype == leaf.dtype and grad.shape == leaf.shape
    names = ["o", *(f"final_state{i}" for i in range(len(outputs) - 1)), *(f"d{n}" for n in leaves),
             *(f"dinitial_state{i}" for i in range(len(state_leaves)))]
    return o, final, dict(zip(names, [*outputs, *grads]))


def check(op, inputs: dict[str, torch.Tensor], state, dtype: torch.dtype, seed: int, tol: float | None = None,
          unchecked: tuple[str, ...] = (), rows_unchecked: tuple[str, ...] = (), **options) -> dict[str, float]:
    """The Triton op in `dtype` against the reference in fp64 on the same (rounded) values:
    every output and gradient but those named in `unchecked` by rel_err and row_err (those in
    `rows_unchecked` by rel_err only), under `tol` (default TOL[dtype] and ROW_TOL[dtype]).
    Returns the errors."""
    rounded = {n: t.to(dtype).to(F64) if n not in ("g", "beta", "lamb") else t.to(F64) for n, t in inputs.items()}
    o, final, ours = run(op, inputs, state, dtype, "triton", seed, **options)
    _, final_ref, ref = run(op, rounded, state, F64, "reference", seed)
    assert o.dtype == dtype
    assert [t.dtype for t in state_tensors(final)] == [torch.float32] * len(state_tensors(final_ref))
    if isinstance(final, LinGDNState):
        assert final.count == final_ref.count
    names = [name for name in ref if name not in unchecked]
    assert len(names) == len(ref) - len(unchecked), f"unknown names in {unchecked}"
    errors = {name: rel_err(ours[name], ref[name]) for name in names}
    errors.update({f"{name} (worst row)": row_err(ours[name], ref[name]) for name in names if name not in rows_unchecked})
    rel_tol, row_tol = (TOL[dtype], ROW_TOL[dtype]) if tol is None else (tol, tol)
    bad = {n: f"{e:.2e}" for n, e in errors.items() if not e < (row_tol if "worst row" in n else rel_tol)}
    assert not bad, f"errors over {rel_tol:g} (rows {row_tol:g}): {bad}"
    return errors


def qkv(B, T, H, K, V, gen, unit_keys=False, key_scale=1.0):
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    k = F.normalize(k, dim=-1) if unit_keys else key_scale * k
    return {"q": q, "k": k, "v": torch.randn(B, T, H, V, generator=gen)}


DTYPES = st.sampled_from([torch.float32, torch.float16])


# 16-bit operands: the kernels multiply fp16 tiles, so a value scaled by a decay below fp16's
# normal range (2^-14, a log-gate of -9.7) or a write beta * v of 1e-4 keeps only a few bits,
# and an output or gradient made of such values alone (the initial state's gradient behind a
# strong first gate, o when every write is tiny) cannot match fp64 to 5e-3 relative. fp16
# cases therefore take mild gates and betas from 0.1 up, as the op's other fp16 tests do.
FP16_GATE, FP16_BETAS = "mild", ("one", "uniform")


# -- the ops -------------------------------------------------------------------------------------


# Each op also runs one explicit case that every draw may miss: three K- and V-blocks of 16
# (the last partial) under lowered caps, several chunks and a ragged tail, an initial state,
# fp32 and the op's hardest regime. MULTI_BLOCK is (B, T, H, K, V, chunk) for chunks of 16.
MULTI_BLOCK = (1, 2 * 16 + 7, 2, 40, 40, 16)
DELTA_MULTI_BLOCK = (1, 2 * 64 + 22, 1, 40, 40, 64)


@triton_settings(examples=7)
@given(shape=shapes(), small_tiles=st.booleans(), with_state=st.booleans(), dtype=DTYPES,
       seed=st.integers(0, 2**16))
@example(shape=MULTI_BLOCK, small_tiles=True, with_state=True, dtype=torch.float32, seed=1)
def test_linear_attention(shape, small_tiles, with_state, dtype, seed):
    B, T, H, K, V, chunk = shape
    gen = torch.Generator().manual_seed(seed)
    inputs = qkv(B, T, H, K, V, gen)
    state = torch.randn(B, H, K, V, generator=gen) if with_state else None
    with tile_caps(small_tiles):
        check(linear_attention, inputs, state, dtype, seed + 1, chunk_size=chunk)


@st.composite
def gate_and_dtype(draw, gates=("mild", "mixed", "strong")):
    dtype = draw(DTYPES)
    return (FP16_GATE if dtype == torch.float16 else draw(st.sampled_from(gates))), dtype


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
@triton_settings(examples=7)
@given(shape=shapes(), small_tiles=st.booleans(), gate_dtype=gate_and_dtype(), with_state=st.booleans(),
       seed=st.integers(0, 2**16))
@example(shape=MULTI_BLOCK, small_tiles=True, gate_dtype=("mixed", torch.float32), with_state=True, seed=2)
def test_gated_linear_attention(vector, shape, small_tiles, gate_dtype, with_state, seed):
    """Mixed and strong gates are held to TRITON_DECAY_TOL: the kernels' decays are
    differences of fp32 cumulative gates of hundreds of nats (tests/util.py). Under gates strong
    on every token dg is compared whole, not row by row: it peaks on a few tokens (e^g from -5
    to -20), and a peak's decay rounding measured against the typical row's norm reaches 1.1e-4
    (scalar gate, T = 68, chunks of 32; 1.4e-5 relative to the peak itself; whole-tensor
    1.4e-5; 2026-12-04)."""
    (gate, dtype), (B, T, H, K, V, chunk) = gate_dtype, shape
    gen = torch.Generator().manual_seed(seed)
    inputs = qkv(B, T, H, K, V, gen)
    inputs["g"] = gates(gate, (B, T, H, K) if vector else (B, T, H), gen)
    state = torch.randn(B, H, K, V, generator=gen) if with_state else None
    tol = None if gate == "mild" else TRITON_DECAY_TOL
    with tile_caps(small_tiles):
        check(gated_linear_attention, inputs, state, dtype, seed + 1, tol=tol,
              rows_unchecked=("dg",) if gate == "strong" else (), chunk_size=chunk)


# The delta-rule kernels take chunks of 64 only: up to two whole chunks and a tail. K >= 4: with
# K = 1 and beta = 1, I - beta k k^T is exactly 0, each token erases the state, and dg and the
# initial state's gradient are exactly 0, so a relative error would compare rounding with zero;
# at K = 2 and 3 with beta = 1 each token still erases a half or a third of the state, dg and
# dbeta are sums that mostly cancel, and fp16 rounding shows in their worst rows (7.8e-3 at K = 2,
# 5.8e-3 at K = 3 against 5e-3; K = 4 and 16 hold it, and fp32 holds TOL at K = 2; 2026-12-02).
DELTA_SHAPES = shapes(chunk_sizes=(64,), max_chunks=2, min_K=4)


@triton_settings(examples=5)
@given(shape=DELTA_SHAPES, small_tiles=st.booleans(), beta=st.sampled_from(sorted(BETA_RANGES)),
       with_state=st.booleans(), seed=st.integers(0, 2**16))
@example(shape=DELTA_MULTI_BLOCK, small_tiles=True, beta="uniform", with_state=True, seed=3)
def test_delta_rule(shape, small_tiles, beta, with_state, seed):
    B, T, H, K, V, _ = shape
    gen = torch.Generator().manual_seed(seed)
    inputs = qkv(B, T, H, K, V, gen, unit_keys=True)
    inputs["beta"] = betas(beta, (B, T, H), gen)
    state = torch.randn(B, H, K, V, generator=gen) if with_state else None
    with tile_caps(small_tiles):
        check(delta_rule, inputs, state, torch.float32, seed + 1)


@triton_settings(examples=7)
@given(shape=DELTA_SHAPES, small_tiles=st.booleans(), gate_dtype=gate_and_dtype(), beta=st.sampled_from(sorted(BETA_RANGES)),
       with_state=st.booleans(), seed=st.integers(0, 2**16))
@example(shape=DELTA_MULTI_BLOCK, small_tiles=True, gate_dtype=("mixed", torch.float32), beta="uniform", with_state=True,
         seed=4)
def test_gated_delta_rule(shape, small_tiles, gate_dtype, beta, with_state, seed):
    """Gates and their bounds as in test_gated_linear_attention (dg under strong gates compared
    whole, as the scalar gate's there), for the same reasons; fp16 takes FP16_BETAS."""
    (gate, dtype), (B, T, H, K, V, _) = gate_dtype, shape
    if dtype == torch.float16 and beta not in FP16_BETAS:
        beta = FP16_BETAS[0]
    gen = torch.Generator().manual_seed(seed)
    inputs = qkv(B, T, H, K, V, gen, unit_keys=True)
    inputs["g"] = gates(gate, (B, T, H), gen)
    inputs["beta"] = betas(beta, (B, T, H), gen)
    state = torch.randn(B, H, K, V, generator=gen) if with_state else None
    tol = None if gate == "mild" else TRITON_DECAY_TOL
    with tile_caps(small_tiles):
        check(gated_delta_rule, inputs, state, dtype, seed + 1, tol=tol, rows_unchecked=("dg",) if gate == "strong" else ())


@triton_settings(examples=5)
@given(shape=DELTA_SHAPES, small_tiles=st.booleans(), count=st.sampled_from([0, 1, 7, 100]), dtype=DTYPES,
       seed=st.integers(0, 2**16))
@example(shape=DELTA_MULTI_BLOCK, small_tiles=True, count=7, dtype=torch.float32, seed=5)
def test_linearized_softmax_gdn(shape, small_tiles, count, dtype, seed):
    """count 0 is a fresh start (no state), else a state that has seen `count` tokens."""
    B, T, H, K, V, _ = shape
    gen = torch.Generator().manual_seed(seed)
    inputs = qkv(B, T, H, K, V, gen, key_scale=0.4)
    state = None
    if count:
        state = LinGDNState(0.1 * torch.randn(B, H, K, V, generator=gen),
                            0.4 * count**0.5 * torch.randn(B, H, K, generator=gen),
                            count**0.5 * torch.randn(B, H, V, generator=gen), count)
    with tile_caps(small_tiles):
        check(linearized_softmax_gdn, inputs, state, dtype, seed + 1)


# MesaNet's regimes: (lamb, beta, g) ranges and the share of -inf gates (a reset of both
# states). The reference solves exactly; CG gets K + 24 steps, enough to converge on these
# systems (small lamb comes with small beta, as in test_mesa_triton.py, so their condition
# number stays moderate).
MESA_REGIMES = {
    "typical": ((0.5, 1.5), (0.1, 1.0), (-0.3, -0.01), 0.0),
    "small_lamb_beta": ((1e-2, 2e-2), (1e-3, 1e-2), (-0.3, -0.01), 0.0),
    "strong_gates": ((0.5, 1.5), (0.1, 1.0), (-20.0, -5.0), 0.0),
    "full_writes_no_decay": ((0.5, 1.5), (0.99, 1.0), (-1e-4, 0.0), 0.0),
    "resets": ((0.5, 1.5), (0.1, 1.0), (-0.3, -0.01), 0.1),
}


@triton_settings(examples=5)
@given(shape=shapes(max_chunks=2), small_tiles=st.booleans(), regime=st.sampled_from(sorted(MESA_REGIMES)),
       with_state=st.booleans(), dtype=DTYPES, seed=st.integers(0, 2**16))
@example(shape=(1, 39, 1, 40, 80, 16), small_tiles=True, regime="typical", with_state=True, dtype=torch.float32, seed=6)
def test_mesa(shape, small_tiles, regime, with_state, dtype, seed):
    """The explicit case has V = 80: the solve and gradient kernels' fixed 64-wide V-block twice,
    the second partial."""
    B, T, H, K, V, chunk = shape
    if dtype == torch.float16:  # 16-bit operands: see FP16_GATE
        regime = "typical"
    gen = torch.Generator().manual_seed(seed)

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=gen)

    lamb, beta, g, resets = MESA_REGIMES[regime]
    inputs = qkv(B, T, H, K, V, gen, unit_keys=True)
    g = uniform((B, T, H), *g).masked_fill(torch.rand(B, T, H, generator=gen) < resets, float("-inf"))
    inputs.update(g=g, beta=uniform((B, T, H), *beta), lamb=uniform((H, K), *lamb))
    state = None
    if with_state:
        a = 0.3 * torch.randn(B, H, K, K, generator=gen)
        state = MesaState(a @ a.transpose(-1, -2), torch.randn(B, H, K, V, generator=gen))
    with tile_caps(small_tiles):
        check(mesa, inputs, state, dtype, seed + 1, chunk_size=chunk, cg_steps=K + 24)


# -- the smallest cases of what the properties draw -----------------------------------------------
# A partial chunk past -88 nats and g = -inf, each of which the kernels must handle; dg under
# strong gates, which cancels unless the kernels leave out the pairs of terms that cancel; and
# the vector gate's dg on each of its intra-chunk paths.


def _grads_of_ones(op, leaves: list[torch.Tensor], backend: str, **options) -> list[torch.Tensor]:
    leaves = [t.detach().clone().requires_grad_(True) for t in leaves]
    o, _ = op(*leaves, backend=backend, **options)
    return [o, *torch.autograd.grad(o, leaves, torch.ones_like(o))]


def _one_token(K=16, V=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 1, 1, d, generator=gen) for d in (K, K, V)]


def test_scalar_gate_partial_chunk_below_minus_88():
    """One token, g = -90 (valid: g <= 0): a partial chunk whose gates sum below -88 nats. The
    scalar-gate kernels' padded rows (past T) must not form exp2(0 - gamma_j), which overflows
    there, since 0 * inf = NaN would reach dk, dv and dg through the transposed intra-chunk
    matrix (tiles.load_gamma_rows)."""
    q, k, v = _one_token()
    g = torch.full((1, 1, 1), -90.0)
    got = _grads_of_ones(gated_linear_attention, [q, k, v, g], "triton")
    ref = _grads_of_ones(gated_linear_attention, [t.double() for t in (q, k, v, g)], "reference")
    errors = {name: rel_err(a, b) for name, a, b in zip(("o", "dq", "dk", "dv", "dg"), got, ref)}
    assert all(e < TOL[torch.float32] for e in errors.values()), errors


@pytest.mark.parametrize("op", ["gla_scalar", "gla_vector", "gated_delta_rule", "mesa"])
def test_minus_inf_gate(op):
    """Two tokens, the second with g = -inf: the contract takes g <= 0 (checks.check_gate) and
    the decay is 0, a full reset. The kernels subtract cumulative gates, where one -inf would
    make -inf - (-inf) = NaN of every later decay in the chunk; they floor each gate first
    (gates.GATE_FLOOR_LOG2), and every output and gradient must match the reference."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 1, 16, generator=gen) for _ in range(3))
    scalar = torch.tensor([-0.1, float("-inf")]).reshape(1, 2, 1)
    half = torch.full((1, 2, 1), 0.5)
    fn, leaves = {
        "gla_scalar": (gated_linear_attention, [q, k, v, scalar]),
        "gla_vector": (gated_linear_attention, [q, k, v, scalar[..., None].expand(1, 2, 1, 16)]),
        "gated_delta_rule": (gated_delta_rule, [q, F.normalize(k, dim=-1), v, scalar, half]),
        "mesa": (mesa, [q, F.normalize(k, dim=-1), v, scalar, half, torch.ones(1, 16)]),
    }[op]
    got = _grads_of_ones(fn, leaves, "triton")
    ref = _grads_of_ones(fn, [t.double() for t in leaves], "reference")
    errors = [rel_err(a, b) for a, b in zip(got, ref)]
    assert all(e < TOL[torch.float32] for e in errors), errors


@pytest.mark.parametrize("op", ["gla_scalar", "gla_vector", "gated_delta_rule"])
def test_gate_gradient_under_strong_gates(op):
    """Two tokens with g = -10 (on every channel). dg formed as sums of q.dq - k.dk (and the
    delta rule's like terms) is a difference of O(1) parts that leaves dg ~ e^-10: fp32
    rounding gives it a relative error near eps32 e^|g| (3e-3..1e-2 here; 1e-5..9e-5 at g = -5,
    0.25..1.5 at -15), where the PyTorch chunked forms, which differentiate the decays
    themselves, measure 1e-7. The kernels sum only the parts that do not cancel
    (kernels/gated_linear_attention/triton_grad_qk.py and triton_vector.py,
    kernels/gated_delta_rule/triton_bwd_grad.py)."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 1, 16, generator=gen) for _ in range(3))
    g = torch.full((1, 2, 1), -10.0)
    fn, leaves, options = {
        "gla_scalar": (gated_linear_attention, [q, k, v, g], {"chunk_size": 16}),
        "gla_vector": (gated_linear_attention, [q, k, v, g[..., None].expand(1, 2, 1, 16)], {"chunk_size": 16}),
        "gated_delta_rule": (gated_delta_rule, [q, F.normalize(k, dim=-1), v, g, torch.full((1, 2, 1), 0.5)], {}),
    }[op]
    got = _grads_of_ones(fn, leaves, "triton", **options)
    ref = _grads_of_ones(fn, [t.double() for t in leaves], "reference")
    assert rel_err(got[4], ref[4]) < TOL[torch.float32]  # dg


@pytest.mark.parametrize(("g", "path"), [(-0.5, "chunk"), (-3.0, "sub"), (-10.0, "exact")])
def test_vector_gate_gradient_on_each_path(g, path):
    """The vector gate's dg on each intra-chunk path (T = 70: a whole chunk of 64 and a tail),
    a random cotangent, gates of one strength on every token and channel: -0.5 a token keeps
    the chunk within the factored span (PATH_CHUNK), -3 keeps each 8-row sub-chunk within it
    (PATH_SUB), -10 needs the exact path. The census of record_paths names the path that ran.
    At -10 the chunk's log2 cumulative gates reach ~920, whose rounding every decay inherits:
    held to TRITON_DECAY_TOL (1.6e-5 measured; 9.9e-3 while dg still cancelled, 2026-12-04)."""
    from kernels.gated_linear_attention.triton_vector import record_paths, shares_of

    gen = torch.Generator().manual_seed(2)
    q, k, v, do = (torch.randn(1, 70, 2, 16, generator=gen) for _ in range(4))
    gates = torch.full((1, 70, 2, 16), g) + 0.1 * torch.rand(1, 70, 2, 16, generator=gen)
    def dg(backend, dtype):
        leaves = [t.to(dtype).requires_grad_(True) for t in (q, F.normalize(k, dim=-1), v, gates)]
        o, _ = gated_linear_attention(*leaves, backend=backend)
        return torch.autograd.grad(o, leaves, do.to(dtype))[3]

    with record_paths() as census:
        got = dg("triton", torch.float32)
    assert shares_of(torch.stack(census["bwd_dqkg"]))[path] >= 0.5  # the 6-row tail may take a cheaper path
    assert rel_err(got, dg("reference", torch.float64)) < (TRITON_DECAY_TOL if g < -5 else TOL[torch.float32])
