"""The NaN cases of issue 19, shared by tests/kernels/triton/test_nan_cases.py (the CPU
interpreter) and tests/gpu/test_nan_cases_gpu.py (a CUDA device).

Two inputs made the Triton kernels return NaN where the per-token recurrence is finite:
- a partial last chunk (T not a multiple of 64) whose gates sum past 128 log2-units: the
  scalar-gate kernels read the padded rows' cumulative gate as 0, so exp2(0 - gamma_j)
  overflowed and a padded row's zero times it was NaN (dk, dv, dg);
- g = -inf (a full reset, valid input: decay exp(-inf) = 0): the cumulative gates of the
  rest of the chunk were -inf and exp2(-inf - (-inf)) NaN, in every output.

Every gated op runs at T = 63, 100 and 130 (one partial chunk of 63 tokens; a full chunk
and 36 tokens; two full chunks and 2 tokens), with and without an initial state, under
- "strong" gates, uniform in [-6, -2] nats a token: a full chunk decays by 128 to 384 nats
  (185 to 554 log2-units), and so do the partial chunks of T = 63 and 100;
- "reset" gates, mild ones (logsigmoid(N(2, 1))) with g = -inf at the first token, at both
  sides of the first chunk boundary (tokens 63 and 64) and in the middle of the sequence
  (in half the channels only, for a vector gate);
and the ungated ops with a partial chunk (the delta rule, the linearized softmax GDN, whose
gates log(1 - 1/t) come from the position). Outputs, final states and the gradient of every
input are compared with the per-token recurrence in fp64 on the same inputs.

Bounds: TOL (whole tensor) and ROW_TOL (worst row) of tests/util.py, except where the Triton
GLA and gated-delta-rule kernels meet their known rounding (TRITON_DECAY_TOL, tests/util.py):
they form decays as exp2(gamma_i - gamma_j) of fp32 chunk-local cumulative log-gates, and
- under strong gates gamma reaches 550 and the gate gradient, a sum of such terms that
  cancel down to a far smaller rest, measures up to 8.6e-5 on worst rows (GDN), 9.1e-6
  whole-tensor (the other outputs and gradients stay under TOL: 6.4e-6 on worst rows at most);
- a -inf gate counts as the floor GATE_FLOOR_LOG2 = -80 (kernels/common/triton/gates.py), so
  past it a chunk's gamma is below -80 and carries its ulp, 7.6e-6 (1.5e-5 past two):
  every quantity measures up to 2.1e-5 on worst rows and 6.5e-6 whole-tensor, too close to
  TOL to hold it there.
(Worst over seeds 0-3 of every case, on the interpreter, 2026-12-06, with the cumulative gates
summed in fp64 and rounded once: kernels/common/triton/cumsum.py.) MesaNet's kernels sum
gates over segments and never subtract: TOL throughout (4.1e-6 on worst rows at most). The
torch backend's vector-gate form (kernels/gated_linear_attention/chunked.py) forms the gate
gradient as a reverse cumulative sum too (autograd through its within-block cumulative
gates): under strong gates its worst row measures up to 1.5e-5 (3.8e-6 whole-tensor) and is
held to TRITON_DECAY_TOL as well; every other torch quantity stays under TOL (2.6e-6).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.util import ROW_TOL, TOL, TRITON_DECAY_TOL, rel_err, row_err

LENGTHS = (63, 100, 130)

# op id -> (public op, gate: None / "scalar" / "vector", takes beta)
OPS = {
    "gla_scalar": ("gated_linear_attention", "scalar", False),
    "gla_vector": ("gated_linear_attention", "vector", False),
    "gdn": ("gated_delta_rule", "scalar", True),
    "mesa": ("mesa", "scalar", True),
    "delta": ("delta_rule", None, True),
    "lin_gdn": ("linearized_softmax_gdn", None, False),
}
GATED = tuple(op for op, (_, gate, _) in OPS.items() if gate is not None)
UNGATED = tuple(op for op, (_, gate, _) in OPS.items() if gate is None)
# the Triton kernels whose decays are differences of fp32 cumulative log-gates
DECAY_ROUNDED = ("gla_scalar", "gla_vector", "gdn")


def reset_tokens(T: int) -> list[int]:
    """Where the "reset" gates are -inf: the first token, both sides of the first chunk
    boundary, one token in the middle."""
    return sorted({t for t in (0, 63, 64, T // 2 + 1) if t < T})


def make_gates(shape: tuple[int, ...], gates: str, gen: torch.Generator) -> torch.Tensor:
    """Natural-log gates [B, T, H] or [B, T, H, K] (fp32) of the kind `gates`."""
    if gates == "strong":
        return -2.0 - 4.0 * torch.rand(shape, generator=gen)
    g = F.logsigmoid(torch.randn(shape, generator=gen) + 2.0)
    T = shape[1]
    middle = T // 2 + 1
    for t in reset_tokens(T):
        if len(shape) == 4 and t == middle:
            g[:, t, :, ::2] = float("-inf")  # a vector gate resets some channels only
        else:
            g[:, t] = float("-inf")
    return g


def make_leaves(op: str, T: int, gates: str | None, with_state: bool, B: int = 1, H: int = 2, K: int = 16,
                V: int = 16, seed: int = 0) -> dict:
    """The leaves of one case (fp32, on the CPU): q, k (unit rows), v, then g, beta, lamb and
    the initial state's tensors as `op` takes them."""
    name, gate, has_beta = OPS[op]
    gen = torch.Generator().manual_seed(seed + T)
    leaves = {
        "q": torch.randn(B, T, H, K, generator=gen),
        "k": F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1),
        "v": torch.randn(B, T, H, V, generator=gen),
    }
    if gate is not None:
        leaves["g"] = make_gates((B, T, H, K) if gate == "vector" else (B, T, H), gates, gen)
    if has_beta:
        leaves["beta"] = 0.1 + 0.9 * torch.rand(B, T, H, generator=gen)
    if op == "mesa":
        leaves["q"] = F.normalize(leaves["q"], dim=-1)
        leaves["lamb"] = 0.5 + torch.rand(H, K, generator=gen)
    if with_state:
        if op == "mesa":
            a = 0.3 * torch.randn(B, H, K, K, generator=gen)
            leaves["h_kk0"] = a @ a.transpose(-1, -2)
            leaves["h_kv0"] = torch.randn(B, H, K, V, generator=gen)
        elif op == "lin_gdn":
            leaves["h0"] = 0.1 * torch.randn(B, H, K, V, generator=gen)
            leaves["k_sum0"] = 2.0 * torch.randn(B, H, K, generator=gen)
            leaves["v_sum0"] = 2.0 * torch.randn(B, H, V, generator=gen)
        else:
            leaves["h0"] = torch.randn(B, H, K, V, generator=gen)
    return leaves


LIN_COUNT = 5  # tokens a lin_gdn initial state has seen


def call(op: str, args: dict, backend: str, **options) -> list[torch.Tensor]:
    """Run `op` on its leaves `args` with output_final_state (and `options`, e.g. MesaNet's
    cg_steps); returns o and the final state's tensors."""
    import kernels

    name = OPS[op][0]
    fn = getattr(kernels, name)
    args = dict(args)
    state = None
    if "h_kk0" in args:
        state = kernels.MesaState(args.pop("h_kk0"), args.pop("h_kv0"))
    elif "k_sum0" in args:
        state = kernels.LinGDNState(args.pop("h0"), args.pop("k_sum0"), args.pop("v_sum0"), LIN_COUNT)
    elif "h0" in args:
        state = args.pop("h0")
    o, final = fn(**args, initial_state=state, output_final_state=True, backend=backend, **options)
    if op == "mesa":
        return [o, final.h_kk, final.h_kv]
    if op == "lin_gdn":
        return [o, final.h, final.k_sum, final.v_sum]
    return [o, final]


def outputs_and_grads(op: str, leaves: dict, dtype: torch.dtype, backend: str, device: str | torch.device = "cpu",
                      rounded_as: list[torch.dtype] | None = None, **options) -> dict[str, torch.Tensor]:
    """o, the final state's tensors ("final_state" or its fields) and the gradient of every
    leaf ("d<name>") for seeded random cotangents: drawn in fp32 on the CPU and rounded
    through rounded_as (one dtype per output; default, each output's own), so a reference
    run can take the very cotangents a 16-bit run got. q, k, v run in `dtype`; the other
    leaves in fp32, or in fp64 when dtype is fp64 (the reference)."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    ours = {n: t.to(device=device, dtype=dtype if n in ("q", "k", "v") else wide).requires_grad_(True)
            for n, t in leaves.items()}
    outs = call(op, ours, backend, **options)
    gen = torch.Generator().manual_seed(1)
    rounded_as = rounded_as or [t.dtype for t in outs]
    cotangents = [torch.randn(t.shape, generator=gen).to(via).to(device=device, dtype=t.dtype)
                  for t, via in zip(outs, rounded_as)]
    grads = torch.autograd.grad(outs, list(ours.values()), cotangents)
    result = dict(zip(output_names(op), outs))
    result.update({"d" + n: grad for n, grad in zip(ours, grads)})
    return result


def output_names(op: str) -> tuple[str, ...]:
    """The names outputs_and_grads gives o and the final state's tensors."""
    return {"mesa": ("o", "h_kk", "h_kv"), "lin_gdn": ("o", "h", "k_sum", "v_sum")}.get(op, ("o", "final_state"))


def output_dtypes(op: str, result: dict[str, torch.Tensor]) -> list[torch.dtype]:
    """The dtypes of the outputs in an outputs_and_grads result (rounded_as for a reference run)."""
    return [result[name].dtype for name in output_names(op)]


def bounds(op: str, gates: str | None, backend: str, dtype: torch.dtype, name: str) -> tuple[float, float]:
    """(whole-tensor bound, worst-row bound) of quantity `name` in one case (module doc)."""
    whole, row = TOL[dtype], ROW_TOL[dtype]
    if dtype != torch.float32:
        return whole, row
    if backend == "triton" and op in DECAY_ROUNDED and (gates == "reset" or (gates == "strong" and name == "dg")):
        whole, row = TRITON_DECAY_TOL, TRITON_DECAY_TOL
    if backend == "torch" and op == "gla_vector" and gates == "strong" and name == "dg":
        row = TRITON_DECAY_TOL
    return whole, row


def over_bounds(op: str, gates: str | None, ours: dict, ref: dict, backend: str,
                dtype: torch.dtype) -> tuple[dict, dict]:
    """({name: (rel_err, row_err)}, {name: (rel_err, row_err, whole bound, row bound)} of the
    quantities over a bound); a quantity that is not finite fails at once."""
    errors = {name: (rel_err(ours[name], ref[name]), row_err(ours[name], ref[name])) for name in ref}
    bad = {}
    for name, (whole, row) in errors.items():
        assert torch.isfinite(ours[name]).all(), f"{op} {gates}: {name} is not finite"
        whole_bound, row_bound = bounds(op, gates, backend, dtype, name)
        if not (whole < whole_bound and row < row_bound):
            bad[name] = (whole, row, whole_bound, row_bound)
    return errors, bad


def check_case(op: str, gates: str | None, ours: dict, ref: dict, backend: str, dtype: torch.dtype) -> dict:
    """Every quantity finite and within its bounds; returns {name: (rel_err, row_err)}."""
    errors, bad = over_bounds(op, gates, ours, ref, backend, dtype)
    assert not bad, f"{op} {gates} {backend}: (rel_err, row_err, bounds) {bad}; all {errors}"
    return errors
